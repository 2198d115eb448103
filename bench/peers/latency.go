package main

// -mode latency: publish to handler start, as bench/'s -mode latency measures rowactor,
// with rowactor (lease form) and its peer side by side on one database, every system with
// its default settings: rowactor's one worker; River (FetchCooldown 100 ms,
// FetchPollInterval 1 s, its insert notifications) with MaxWorkers 100, which River
// requires and its README uses; goqite's jobs.Runner (PollInterval 100 ms, Limit
// GOMAXPROCS) on SQLite. With one worker each, River and goqite take one job per fetch and
// fetch every 100 ms at most: 10 jobs a second, behind a steady 100 a second. The publisher, in this process, writes its wall clock into the payload just
// before the insert; the handler records its start. Idle: one publish, wait until handled,
// 100 ms pause, n times. Steady: rate publishes a second for the given seconds.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"maragu.dev/goqite"
	"maragu.dev/goqite/jobs"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// latencyWarmup publishes go first, unmeasured (statements prepared, connections open).
const latencyWarmup = 3

type latencyConfig struct {
	n, rate, seconds int
}

type latencyLine struct {
	Mode     string  `json:"mode"`
	DB       string  `json:"db"`
	System   string  `json:"system"`
	Settings string  `json:"settings"`
	Load     string  `json:"load"`
	N        int     `json:"n"`
	P50      float64 `json:"p50_ms"`
	P90      float64 `json:"p90_ms"`
	P99      float64 `json:"p99_ms"`
	Max      float64 `json:"max_ms"`
}

// latencySystem is one system ready to publish, whose handler sends each message's
// publish-to-start time on handled.
type latencySystem struct {
	name, settings string
	publish        func(ctx context.Context, stamp int64) error
	handled        chan time.Duration
	stop           func() error
}

func newHandled() chan time.Duration { return make(chan time.Duration, 4096) }

func since(stamp int64) time.Duration { return time.Duration(time.Now().UnixNano() - stamp) }

func runLatencyMode(ctx context.Context, cfg config, lc latencyConfig, out *json.Encoder) error {
	for _, db := range cfg.dbs {
		var makers []func(context.Context) (*latencySystem, error)
		switch db {
		case "postgres":
			makers = []func(context.Context) (*latencySystem, error){
				func(ctx context.Context) (*latencySystem, error) { return rowactorLatencyPG(ctx, cfg.pgURL) },
				func(ctx context.Context) (*latencySystem, error) { return riverLatency(ctx, cfg.pgURL) },
			}
		case "sqlite":
			dir, err := os.MkdirTemp(cfg.dir, "rowactor-peers-latency-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			makers = []func(context.Context) (*latencySystem, error){
				func(ctx context.Context) (*latencySystem, error) { return rowactorLatencySQLite(ctx, dir) },
				func(ctx context.Context) (*latencySystem, error) { return goqiteLatency(ctx, dir) },
			}
		}
		for _, mk := range makers {
			s, err := mk(ctx)
			if err != nil {
				return fmt.Errorf("%s: %w", db, err)
			}
			lines, err := measureLatency(ctx, db, s, lc)
			if serr := s.stop(); serr != nil && err == nil {
				err = fmt.Errorf("stop: %w", serr)
			}
			if err != nil {
				return fmt.Errorf("%s %s: %w", db, s.name, err)
			}
			for _, l := range lines {
				fmt.Fprintf(os.Stderr, "peers: latency %s %-8s %-6s p50 %6.2f p90 %6.2f p99 %6.2f max %7.2f ms (n=%d, load %s)\n",
					db, l.System, l.Load, l.P50, l.P90, l.P99, l.Max, l.N, loadavg())
				if err := out.Encode(l); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func measureLatency(ctx context.Context, db string, s *latencySystem, lc latencyConfig) ([]latencyLine, error) {
	wait := func(n int, limit time.Duration) ([]time.Duration, error) {
		got := make([]time.Duration, 0, n)
		deadline := time.After(limit)
		for len(got) < n {
			select {
			case d := <-s.handled:
				got = append(got, d)
			case <-deadline:
				return nil, fmt.Errorf("%d of %d messages handled within %v", len(got), n, limit)
			}
		}
		return got, nil
	}
	var idle []time.Duration
	for i := range latencyWarmup + lc.n {
		if err := s.publish(ctx, time.Now().UnixNano()); err != nil {
			return nil, err
		}
		got, err := wait(1, 30*time.Second)
		if err != nil {
			return nil, err
		}
		if i >= latencyWarmup {
			idle = append(idle, got[0])
		}
		time.Sleep(100 * time.Millisecond)
	}
	total := lc.rate * lc.seconds
	tick := time.NewTicker(time.Second / time.Duration(lc.rate))
	defer tick.Stop()
	for range total {
		<-tick.C
		if err := s.publish(ctx, time.Now().UnixNano()); err != nil {
			return nil, err
		}
	}
	steady, err := wait(total, time.Minute)
	if err != nil {
		return nil, err
	}
	return []latencyLine{latencyOf(db, s, "idle", idle), latencyOf(db, s, "steady", steady)}, nil
}

func latencyOf(db string, s *latencySystem, load string, ds []time.Duration) latencyLine {
	slices.Sort(ds)
	pct := func(p float64) float64 {
		i := min(int(p*float64(len(ds))), len(ds)-1)
		return msOf(ds[i])
	}
	return latencyLine{Mode: "latency", DB: db, System: s.name, Settings: s.settings, Load: load, N: len(ds),
		P50: pct(0.50), P90: pct(0.90), P99: pct(0.99), Max: msOf(ds[len(ds)-1])}
}

func msOf(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000
}

// rowactorLatency subscribes with rowactor's defaults (one worker, 1 s poll, lease form
// with its default lease) and publishes with Publish.
func rowactorLatency(ctx context.Context, b *rowactor.Broker, t rowactor.Table, drop func() error) (*latencySystem, error) {
	s := &latencySystem{name: "rowactor", settings: "lease form, defaults (Workers 1, PollInterval 1s)", handled: newHandled()}
	ddl, err := rowactor.Schema(b.Dialect(), t)
	if err != nil {
		return nil, err
	}
	if err := execAll(ctx, b, ddl); err != nil {
		return nil, err
	}
	_, err = b.Subscribe(ctx, t, "lat", func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		stamp, perr := strconv.ParseInt(string(d.Payload()), 10, 64)
		if perr == nil {
			s.handled <- since(stamp)
		}
		return rowactor.Ack()
	})
	if err != nil {
		return nil, err
	}
	s.publish = func(ctx context.Context, stamp int64) error {
		_, err := b.Publish(ctx, t, "lat", strconv.AppendInt(nil, stamp, 10))
		return err
	}
	s.stop = func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := b.Shutdown(sctx)
		return errors.Join(err, drop())
	}
	return s, nil
}

func latencyTable() rowactor.Table {
	return rowactor.Table{Name: fmt.Sprintf("peers_latency_%d", os.Getpid()), ID: "id", Payload: "payload",
		Group: "grp", Attempt: "attempt", LockedUntil: "locked_until"}
}

func rowactorLatencyPG(ctx context.Context, url string) (*latencySystem, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	b, err := rowactor.New(postgres.New(pool))
	if err != nil {
		pool.Close()
		return nil, err
	}
	t := latencyTable()
	_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+t.Name)
	return rowactorLatency(ctx, b, t, func() error {
		_, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+t.Name)
		pool.Close()
		return err
	})
}

func rowactorLatencySQLite(ctx context.Context, dir string) (*latencySystem, error) {
	d, err := sqlite.Open(ctx, filepath.Join(dir, "rowactor.db"))
	if err != nil {
		return nil, err
	}
	b, err := rowactor.New(d)
	if err != nil {
		d.Close()
		return nil, err
	}
	return rowactorLatency(ctx, b, latencyTable(), d.Close)
}

// execAll runs a Schema DDL, statement by statement, on the broker's database.
func execAll(ctx context.Context, b *rowactor.Broker, ddl string) error {
	switch d := b.Dialect().(type) {
	case *postgres.Dialect:
		_, err := d.Pool().Exec(ctx, ddl)
		return err
	case *sqlite.Dialect:
		_, err := d.DB().ExecContext(ctx, ddl)
		return err
	}
	return fmt.Errorf("no DDL runner for %s", b.Dialect().Name())
}

// latencyArgs is River's job: the publish stamp.
type latencyArgs struct {
	Stamp int64 `json:"stamp"`
}

func (latencyArgs) Kind() string { return "peers_latency" }

type latencyWorker struct {
	river.WorkerDefaults[latencyArgs]
	handled chan time.Duration
}

func (w *latencyWorker) Work(_ context.Context, job *river.Job[latencyArgs]) error {
	w.handled <- since(job.Args.Stamp)
	return nil
}

// riverLatency runs River with its defaults (FetchCooldown, FetchPollInterval unset) and
// MaxWorkers 100 on the default queue, on a schema of its own; Insert publishes.
func riverLatency(ctx context.Context, url string) (*latencySystem, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	schema := fmt.Sprintf("river_latency_%d", os.Getpid())
	cleanup := func() error {
		_, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		pool.Close()
		return err
	}
	fail := func(err error) (*latencySystem, error) { _ = cleanup(); return nil, err }
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema); err != nil {
		return fail(err)
	}
	log := quietLogger()
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema, Logger: log})
	if err != nil {
		return fail(err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fail(err)
	}
	s := &latencySystem{name: "river", settings: "defaults (FetchCooldown 100ms, FetchPollInterval 1s), MaxWorkers 100", handled: newHandled()}
	ws := river.NewWorkers()
	river.AddWorker(ws, &latencyWorker{handled: s.handled})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema: schema, Logger: log, Workers: ws,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 100}},
	})
	if err != nil {
		return fail(err)
	}
	if err := client.Start(ctx); err != nil {
		return fail(err)
	}
	s.publish = func(ctx context.Context, stamp int64) error {
		_, err := client.Insert(ctx, latencyArgs{Stamp: stamp}, nil)
		return err
	}
	s.stop = func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return errors.Join(client.Stop(sctx), cleanup())
	}
	return s, nil
}

// goqiteLatency runs goqite's jobs.Runner with its defaults (PollInterval 100 ms, Limit
// GOMAXPROCS); jobs.Create publishes.
func goqiteLatency(ctx context.Context, dir string) (*latencySystem, error) {
	db, err := openSQLite(ctx, filepath.Join(dir, "goqite.db"))
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1) // as goqite's README sets it
	if _, err := db.ExecContext(ctx, goqiteSchema); err != nil {
		db.Close()
		return nil, err
	}
	q := goqite.New(goqite.NewOpts{DB: db, Name: "latency"})
	s := &latencySystem{name: "goqite", settings: "jobs.Runner defaults (PollInterval 100ms, Limit GOMAXPROCS)", handled: newHandled()}
	r := jobs.NewRunner(jobs.NewRunnerOpts{Queue: q}) // its default log discards
	r.Register("latency", func(_ context.Context, m []byte) error {
		stamp, err := strconv.ParseInt(string(m), 10, 64)
		if err != nil {
			return err
		}
		s.handled <- since(stamp)
		return nil
	})
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Start(rctx) }()
	s.publish = func(ctx context.Context, stamp int64) error {
		_, err := jobs.Create(ctx, q, "latency", goqite.Message{Body: strconv.AppendInt(nil, stamp, 10)})
		return err
	}
	s.stop = func() error {
		cancel()
		<-done
		return db.Close()
	}
	return s, nil
}

// quietLogger writes warnings to stderr (stdout carries the JSON lines).
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
