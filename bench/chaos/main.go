// Command chaos drains rowactor queue tables from several consumer processes while it
// kills those processes and their database connections at random, and counts every row
// by id: was each published row settled exactly once?
//
//	go run ./bench/chaos                                   # every database and form, 10,000 rows
//	go run ./bench/chaos -db postgres -form lease -rows 2000 -kill-every 300ms -seed 7
//
// For each (database, form) it creates a table of its own (rowactor.Schema), starts -procs
// consumer processes (this binary re-executed in consumer mode), publishes -rows rows in
// batches through PublishTx while they drain, and every -kill-every picks a fault at random
// (seeded by -seed): SIGKILL one consumer and start a replacement, or kill some or all of
// the consumers' database sessions (PostgreSQL: pg_terminate_backend; MySQL/MariaDB: KILL).
// When the table is empty it stops the consumers and counts, from the files the consumers
// wrote and from the table itself:
//
//   - published:   rows inserted (ids returned by PublishTx, committed)
//   - handled:     distinct ids with a successful Ack settlement recorded
//   - unrecorded:  ids gone from the table with no Ack recorded, where a fault explains it
//     (the consumer that ran the row was SIGKILLed after the commit and before
//     writing its line, or its session was killed during the COMMIT, so the
//     client saw an error for a commit the server had made)
//   - redelivered: deliveries beyond the first, summed over ids
//   - duplicates:  ids with more than one successful Ack settlement (must be 0)
//   - lost:        ids still in the table at the end, plus ids gone from the table with
//     no Ack recorded and no fault to explain it (must be 0)
//
// It prints one human-readable line per scenario on stderr and one JSON line on stdout,
// and exits 1 on any duplicate or lost row (or a scenario that could not run).
// docs/reliability.md describes the method and the results.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

type config struct {
	dbs, forms []string
	rows       int
	procs      int
	killEvery  time.Duration
	seed       uint64
	dsn        string
	workers    int
	lease      time.Duration
	poll       time.Duration
	work       time.Duration
	batch      int
	timeout    time.Duration
	keep       bool
}

var (
	allDBs   = []string{"sqlite", "postgres", "mysql"}
	allForms = []string{"rowlock", "lease", "advisory"}
)

func main() {
	if spec := os.Getenv(consumerEnv); spec != "" {
		os.Exit(runConsumer(spec))
	}
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, cfg))
}

func parseFlags(args []string) (config, error) {
	cfg := config{}
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	db := fs.String("db", "all", "database: sqlite, postgres, mysql or all (comma-separated list allowed)")
	form := fs.String("form", "all", "claim form: rowlock, lease, advisory or all (comma-separated list allowed)")
	fs.IntVar(&cfg.rows, "rows", 10000, "rows to publish per scenario")
	fs.IntVar(&cfg.procs, "procs", 3, "consumer processes draining at once (SQLite's advisory form always runs 1)")
	fs.DurationVar(&cfg.killEvery, "kill-every", 500*time.Millisecond, "interval between faults (0: no faults, a baseline run)")
	seed := fs.Int64("seed", 0, "seed of the fault schedule (0: from the clock; printed, so a run can be repeated)")
	fs.StringVar(&cfg.dsn, "dsn", "", "database URL/DSN when -db names one database (default: $ROWACTOR_POSTGRES_URL / $ROWACTOR_MYSQL_DSN or the local servers; SQLite: a temporary file)")
	fs.IntVar(&cfg.workers, "workers", 8, "Workers(n) of each consumer's subscription")
	fs.DurationVar(&cfg.lease, "lease", 2*time.Second, "Lease of the lease form")
	fs.DurationVar(&cfg.poll, "poll", 50*time.Millisecond, "PollInterval of each subscription")
	fs.DurationVar(&cfg.work, "work", 5*time.Millisecond, "each handler sleeps a random time up to this before it acks")
	fs.IntVar(&cfg.batch, "batch", 100, "rows per publishing transaction")
	fs.DurationVar(&cfg.timeout, "timeout", 5*time.Minute, "per scenario: rows still in the table after this count as lost")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the consumers' files and the queue tables (they are kept anyway when a scenario fails)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.dbs, err = pick("-db", *db, allDBs); err != nil {
		return cfg, err
	}
	if cfg.forms, err = pick("-form", *form, allForms); err != nil {
		return cfg, err
	}
	switch {
	case cfg.rows < 1 || cfg.procs < 1 || cfg.workers < 1 || cfg.batch < 1:
		return cfg, errors.New("-rows, -procs, -workers and -batch must be at least 1")
	case cfg.killEvery < 0 || cfg.work < 0 || cfg.poll <= 0 || cfg.lease <= 0 || cfg.timeout <= 0:
		return cfg, errors.New("-kill-every and -work must not be negative; -poll, -lease and -timeout must be positive")
	case cfg.dsn != "" && len(cfg.dbs) != 1:
		return cfg, errors.New("-dsn needs -db to name one database")
	}
	cfg.seed = uint64(*seed)
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano() % 1e9)
	}
	return cfg, nil
}

// pick parses a comma-separated choice among known names, "all" meaning every one.
func pick(flagName, value string, known []string) ([]string, error) {
	if value == "all" {
		return known, nil
	}
	var out []string
	for _, v := range strings.Split(value, ",") {
		v = strings.TrimSpace(v)
		found := false
		for _, k := range known {
			if v == k {
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("%s %q: want one of %s or all", flagName, v, strings.Join(known, ", "))
		}
		out = append(out, v)
	}
	return out, nil
}

// scenario is one (database, form) pair to run.
type scenario struct {
	db, form string
	procs    int
	note     string
}

// scenarios lists the pairs the flags ask for that exist: SQLite has no row lock form,
// and its advisory keys live in one process, so that pair runs one consumer at a time.
func scenarios(cfg config) (run []scenario, skipped []string) {
	for _, db := range cfg.dbs {
		for _, form := range cfg.forms {
			s := scenario{db: db, form: form, procs: cfg.procs}
			switch {
			case db == "sqlite" && form == "rowlock":
				skipped = append(skipped, "sqlite/rowlock: SQLite has no row locks")
				continue
			case db == "sqlite" && form == "advisory" && cfg.procs != 1:
				s.procs = 1
				s.note = "SQLite keeps advisory keys in the process: one consumer process at a time (-procs 1)"
			}
			run = append(run, s)
		}
	}
	return run, skipped
}

func run(ctx context.Context, cfg config) int {
	list, skipped := scenarios(cfg)
	for _, s := range skipped {
		fmt.Fprintln(os.Stderr, "chaos: skip", s)
	}
	if len(list) == 0 {
		fmt.Fprintln(os.Stderr, "chaos: nothing to run")
		return 2
	}
	dir, err := os.MkdirTemp("", "rowactor-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "chaos: seed=%d rows=%d procs=%d workers=%d kill-every=%v lease=%v poll=%v work<=%v; %s, GOMAXPROCS=%d, %d CPUs, load average %s; files in %s\n",
		cfg.seed, cfg.rows, cfg.procs, cfg.workers, cfg.killEvery, cfg.lease, cfg.poll, cfg.work,
		runtime.Version(), runtime.GOMAXPROCS(0), runtime.NumCPU(), loadavg(), dir)

	out := json.NewEncoder(os.Stdout)
	failed := false
	var results []result
	for i, s := range list {
		if ctx.Err() != nil {
			break
		}
		sdir := filepath.Join(dir, fmt.Sprintf("%d-%s-%s", i+1, s.db, s.form))
		if err := os.MkdirAll(sdir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 1
		}
		if s.note != "" {
			fmt.Fprintf(os.Stderr, "chaos: %s/%s: %s\n", s.db, s.form, s.note)
		}
		// Each scenario's fault schedule derives from the seed and its position, so
		// -db/-form subsets of a run keep their own schedules comparable.
		r := runScenario(ctx, cfg, s, cfg.seed+uint64(i)*1_000_003, sdir)
		results = append(results, r)
		fmt.Fprintln(os.Stderr, r.line())
		for _, p := range r.details {
			fmt.Fprintln(os.Stderr, "    ", p)
		}
		_ = out.Encode(r)
		if !r.OK {
			failed = true
		}
	}
	fmt.Fprintln(os.Stderr)
	fmt.Fprintln(os.Stderr, "| db | form | procs | published | handled | unrecorded (SIGKILL / commit unknown / misreported) | redelivered | duplicates | lost | process kills | sessions killed (rounds) | acks misreported | seconds |")
	fmt.Fprintln(os.Stderr, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range results {
		fmt.Fprintf(os.Stderr, "| %s | %s | %d | %d | %d | %d (%d / %d / %d) | %d | %d | %d | %d | %d (%d) | %d | %.1f |\n",
			r.DB, r.Form, r.Procs, r.Published, r.Handled, r.Unrecorded, r.UnrecordedSIGKILL, r.UnrecordedCommitUnknown, r.UnrecordedMisreported,
			r.Redelivered, r.Duplicates, r.Lost, r.ProcessKills, r.SessionsKilled, r.SessionKillRounds, r.AckMisreported, r.Seconds)
	}
	fmt.Fprintf(os.Stderr, "chaos: load average %s at the end\n", loadavg())
	if failed || cfg.keep {
		fmt.Fprintf(os.Stderr, "chaos: files kept in %s\n", dir)
	} else {
		_ = os.RemoveAll(dir)
	}
	if failed {
		fmt.Fprintln(os.Stderr, "chaos: FAILED")
		return 1
	}
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "chaos: interrupted")
		return 1
	}
	return 0
}

// loadavg reads the 1, 5 and 15 minute load averages.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}
