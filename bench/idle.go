package main

// -mode idle: what many idle subscriptions cost when nothing is published. One
// PostgreSQL broker subscribes to -idle-subs queues with rowactor's defaults (one worker,
// the 1 s poll, the 30 s lease), lets them settle in, and measures the process's CPU
// time and the server connections the broker holds.
//
// The queues are groups of one table (a Group column, one subscription per group), not
// one table each: a service with a hundred queues keeps them in one jobs table with a
// queue column, as rowactor's README describes, rather than a hundred tables. The table
// is in the lease form, the one rowactor leads with, which holds no connection between
// claims.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor"
)

// idleSettle is how long the subscriptions run before the measured window: their first
// claims, the statements' preparation on each connection, the listener's connection.
const idleSettle = 5 * time.Second

type idleLine struct {
	Mode          string  `json:"mode"`
	DB            string  `json:"db"`
	Subscriptions int     `json:"subscriptions"`
	Form          string  `json:"form"`
	Seconds       int     `json:"seconds"`
	CPUPct        float64 `json:"cpu_pct_of_core"`
	// Connections is what pg_stat_activity lists under the broker's application_name at
	// the end of the window (its pool's connections and its listening one); MaxConns the
	// most sampled once a second during it; PoolMax the pool's size from the URL.
	Connections int     `json:"connections"`
	MaxConns    int     `json:"connections_max"`
	PoolMax     int     `json:"pool_max_conns"`
	StmtsPerS   float64 `json:"statements_per_s"` // counted at the driver
}

func runIdle(ctx context.Context, cfg config, out *json.Encoder) error {
	// The broker's connections carry an application_name of their own (a pgx runtime
	// parameter in the URL; the listener's connection is made from the pool's
	// configuration, so it carries it too), by which pg_stat_activity counts them.
	app := fmt.Sprintf("rowactor-bench-idle-%d", os.Getpid())
	brokerURL, err := withParam(cfg.pgURL, "application_name", app)
	if err != nil {
		return err
	}
	probeURL, err := withParam(cfg.pgURL, "application_name", app+"-probe")
	if err != nil {
		return err
	}
	pc, err := pgxpool.ParseConfig(brokerURL)
	if err != nil {
		return err
	}
	tg, err := openPostgres(ctx, brokerURL)
	if err != nil {
		return fmt.Errorf("open postgres: %w", err)
	}
	defer tg.close()
	fmt.Fprintf(os.Stderr, "bench: postgres %s\n", tg.version)
	// The probe has a pool of its own, under another name, so counting never adds to
	// the broker's connections.
	probe, err := pgxpool.New(ctx, probeURL)
	if err != nil {
		return err
	}
	defer probe.Close()
	count := func() (int, error) {
		var n int
		err := probe.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n)
		return n, err
	}

	t := rowactor.Table{Name: fmt.Sprintf("bench_idle_%d", os.Getpid()), ID: "id", Payload: "payload", Attempt: "attempt",
		Group: "queue", LockedUntil: "locked_until"}
	if err := tg.refill(ctx, t, 0); err != nil {
		return err
	}
	defer tg.drop(ctx, t.Name)
	b, err := rowactor.New(tg.d)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := b.Shutdown(sctx); err != nil {
			fmt.Fprintln(os.Stderr, "bench: idle: shutdown:", err)
		}
	}()
	handler := func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }
	for i := range cfg.idleSubs {
		if _, err := b.Subscribe(ctx, t, fmt.Sprintf("queue-%03d", i), handler); err != nil { // rowactor's defaults
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "bench: idle: %d subscriptions to the groups of %s, settling in for %v\n", cfg.idleSubs, t.Name, idleSettle)
	time.Sleep(idleSettle)

	window := time.Duration(cfg.idleSeconds) * time.Second
	line := idleLine{Mode: "idle", DB: "postgres", Subscriptions: cfg.idleSubs, Form: "lease", Seconds: cfg.idleSeconds, PoolMax: int(pc.MaxConns)}
	cpu0, stmts0, start := cpuTime(), tg.stmtCount(), time.Now()
	tick := time.NewTicker(time.Second)
	for time.Since(start) < window {
		<-tick.C
		n, err := count()
		if err != nil {
			tick.Stop()
			return err
		}
		line.MaxConns = max(line.MaxConns, n)
	}
	tick.Stop()
	elapsed, cpu, stmts := time.Since(start), cpuTime()-cpu0, tg.stmtCount()-stmts0
	if line.Connections, err = count(); err != nil {
		return err
	}
	line.MaxConns = max(line.MaxConns, line.Connections)
	// The probe's queries run in this process too: a handful of round trips a second,
	// left in the CPU figure (they are small beside a hundred polls a second).
	line.CPUPct = roundTo(100*cpu.Seconds()/elapsed.Seconds(), 2)
	line.StmtsPerS = roundTo(float64(stmts)/elapsed.Seconds(), 1)
	fmt.Fprintf(os.Stderr, "bench: idle postgres %d subscriptions: %.2f%% of a core, %d connections (at most %d, pool of %d), %.1f statements/s over %v (load %s)\n",
		line.Subscriptions, line.CPUPct, line.Connections, line.MaxConns, line.PoolMax, line.StmtsPerS, elapsed.Round(time.Millisecond), loadavg())
	return out.Encode(line)
}

// withParam sets a query parameter of a PostgreSQL URL.
func withParam(raw, key, value string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("-pg %q: want a postgres:// URL (%v)", raw, err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String(), nil
}
