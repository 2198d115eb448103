// Command chaos drains rowactor queue tables from several consumer processes while it
// injects faults, records a history of every delivery and settlement, and checks it:
//
//	go run ./bench/chaos                                  # every fault, database and form, 10,000 rows
//	go run ./bench/chaos -quick                           # the same with 1,000 rows
//	go run ./bench/chaos -fault extend,poison -db postgres -rows 2000 -seed 7
//
// A scenario is one (fault, database, form). For each it creates tables of its own
// (rowactor.Schema), starts -procs consumer processes (this binary re-executed in consumer
// mode), publishes -rows rows in batches through PublishTx while they drain, and injects its
// fault:
//
//   - kill: every -kill-every, at random: SIGKILL a consumer and start another, kill half
//     or all of the consumers' sessions (pg_terminate_backend, MySQL KILL), or shut one
//     consumer down with an already-cancelled context and check what it left.
//   - shutdown: every -shutdown-every, every consumer shuts down at once with an
//     already-cancelled context while rows are in work; nothing may be left behind; new
//     consumers take over.
//   - extend (lease form): a short lease (-lease), a few slow rows whose handler runs 1.5
//     leases, and a session of the parent's that holds FOR UPDATE on slow rows in work
//     (PostgreSQL, MySQL) or BEGIN IMMEDIATE on the file (SQLite) for 1.5 leases, so
//     extensions wait past the lease.
//   - shared (form "mixed"): each consumer subscribes to one table per form on one broker
//     whose pool has 4 connections, Workers(3) each.
//   - deadlock (PostgreSQL, MySQL): Transactional() subscriptions whose handler updates two
//     hot rows in an order by id parity and logs its writes to a side table through d.Tx();
//     a side session locks the hot rows in the opposite order.
//   - poison: -poison rows whose handler always fails (Fail: the default backoff), with MaxAttempts and a
//     dead-letter group; poison-nodlq: the same without, so they retry forever.
//   - stuck: Transactional() subscriptions with -stuck rows whose handler ignores its
//     context and runs -stuck-for; every -shutdown-every every consumer shuts down with a
//     -stuck-shutdown context, which must return within it plus 2 s and leave nothing held
//     while the stuck handlers still run; their late settlements must change nothing.
//   - keypanic: WorkersByKey subscriptions whose key function panics on -key-panic rows;
//     those rows stay queued, unsettled, and every other row is handled once.
//
// Each consumer writes its history to a file (consumer.go); the parent merges them and
// checks (a) successful settlements only by the row's current holder, (b) no overlapping
// handler runs of a row unless a fault explains it, (c) every row settled exactly once,
// (d) nothing left after Shutdown, (e) no free worker idle while rows are due, and for the
// deadlock fault (tx) the handler's writes committed exactly with the row's ack.
// docs/reliability.md defines each check. It prints one human-readable line per scenario
// with the first violations on stderr, one JSON line per scenario on stdout, a table at the
// end, and exits 1 on any violation (or a scenario that could not run).
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
	dbs, forms, faults []string
	rows               int
	procs              int
	killEvery          time.Duration
	shutdownEvery      time.Duration
	publishFor         time.Duration
	shutdownWork       time.Duration
	shutdownRounds     int
	stuck              int           // stuck fault: rows whose handler ignores its context
	stuckFor           time.Duration // stuck fault: how long such a handler runs
	stuckShutdown      time.Duration // stuck fault: Shutdown's context
	keyPanic           int           // keypanic fault: rows whose partition key function panics
	seed               uint64
	dsn                string
	workers            int
	lease              time.Duration
	poll               time.Duration
	work               time.Duration
	batch              int
	timeout            time.Duration
	stall              time.Duration
	keep               bool
	poison             int
	maxAttempts        int
	slowFrac           float64
	hotFrac            float64
	slack              time.Duration
	idleExclude        time.Duration
	examples           int
	galeraScript       string
	nodeDown           time.Duration
}

var (
	allDBs    = []string{"sqlite", "postgres", "mysql"}
	allForms  = []string{"rowlock", "lease", "advisory", "mixed"}
	allFaults = []string{"kill", "shutdown", "extend", "shared", "deadlock", "poison", "poison-nodlq", "stuck", "keypanic"}
	// Asked for by name only, never by "all": a cluster of scripts/galera.sh, and the
	// fault that kills one of its nodes.
	galeraDB      = "galera"
	nodeKillFault = "nodekill"
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
	db := fs.String("db", "all", "database: sqlite, postgres, mysql, galera (a cluster of scripts/galera.sh; not in all) or all (comma-separated list allowed)")
	form := fs.String("form", "all", "claim form: rowlock, lease, advisory, mixed (the shared fault's several forms) or all (comma-separated list allowed)")
	fault := fs.String("fault", "all", "fault: kill, shutdown, extend, shared, deadlock, poison, poison-nodlq, stuck, keypanic, nodekill (galera: SIGKILL node 2 and start it again; not in all) or all (comma-separated list allowed)")
	quick := fs.Bool("quick", false, "a quick run: 1,000 rows (unless -rows is given), -publish-for 3s, -slow 0.01, -stall 15s, -timeout 1m")
	fs.IntVar(&cfg.rows, "rows", 10000, "rows to publish per scenario")
	fs.IntVar(&cfg.procs, "procs", 3, "consumer processes draining at once (SQLite's advisory form and the shared fault on SQLite always run 1)")
	fs.DurationVar(&cfg.killEvery, "kill-every", 500*time.Millisecond, "kill fault: interval between faults (0: none, a baseline run)")
	fs.DurationVar(&cfg.shutdownEvery, "shutdown-every", 1500*time.Millisecond, "shutdown fault: interval between rounds of cancelled Shutdowns")
	fs.IntVar(&cfg.shutdownRounds, "shutdown-rounds", 4, "shutdown fault: rounds at most (then the last consumers drain the rest)")
	fs.DurationVar(&cfg.shutdownWork, "shutdown-work", 40*time.Millisecond, "shutdown fault: each handler sleeps a random time up to this (rows in work when Shutdown comes)")
	fs.IntVar(&cfg.stuck, "stuck", 6, "stuck fault: rows whose (transactional) handler ignores its context and runs -stuck-for")
	fs.DurationVar(&cfg.stuckFor, "stuck-for", 6*time.Second, "stuck fault: how long a stuck handler runs")
	fs.DurationVar(&cfg.stuckShutdown, "stuck-shutdown", time.Second, "stuck fault: the context of each round's Shutdown, which must return within it plus 2 s")
	fs.IntVar(&cfg.keyPanic, "key-panic", 5, "keypanic fault: rows whose WorkersByKey key function panics")
	seed := fs.Int64("seed", 0, "seed of the fault schedule (0: from the clock; printed, so a run can be repeated)")
	fs.StringVar(&cfg.dsn, "dsn", "", "database URL/DSN when -db names one database (default: $ROWACTOR_POSTGRES_URL / $ROWACTOR_MYSQL_DSN or the local servers; SQLite: a temporary file)")
	fs.IntVar(&cfg.workers, "workers", 8, "Workers(n) of each consumer's subscription (the shared fault: the pool's size less one)")
	fs.DurationVar(&cfg.lease, "lease", 2*time.Second, "Lease of the lease form (whole seconds)")
	fs.DurationVar(&cfg.poll, "poll", 50*time.Millisecond, "PollInterval of each subscription")
	fs.DurationVar(&cfg.work, "work", 5*time.Millisecond, "each handler sleeps a random time up to this")
	fs.IntVar(&cfg.batch, "batch", 100, "rows per publishing transaction")
	fs.DurationVar(&cfg.publishFor, "publish-for", 8*time.Second, "spread the publishing over at least this long (0: as fast as it goes), so faults meet rows in work and workers meet rows arriving")
	fs.DurationVar(&cfg.timeout, "timeout", 3*time.Minute, "per scenario: rows still queued after this count as lost")
	fs.DurationVar(&cfg.stall, "stall", 20*time.Second, "per scenario: end the drain when the queued count has not changed for this long (the rows left count as lost)")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the consumers' files and the tables (they are kept anyway when a scenario fails)")
	fs.IntVar(&cfg.poison, "poison", 10, "poison faults: rows whose handler always fails with Fail(err)")
	fs.IntVar(&cfg.maxAttempts, "max-attempts", 3, "poison fault: MaxAttempts before the dead letter")
	fs.Float64Var(&cfg.slowFrac, "slow", 0.003, "extend and nodekill faults: fraction of rows whose handler runs 1.5 leases")
	fs.Float64Var(&cfg.hotFrac, "hot", 0.02, "deadlock fault: fraction of rows whose handler locks the two hot rows")
	fs.DurationVar(&cfg.slack, "slack", time.Second, "timing tolerance of checks (b) and (e)")
	fs.DurationVar(&cfg.idleExclude, "idle-exclude", time.Second, "check (e): time excluded after a consumer is ready and after each kill or shutdown")
	fs.IntVar(&cfg.examples, "examples", 3, "violations printed per check and scenario")
	fs.StringVar(&cfg.galeraScript, "galera-script", "scripts/galera.sh", "nodekill fault: the script that kills and starts a Galera node")
	fs.DurationVar(&cfg.nodeDown, "node-down", 5*time.Second, "nodekill fault: how long the killed node stays down before it is started again")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["rows"] {
			cfg.rows = 1000
		}
		if !set["publish-for"] {
			cfg.publishFor = 3 * time.Second
		}
		if !set["slow"] {
			cfg.slowFrac = 0.01
		}
		if !set["stall"] {
			cfg.stall = 15 * time.Second
		}
		if !set["timeout"] {
			cfg.timeout = time.Minute
		}
	}
	var err error
	if cfg.dbs, err = pick("-db", *db, allDBs, galeraDB); err != nil {
		return cfg, err
	}
	if cfg.forms, err = pick("-form", *form, allForms); err != nil {
		return cfg, err
	}
	if cfg.faults, err = pick("-fault", *fault, allFaults, nodeKillFault); err != nil {
		return cfg, err
	}
	switch {
	case cfg.rows < 1 || cfg.procs < 1 || cfg.workers < 1 || cfg.batch < 1 || cfg.examples < 0:
		return cfg, errors.New("-rows, -procs, -workers and -batch must be at least 1")
	case cfg.killEvery < 0 || cfg.work < 0 || cfg.publishFor < 0 || cfg.poll <= 0 || cfg.lease <= 0 || cfg.timeout <= 0 || cfg.stall <= 0 || cfg.shutdownEvery <= 0:
		return cfg, errors.New("-kill-every and -work must not be negative; -poll, -lease, -timeout, -stall and -shutdown-every must be positive")
	case cfg.maxAttempts < 1 || cfg.poison < 0 || cfg.shutdownRounds < 0 || cfg.slowFrac < 0 || cfg.hotFrac < 0:
		return cfg, errors.New("-max-attempts must be at least 1; -poison, -slow and -hot must not be negative")
	case cfg.stuck < 0 || cfg.keyPanic < 0 || cfg.stuckFor <= 0 || cfg.stuckShutdown <= 0:
		return cfg, errors.New("-stuck and -key-panic must not be negative; -stuck-for and -stuck-shutdown must be positive")
	case cfg.dsn != "" && len(cfg.dbs) != 1:
		return cfg, errors.New("-dsn needs -db to name one database")
	}
	cfg.seed = uint64(*seed)
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano() % 1e9)
	}
	return cfg, nil
}

// pick parses a comma-separated choice among the names of all and extra, "all" meaning
// every one of all.
func pick(flagName, value string, all []string, extra ...string) ([]string, error) {
	if value == "all" {
		return all, nil
	}
	known := append(append([]string(nil), all...), extra...)
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

// scenario is one (fault, database, form) to run.
type scenario struct {
	fault, db, form string
	procs           int
	index           int
	note            string
}

// scenarios lists the triples the flags ask for that exist: SQLite has no row lock form
// and no deadlock fault, its advisory keys live in one process (so its advisory
// scenarios run one consumer), extension applies to the lease form, and the shared fault
// runs every form at once ("mixed").
func scenarios(cfg config) (run []scenario, skipped []string) {
	has := func(list []string, x string) bool {
		for _, v := range list {
			if v == x {
				return true
			}
		}
		return false
	}
	for _, fault := range cfg.faults {
		for _, db := range cfg.dbs {
			forms := []string{"rowlock", "lease", "advisory"}
			switch fault {
			case "extend":
				forms = []string{"lease"}
			case "shared":
				forms = []string{"mixed"}
			}
			for _, form := range forms {
				if !has(cfg.forms, form) {
					continue
				}
				s := scenario{fault: fault, db: db, form: form, procs: cfg.procs}
				switch {
				case db == galeraDB && form != "lease":
					skipped = append(skipped, fault+"/galera/"+form+": a cluster's row locks and GET_LOCK are node-local, and rowactor refuses the form there (the lease form runs)")
					continue
				case fault == nodeKillFault && db != galeraDB:
					skipped = append(skipped, "nodekill/"+db+"/"+form+": the fault kills a Galera node (-db galera)")
					continue
				case db == "sqlite" && form == "rowlock":
					skipped = append(skipped, fault+"/sqlite/rowlock: SQLite has no row locks")
					continue
				case db == "sqlite" && fault == "deadlock":
					skipped = append(skipped, "deadlock/sqlite/"+form+": SQLite runs one writer at a time, so it has no deadlocks")
					continue
				case db == "sqlite" && (form == "advisory" || form == "mixed") && cfg.procs != 1:
					s.procs = 1
					s.note = "SQLite keeps advisory keys in the process: one consumer process at a time"
				}
				s.index = len(run) + 1
				run = append(run, s)
			}
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
	fmt.Fprintf(os.Stderr, "chaos: seed=%d rows=%d procs=%d workers=%d kill-every=%v lease=%v poll=%v work<=%v slack=%v; %d scenarios; %s, GOMAXPROCS=%d, %d CPUs, load average %s; files in %s\n",
		cfg.seed, cfg.rows, cfg.procs, cfg.workers, cfg.killEvery, cfg.lease, cfg.poll, cfg.work, cfg.slack, len(list),
		runtime.Version(), runtime.GOMAXPROCS(0), runtime.NumCPU(), loadavg(), dir)

	out := json.NewEncoder(os.Stdout)
	failed := false
	began := time.Now()
	var results []result
	for _, s := range list {
		if ctx.Err() != nil {
			break
		}
		sdir := filepath.Join(dir, fmt.Sprintf("%02d-%s-%s-%s", s.index, s.fault, s.db, s.form))
		if err := os.MkdirAll(sdir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 1
		}
		if s.note != "" {
			fmt.Fprintf(os.Stderr, "chaos: %s/%s/%s: %s\n", s.fault, s.db, s.form, s.note)
		}
		// Each scenario's fault schedule derives from the seed and its position, so
		// subsets of a run keep their own schedules comparable.
		r := runScenario(ctx, cfg, s, cfg.seed+uint64(s.index)*1_000_003, sdir)
		results = append(results, r)
		fmt.Fprintln(os.Stderr, r.line())
		for _, c := range []struct {
			name string
			c    check
		}{{"a", r.A}, {"b", r.B}, {"c", r.C}, {"d", r.D}, {"e", r.E}, {"tx", r.TX}, {"nk", r.NK}} {
			for _, ex := range c.c.Examples {
				fmt.Fprintf(os.Stderr, "     (%s) %s\n", c.name, ex)
			}
		}
		for _, p := range r.details {
			fmt.Fprintln(os.Stderr, "    ", p)
		}
		_ = out.Encode(r)
		if !r.OK {
			failed = true
		}
	}
	fmt.Fprintln(os.Stderr)
	fmt.Fprintln(os.Stderr, "| fault | db | form | procs | published | faults injected | (a) holder | (b) overlap | (c) once | (d) leftovers | (e) idle | (tx) | unrecorded | redelivered | lease lost | seconds |")
	fmt.Fprintln(os.Stderr, "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range results {
		flag := ""
		switch {
		case r.Stalled:
			flag = " (stalled)"
		case r.TimedOut:
			flag = " (timed out)"
		case r.Error != "":
			flag = " (error)"
		}
		fmt.Fprintf(os.Stderr, "| %s | %s | %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %d | %d | %d | %.1f%s |\n",
			r.Fault, r.DB, r.Form, r.Procs, r.Published, r.faultText(), r.A, r.B, r.C, r.D.String()+r.dKindsText(), r.E, r.TX,
			r.Unrecorded, r.Redelivered, r.LeaseLost, r.Seconds, flag)
	}
	fmt.Fprintf(os.Stderr, "chaos: %d scenarios in %v; load average %s at the end\n", len(results), time.Since(began).Round(time.Second), loadavg())
	if failed || cfg.keep {
		fmt.Fprintf(os.Stderr, "chaos: files kept in %s\n", dir)
	} else {
		_ = os.RemoveAll(dir)
	}
	if failed {
		fmt.Fprintln(os.Stderr, "chaos: FAILED (violations, or a scenario that could not run)")
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
