// Command peers drains the same rows with rowactor and with another Go queue library on
// the same database, so the two can be compared: River on PostgreSQL (next to rowactor's
// lease and row lock forms), goqite on SQLite (next to rowactor's lease form).
//
//	cd bench/peers && go run . -db postgres,sqlite -workers 1,8 -rows 5000 -rounds 3
//
// It is a module of its own so that rowactor never depends on its peers. For each
// database and worker count, and for each round, every contender fills its queue outside
// the timed window, drains it (the order rotates from round to round) and the harness
// checks that every message was handled exactly once and settled. It prints one JSON line
// per contender and one with the ratios of rowactor to the peer; docs/benchmarks.md
// (## Peers) describes the method and the numbers.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	leaseLength  = 30 * time.Second // rowactor's lease, goqite's redelivery timeout
	pollInterval = 10 * time.Millisecond
	drainTimeout = 10 * time.Minute // for a whole drain; only a broken run comes near it
)

type config struct {
	dbs            []string
	workers        []int
	rows, rounds   int
	pgURL, dir     string
	riverCooldown  time.Duration
	riverPoll      time.Duration
	goqitePoll     time.Duration
	goqiteMaxConns int
	cpuprofile     string
	mode           string
	latency        latencyConfig
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	dbs := fs.String("db", "postgres,sqlite", "databases, comma-separated: postgres (rowactor and River), sqlite (rowactor and goqite)")
	workers := fs.String("workers", "1,8", "worker counts, comma-separated")
	fs.IntVar(&cfg.rows, "rows", 5000, "messages per drain")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds per database and worker count")
	fs.IntVar(&prefetch, "prefetch", -1, "rowactor's Prefetch(n) in the lease form (default: not given, rowactor sizes the room itself)")
	fs.StringVar(&cfg.pgURL, "pg", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable&pool_max_conns=16", "PostgreSQL URL (pgx); rowactor and River each get a pool of their own on it")
	fs.StringVar(&cfg.dir, "dir", "", "directory for the SQLite files (default: a fresh temporary one)")
	fs.DurationVar(&cfg.riverCooldown, "river-fetch-cooldown", time.Millisecond, "River's Config.FetchCooldown (its minimum, 1ms; its default is 100ms)")
	fs.DurationVar(&cfg.riverPoll, "river-fetch-poll", pollInterval, "River's Config.FetchPollInterval (its default is 1s)")
	fs.DurationVar(&cfg.goqitePoll, "goqite-poll", pollInterval, "goqite's ReceiveAndWait interval")
	fs.IntVar(&cfg.goqiteMaxConns, "goqite-conns", 1, "goqite's pool size, SetMaxOpenConns: 1 as goqite's README sets it, which serialises its writes as rowactor's SQLite dialect does its own (0: no cap)")
	fs.StringVar(&cfg.mode, "mode", "drain", "drain (throughput) or latency (publish to handler start, every system with its defaults and one worker)")
	fs.IntVar(&cfg.latency.n, "latency-n", 200, "-mode latency: idle publishes, one at a time")
	fs.IntVar(&cfg.latency.rate, "latency-rate", 100, "-mode latency: steady publishes a second")
	fs.IntVar(&cfg.latency.seconds, "latency-seconds", 5, "-mode latency: seconds of steady publishes")
	fs.StringVar(&cfg.cpuprofile, "cpuprofile", "", "write a CPU profile of the whole run, samples labelled system, db and workers")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, f := range strings.Split(*dbs, ",") {
		name := strings.ToLower(strings.TrimSpace(f))
		if name != "postgres" && name != "sqlite" {
			return cfg, fmt.Errorf("-db %q: want postgres or sqlite", name)
		}
		if !slices.Contains(cfg.dbs, name) {
			cfg.dbs = append(cfg.dbs, name)
		}
	}
	for _, f := range strings.Split(*workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("-workers %q: want positive integers separated by commas", *workers)
		}
		cfg.workers = append(cfg.workers, n)
	}
	if cfg.mode != "drain" && cfg.mode != "latency" {
		return cfg, fmt.Errorf("-mode %q: want drain or latency", cfg.mode)
	}
	if cfg.latency.n < 1 || cfg.latency.rate < 1 || cfg.latency.seconds < 1 {
		return cfg, errors.New("-latency-n, -latency-rate and -latency-seconds must be at least 1")
	}
	if cfg.rows < 1 || cfg.rounds < 1 {
		return cfg, errors.New("-rows and -rounds must be at least 1")
	}
	if cfg.riverCooldown < time.Millisecond || cfg.riverPoll < cfg.riverCooldown || cfg.goqitePoll <= 0 || cfg.goqiteMaxConns < 0 {
		return cfg, errors.New("-river-fetch-poll >= -river-fetch-cooldown >= 1ms, -goqite-poll > 0 and -goqite-conns >= 0")
	}
	return cfg, nil
}

// A contender is one system on one database.
type contender struct {
	system string
	// fill puts rows messages in its queue, outside the timed window.
	fill func(ctx context.Context, rows int) error
	// drain handles them all with workers workers, each exactly once, and settles them.
	drain func(ctx context.Context, workers, rows int) (result, error)
	// check asks the database whether every message was settled.
	check func(ctx context.Context, rows int) error
	// clean drops what fill made.
	clean func(ctx context.Context)
}

// target is one database: the contenders on it, and what it runs with.
type target struct {
	db, version, settings string
	peer                  string
	contenders            []contender
	close                 func()
	// epoch names the server's current run (its start time), nil for an embedded
	// database: a drain during which it changed met a server restart (other sessions'
	// tests restart the shared server) and is run again.
	epoch func(ctx context.Context) (string, error)
}

func run(cfg config) error {
	ctx := context.Background()
	if cfg.cpuprofile != "" {
		f, err := os.Create(cfg.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Fprintf(os.Stderr, "peers: %s, GOMAXPROCS=%d, load average %s\n", runtime.Version(), runtime.GOMAXPROCS(0), loadavg())
	defer func() { fmt.Fprintf(os.Stderr, "peers: load average %s at the end\n", loadavg()) }()
	out := json.NewEncoder(os.Stdout)
	if cfg.mode == "latency" {
		return runLatencyMode(ctx, cfg, cfg.latency, out)
	}
	for _, db := range cfg.dbs {
		var (
			tg  *target
			err error
		)
		if db == "postgres" {
			tg, err = openPostgres(ctx, cfg)
		} else {
			tg, err = openSQLiteTarget(ctx, cfg)
		}
		if err != nil {
			return fmt.Errorf("open %s: %w", db, err)
		}
		fmt.Fprintf(os.Stderr, "peers: %s %s; %s\n", db, tg.version, tg.settings)
		err = runTarget(ctx, cfg, tg, out)
		tg.close()
		if err != nil {
			return err
		}
	}
	return nil
}

func runTarget(ctx context.Context, cfg config, tg *target, out *json.Encoder) error {
	for _, n := range cfg.workers {
		results := make(map[string][]result)
		for round := 1; round <= cfg.rounds; round++ {
			// The order rotates, so that no system always drains right after the same
			// other one (or always first, on a cold cache).
			order := slices.Clone(tg.contenders)
			k := (round - 1) % len(order)
			order = append(order[k:], order[:k]...)
			for _, c := range order {
				r, err := drainUndisturbed(ctx, tg, c, n, cfg.rows)
				if err != nil {
					return fmt.Errorf("%s %s, %d workers, round %d: %w", tg.db, c.system, n, round, err)
				}
				results[c.system] = append(results[c.system], r)
				fmt.Fprintf(os.Stderr, "peers: %s workers=%d round=%d %-16s %8.0f msgs/s %6.1f allocs/msg %5.0f µs CPU/msg %s(%v, load %s)\n",
					tg.db, n, round, c.system, r.rate(), r.allocsPerMsg(), r.cpuPerMsg(), stmtsNote(r), r.took.Round(time.Millisecond), loadavg())
			}
		}
		if err := report(out, cfg, tg, n, results); err != nil {
			return err
		}
	}
	return nil
}

// drainUndisturbed runs drainOnce until a drain sees no server restart, three times at
// most.
func drainUndisturbed(ctx context.Context, tg *target, c contender, workers, rows int) (result, error) {
	for try := 1; ; try++ {
		var before, after string
		var err error
		if tg.epoch != nil {
			if before, err = tg.epoch(ctx); err != nil {
				return result{}, err
			}
		}
		r, err := drainOnce(ctx, tg, c, workers, rows)
		if tg.epoch != nil {
			var eerr error
			if after, eerr = tg.epoch(ctx); eerr != nil {
				return result{}, errors.Join(err, eerr)
			}
		}
		if before == after {
			return r, err
		}
		if try == 3 {
			return result{}, fmt.Errorf("the server restarted during %d drains in a row (last error: %v)", try, err)
		}
		// The round is void whatever it returned, an error included.
		fmt.Fprintf(os.Stderr, "peers: %s %s workers=%d: the server restarted during the drain (%s, then %s; error: %v); running it again\n",
			tg.db, c.system, workers, before, after, err)
	}
}

// drainOnce fills, drains (timed, with the CPU profile's samples labelled) and checks.
func drainOnce(ctx context.Context, tg *target, c contender, workers, rows int) (result, error) {
	defer c.clean(ctx)
	if err := c.fill(ctx, rows); err != nil {
		return result{}, fmt.Errorf("fill: %w", err)
	}
	runtime.GC()
	lctx := pprof.WithLabels(ctx, pprof.Labels("system", c.system, "db", tg.db, "workers", strconv.Itoa(workers)))
	pprof.SetGoroutineLabels(lctx)
	r, err := c.drain(lctx, workers, rows)
	pprof.SetGoroutineLabels(ctx)
	if err != nil {
		return r, err
	}
	if err := c.check(ctx, rows); err != nil {
		return r, err
	}
	return r, nil
}

func stmtsNote(r result) string {
	if r.stmts < 0 {
		return ""
	}
	return fmt.Sprintf("%.2f stmts/msg ", r.stmtsPerMsg())
}

// loadavg reads the 1, 5 and 15 minute load averages: other work on the machine skews
// the numbers.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}
