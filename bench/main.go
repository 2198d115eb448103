// Command bench measures how fast rowactor drains a queue table, next to a bare loop that
// runs the very same SQL by hand, so the difference is the runtime's overhead.
//
//	go run ./bench -db sqlite -form lease -workers 1,8 -rows 20000 -rounds 3
//	go run ./bench -db postgres -form lease,rowlock,advisory -workers 1,8 -tracing both
//	go run ./bench -db mysql -form lease,rowlock -workers 1,8 -rows 10000
//
// For each database, form and worker count, and for each round, it fills a fresh table
// outside the timed window, lets each contender drain it (their order rotates from round
// to round), and drops the table. After the rounds it prints one JSON line per contender,
// one with the ratio of rowactor to the raw loop, and with -tracing both one with the cost
// of tracing. docs/benchmarks.md describes the method and the numbers.
//
// That is -mode drain, the default. The other modes keep rowactor's defaults (no
// PollInterval; Prefetch only with -prefetch) and print one JSON line per result, with
// "mode" set, and progress on stderr:
//
//	-mode latency  publish to handler start, per -db and -form, one worker: -latency-n idle
//	               publishes (each handled, then a -latency-gap pause, default 100 ms), then
//	               -latency-rate msgs/s for -latency-seconds; p50/p90/p99/max and the
//	               deliveries that waited rowactor's 1 s poll. On PostgreSQL also with the
//	               publisher in another process (this binary again), woken by NOTIFY.
//	go run ./bench -mode latency -db sqlite,postgres,mysql -form lease -latency-n 200
//
//	-mode growth   per -db, the lease form with 8 workers: msgs/s and allocs/msg over the
//	               first -growth-n rows (default 5000) of tables of -growth-sizes queued
//	               rows (default 10000,100000,1000000), then the raw loop's claim p50/p99
//	               on the rest; last, -growth-finished rows (default 1000000; 0 skips)
//	               kept by a processed_at column beside 10,000 queued.
//	go run ./bench -mode growth -db sqlite,postgres,mysql
//
//	-mode idle     PostgreSQL (-pg) only: -idle-subs subscriptions (default 100, the groups
//	               of one lease table) on one broker; CPU as % of a core over
//	               -idle-seconds (default 30) and the broker's connections.
//	go run ./bench -mode idle
//
//	-mode dashboard PostgreSQL (-pg) only: the dashboard's overview and a job list page of
//	               a -dash-rows table (default 1000000, all but 10,000 finished), -dash-n
//	               renders each (default 30): p50/p90/max ms, per index case.
//	go run ./bench -mode dashboard
//
//	-mode rss      SQLite (-dir) only: drains -rss-rows (default 1000000) with 8 workers,
//	               the RSS at every tenth, and its growth after the first tenth.
//	go run ./bench -mode rss
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

type config struct {
	mode       string // drain, latency, growth, idle, rss
	dbs        []string
	forms      []dialects.Form
	workers    []int
	rows       int
	rounds     int
	tracing    string // off, on, both
	dir        string
	pgURL      string
	mysqlDSN   string
	galeraDSNs string
	brokers    int // -mode drain on PostgreSQL or MySQL: pools (and brokers) on the one server
	cpuprofile string
	memprofile string
	// contenders names the contenders that run (-contenders): all by default. A memory
	// profile's samples carry no labels, so running rowactor alone is how to read its
	// allocations apart from the loops'.
	contenders []string

	// -mode latency
	latencyN       int           // idle single publishes
	latencyGap     time.Duration // the pause after each idle publish was handled
	latencyRate    int           // steady publishes per second
	latencySeconds int           // how long the steady load runs
	// -mode growth
	growthSizes    []int // queued rows of each case
	growthN        int   // rows timed per case (and claims timed by the raw loop)
	growthFinished int   // finished rows of the kept-history case; 0 skips it
	// -mode idle
	idleSubs    int
	idleSeconds int
	// -mode dashboard
	dashRows int
	dashN    int
	// dashEvery spaces the overview's timed renders as an open page's refresh does.
	dashEvery time.Duration
	// -mode rss
	rssRows int
}

func main() {
	// A latency run on PostgreSQL starts this binary again as a bare publisher in another
	// process; the flag is not among -help's, being of no use by hand.
	if len(os.Args) > 1 && os.Args[1] == publisherFlag {
		if err := publisherMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench publisher:", err)
			os.Exit(1)
		}
		return
	}
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// formsOf lists the forms each database serves.
var formsOf = map[string][]dialects.Form{
	"sqlite":   {dialects.FormLease, dialects.FormAdvisory},
	"postgres": {dialects.FormRowLock, dialects.FormLease, dialects.FormAdvisory},
	"mysql":    {dialects.FormRowLock, dialects.FormLease, dialects.FormAdvisory},
	// A cluster's row locks and GET_LOCK are node-local: rowactor refuses those forms there.
	"galera": {dialects.FormLease},
}

var formNames = map[string]dialects.Form{
	"rowlock": dialects.FormRowLock, "lease": dialects.FormLease, "advisory": dialects.FormAdvisory,
}

// parseFlags reads the flags and refuses what cannot run, before anything is opened.
func parseFlags(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&cfg.mode, "mode", "drain", "what to measure: drain, latency, growth, idle, dashboard or rss")
	dbs := fs.String("db", "sqlite", "databases, comma-separated: sqlite, postgres, mysql, galera (the cluster of scripts/galera.sh: a broker, or -workers raw loops, per node)")
	forms := fs.String("form", "lease", "claim forms, comma-separated: rowlock, lease, advisory")
	workers := fs.String("workers", "1,8", "worker counts, comma-separated")
	fs.IntVar(&cfg.rows, "rows", 20000, "rows per drain")
	fs.IntVar(&cfg.brokers, "brokers", 1, "-db postgres or mysql: that many pools on the server, a broker each (or -workers raw loops each), as that many consumer processes would have")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds per database, form and worker count")
	fs.IntVar(&prefetch, "prefetch", -1, "rowactor's Prefetch(n) in the lease form (default: not given, rowactor sizes the room itself; 0 claims only for free workers)")
	fs.StringVar(&cfg.tracing, "tracing", "off", "rowactor's OpenTelemetry: off, on, or both (rowactor runs twice per round)")
	fs.StringVar(&cfg.dir, "dir", "", "directory for the SQLite file (default: a fresh temporary one)")
	fs.StringVar(&cfg.pgURL, "pg", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable&pool_max_conns=16", "PostgreSQL URL (pgx)")
	fs.StringVar(&cfg.mysqlDSN, "mysql", "root@tcp(127.0.0.1:3306)/test", "MySQL/MariaDB DSN (go-sql-driver)")
	fs.StringVar(&cfg.galeraDSNs, "galera", "root@tcp(127.0.0.1:3307)/test,root@tcp(127.0.0.1:3308)/test,root@tcp(127.0.0.1:3309)/test", "-db galera: the nodes' DSNs, comma-separated")
	fs.StringVar(&cfg.cpuprofile, "cpuprofile", "", "write a CPU profile of the whole run to this file (samples are labelled contender, tracing, db, form, workers)")
	fs.StringVar(&cfg.memprofile, "memprofile", "", "record every allocation (slow: the rates are then meaningless) and write the heap profile to this file at the end")
	contenders := fs.String("contenders", "rowactor,raw,raw-batch", "-mode drain: the contenders that run, comma-separated (rowactor alone, say, to read its allocations in a -memprofile); a ratio needs both its sides")
	fs.IntVar(&cfg.latencyN, "latency-n", 200, "-mode latency: idle single publishes, each handled before the next")
	fs.DurationVar(&cfg.latencyGap, "latency-gap", 100*time.Millisecond, "-mode latency: pause after each idle publish was handled")
	fs.IntVar(&cfg.latencyRate, "latency-rate", 100, "-mode latency: publishes per second of the steady load")
	fs.IntVar(&cfg.latencySeconds, "latency-seconds", 5, "-mode latency: seconds of the steady load")
	sizes := fs.String("growth-sizes", "10000,100000,1000000", "-mode growth: queued rows of each case, comma-separated")
	fs.IntVar(&cfg.growthN, "growth-n", 5000, "-mode growth: rows timed per case (the rest of the table is dropped undrained)")
	fs.IntVar(&cfg.growthFinished, "growth-finished", 1000000, "-mode growth: finished rows kept (processed_at) beside 10,000 queued in the last case; 0 skips it")
	fs.IntVar(&cfg.idleSubs, "idle-subs", 100, "-mode idle: idle subscriptions on one PostgreSQL broker")
	fs.IntVar(&cfg.idleSeconds, "idle-seconds", 30, "-mode idle: seconds of CPU time measured")
	fs.IntVar(&cfg.dashRows, "dash-rows", 1000000, "-mode dashboard: rows of the table")
	fs.IntVar(&cfg.dashN, "dash-n", 30, "-mode dashboard: renders timed per page and case")
	fs.DurationVar(&cfg.dashEvery, "dash-every", 0, "-mode dashboard: the pause before each timed overview render, as an open page refreshes (0: back to back)")
	fs.IntVar(&cfg.rssRows, "rss-rows", 1000000, "-mode rss: rows drained from SQLite")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	switch cfg.mode {
	case "drain", "latency", "growth", "idle", "dashboard", "rss":
	default:
		return cfg, fmt.Errorf("-mode %q: want drain, latency, growth, idle, dashboard or rss", cfg.mode)
	}
	for _, f := range splitList(*sizes) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("-growth-sizes %q: want positive integers separated by commas", *sizes)
		}
		cfg.growthSizes = append(cfg.growthSizes, n)
	}
	if cfg.latencyN < 1 || cfg.latencyRate < 1 || cfg.latencySeconds < 1 || cfg.latencyGap < 0 ||
		cfg.growthN < 1 || cfg.growthFinished < 0 || cfg.idleSubs < 1 || cfg.idleSeconds < 1 || cfg.rssRows < 10 || cfg.dashRows < 20000 || cfg.dashN < 1 {
		return cfg, errors.New("-latency-*, -growth-*, -idle-*, -dash-* and -rss-rows need positive values (-rss-rows at least 10, -dash-rows at least 20000, -growth-finished may be 0)")
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, name := range splitList(*dbs) {
		if _, ok := formsOf[name]; !ok {
			return cfg, fmt.Errorf("-db %q: unknown database (want sqlite, postgres, mysql or galera)", name)
		}
		if !slices.Contains(cfg.dbs, name) {
			cfg.dbs = append(cfg.dbs, name)
		}
	}
	for _, name := range splitList(*forms) {
		f, ok := formNames[name]
		if !ok {
			return cfg, fmt.Errorf("-form %q: unknown form (want rowlock, lease or advisory)", name)
		}
		if !slices.Contains(cfg.forms, f) {
			cfg.forms = append(cfg.forms, f)
		}
	}
	if len(cfg.dbs) == 0 || len(cfg.forms) == 0 {
		return cfg, errors.New("-db and -form each need at least one name")
	}
	for _, db := range cfg.dbs {
		for _, f := range cfg.forms {
			if !slices.Contains(formsOf[db], f) {
				return cfg, fmt.Errorf("-db %s with -form %s: %s has no %s form (it serves %s); drop one of them",
					db, f, displayNames[db], formDisplay(f), joinForms(formsOf[db]))
			}
		}
	}
	switch cfg.tracing {
	case "off", "on", "both":
	default:
		return cfg, fmt.Errorf("-tracing %q: want off, on or both", cfg.tracing)
	}
	for _, c := range strings.Split(*contenders, ",") {
		c = strings.TrimSpace(c)
		if !slices.Contains([]string{"rowactor", "raw", "raw-batch"}, c) {
			return cfg, fmt.Errorf("-contenders %q: %q is none of rowactor, raw, raw-batch", *contenders, c)
		}
		cfg.contenders = append(cfg.contenders, c)
	}
	if cfg.tracing == "both" && !slices.Contains(cfg.contenders, "rowactor") {
		return cfg, errors.New("-tracing both compares rowactor with itself: keep rowactor in -contenders")
	}
	if cfg.rows < 1 || cfg.rounds < 1 || cfg.brokers < 1 {
		return cfg, errors.New("-rows, -rounds and -brokers must be at least 1")
	}
	if cfg.brokers > 1 && (cfg.mode != "drain" || slices.Contains(cfg.dbs, "sqlite") || slices.Contains(cfg.dbs, "galera")) {
		return cfg, errors.New("-brokers works in -mode drain on postgres and mysql (galera has a broker per node)")
	}
	for _, f := range strings.Split(*workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("-workers %q: want positive integers separated by commas", *workers)
		}
		cfg.workers = append(cfg.workers, n)
	}
	return cfg, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.ToLower(strings.TrimSpace(f)); f != "" {
			out = append(out, f)
		}
	}
	return out
}

var displayNames = map[string]string{"sqlite": "SQLite", "postgres": "PostgreSQL", "mysql": "MySQL/MariaDB", "galera": "a MariaDB Galera cluster"}

func formDisplay(f dialects.Form) string {
	if f == dialects.FormRowLock {
		return "row lock"
	}
	return f.String()
}

func joinForms(fs []dialects.Form) string {
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = formDisplay(f)
	}
	return strings.Join(names, " and ")
}

// contendersFor lists the contenders of a run: rowactor once or twice (tracing off, on),
// and the raw loop.
func contendersFor(tracing string) []contender {
	var cs []contender
	if tracing == "off" || tracing == "both" {
		cs = append(cs, contender{name: "rowactor", tracing: false, drain: drainRowactor})
	}
	if tracing == "on" || tracing == "both" {
		cs = append(cs, contender{name: "rowactor", tracing: true, drain: drainRowactor})
	}
	cs = append(cs, contender{name: "raw", drain: drainRaw})
	return append(cs, contender{name: "raw-batch", forms: []dialects.Form{dialects.FormLease}, drain: drainRawBatch})
}

// serves lists the contenders that drain form.
func serves(cs []contender, form dialects.Form) []contender {
	var out []contender
	for _, c := range cs {
		if c.forms == nil || slices.Contains(c.forms, form) {
			out = append(out, c)
		}
	}
	return out
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
	if cfg.memprofile != "" {
		runtime.MemProfileRate = 1
		defer func() {
			// The profile counts allocations as of the last completed GC: one now counts
			// them all, up to the end of the run.
			runtime.GC()
			f, err := os.Create(cfg.memprofile)
			if err == nil {
				err = errors.Join(pprof.Lookup("allocs").WriteTo(f, 0), f.Close())
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "bench: memprofile:", err)
			}
		}()
	}
	fmt.Fprintf(os.Stderr, "bench: %s, GOMAXPROCS=%d, load average %s\n", runtime.Version(), runtime.GOMAXPROCS(0), loadavg())
	defer func() { fmt.Fprintf(os.Stderr, "bench: load average %s at the end\n", loadavg()) }()

	out := json.NewEncoder(os.Stdout)
	switch cfg.mode {
	case "idle":
		return runIdle(ctx, cfg, out) // PostgreSQL only
	case "rss":
		return runRSS(ctx, cfg, out) // SQLite only
	case "dashboard":
		return runDashboard(ctx, cfg, out) // PostgreSQL only
	}
	contenders := slices.DeleteFunc(contendersFor(cfg.tracing), func(c contender) bool { return !slices.Contains(cfg.contenders, c.name) })
	for _, db := range cfg.dbs {
		tg, err := openTarget(ctx, db, cfg)
		if err != nil {
			return fmt.Errorf("open %s: %w", db, err)
		}
		fmt.Fprintf(os.Stderr, "bench: %s %s\n", db, tg.version)
		switch cfg.mode {
		case "latency":
			err = runLatency(ctx, cfg, tg, out)
		case "growth":
			err = runGrowth(ctx, cfg, tg, out)
		default:
			err = runTarget(ctx, cfg, tg, contenders, out)
		}
		tg.close()
		if err != nil {
			return err
		}
	}
	return nil
}

func runTarget(ctx context.Context, cfg config, tg *target, contenders []contender, out *json.Encoder) error {
	all := contenders
	for _, form := range cfg.forms {
		t := tableFor(form)
		contenders := serves(all, form)
		for _, n := range cfg.workers {
			results := make(map[string][]result)
			for round := 1; round <= cfg.rounds; round++ {
				// The order rotates: with two contenders it alternates, with three each
				// takes each place once in three rounds.
				order := slices.Clone(contenders)
				k := (round - 1) % len(order)
				order = append(order[k:], order[:k]...)
				for _, c := range order {
					r, err := drainOnce(ctx, tg, t, c, n, cfg.rows)
					if err != nil {
						return fmt.Errorf("%s %s, %s, %d workers, round %d: %w", tg.db, form, c.key(), n, round, err)
					}
					results[c.key()] = append(results[c.key()], r)
					fmt.Fprintf(os.Stderr, "bench: %s %s workers=%d round=%d %-12s %8.0f msgs/s %6.1f allocs/msg %s(%v, load %s)\n",
						tg.db, form, n, round, c.key(), r.rate(), r.allocsPerMsg(), r.notes(), r.took.Round(time.Millisecond), loadavg())
				}
			}
			if err := report(out, cfg, tg, form, n, contenders, results); err != nil {
				return err
			}
		}
	}
	return nil
}

// drainOnce fills a fresh table, lets one contender drain it, checks it is empty and drops
// it. Only the drain is timed. The CPU profile's samples of the drain carry labels.
func drainOnce(ctx context.Context, tg *target, t tableDesc, c contender, workers, rows int) (result, error) {
	if err := tg.refill(ctx, t.Table, rows); err != nil {
		return result{}, fmt.Errorf("fill: %w", err)
	}
	defer tg.drop(ctx, t.Name)
	runtime.GC()
	lctx := pprof.WithLabels(ctx, pprof.Labels("contender", c.name, "tracing", onOff(c.tracing), "db", tg.db,
		"form", t.Form().String(), "workers", strconv.Itoa(workers)))
	pprof.SetGoroutineLabels(lctx)
	r, err := c.drain(lctx, tg, t, workers, rows, c.tracing)
	pprof.SetGoroutineLabels(ctx)
	if err != nil {
		return r, err
	}
	if left, err := tg.count(ctx, t.Name); err != nil {
		return r, err
	} else if left != 0 {
		return r, fmt.Errorf("%d rows left in the table after the drain", left)
	}
	return r, nil
}

// report prints the lines of one database, form and worker count.
func report(out *json.Encoder, cfg config, tg *target, form dialects.Form, n int, contenders []contender, results map[string][]result) error {
	for _, c := range contenders {
		rs := results[c.key()]
		rates := mapSlice(rs, result.rate)
		s := summary{
			DB: tg.db, Form: form.String(), Contender: c.name, Tracing: onOff(c.tracing), Workers: n, Pools: len(tg.nodes), Rows: cfg.rows, Rounds: cfg.rounds,
			Median: roundTo(median(rates), 0), Min: roundTo(slices.Min(rates), 0), Max: roundTo(slices.Max(rates), 0),
			Allocs: roundTo(median(mapSlice(rs, result.allocsPerMsg)), 1),
			CPU:    roundTo(median(mapSlice(rs, result.cpuPerMsg)), 1),
		}
		if rs[0].stmtsBy != "" {
			v := roundTo(median(mapSlice(rs, result.stmtsPerMsg)), 2)
			s.Stmts, s.StmtsBy = &v, rs[0].stmtsBy
		}
		if c.tracing {
			v := roundTo(median(mapSlice(rs, result.spansPerMsg)), 2)
			s.Spans = &v
		}
		if err := out.Encode(s); err != nil {
			return err
		}
	}
	// Rounds pair the contenders: the ratio is taken within each round, then its median.
	for _, against := range []string{"raw", "raw-batch"} {
		raw, ok := results[against]
		if !ok {
			continue
		}
		for _, c := range contenders {
			if c.name != "rowactor" {
				continue
			}
			rs := results[c.key()]
			ratios := make([]float64, len(rs))
			for i := range rs {
				ratios[i] = rs[i].rate() / raw[i].rate()
			}
			if err := out.Encode(ratioLine{DB: tg.db, Form: form.String(), Tracing: onOff(c.tracing), Workers: n, Pools: len(tg.nodes),
				Against: against, Ratio: roundTo(median(ratios), 3)}); err != nil {
				return err
			}
		}
	}
	if cfg.tracing == "both" {
		off, on := results["rowactor/off"], results["rowactor/on"]
		perRound := make([]float64, len(on))
		for i := range on {
			perRound[i] = roundTo(1-on[i].rate()/off[i].rate(), 3)
		}
		cost := 1 - median(mapSlice(on, result.rate))/median(mapSlice(off, result.rate))
		cpuOn, cpuOff := median(mapSlice(on, result.cpuPerMsg)), median(mapSlice(off, result.cpuPerMsg))
		if err := out.Encode(tracingLine{DB: tg.db, Form: form.String(), Workers: n,
			Cost: roundTo(cost, 3), PerRound: perRound,
			CPU: roundTo(cpuOn-cpuOff, 1), CPUShare: roundTo(1-cpuOff/cpuOn, 3)}); err != nil {
			return err
		}
	}
	return nil
}

// summary is one contender's line for one database, form and worker count.
type summary struct {
	DB        string `json:"db"`
	Form      string `json:"form"`
	Contender string `json:"contender"`
	Tracing   string `json:"tracing"`
	Workers   int    `json:"workers"`
	// Pools is the pools (-brokers, or a cluster's nodes) the contender spread over, each
	// with Workers workers; absent for one.
	Pools   int      `json:"pools,omitempty"`
	Rows    int      `json:"rows"`
	Rounds  int      `json:"rounds"`
	Median  float64  `json:"msgs_per_s_median"`
	Min     float64  `json:"msgs_per_s_min"`
	Max     float64  `json:"msgs_per_s_max"`
	Allocs  float64  `json:"allocs_per_msg"`
	CPU     float64  `json:"cpu_us_per_msg"`
	Stmts   *float64 `json:"statements_per_msg,omitempty"`
	StmtsBy string   `json:"statements_counted_by,omitempty"`
	Spans   *float64 `json:"spans_per_msg,omitempty"`
}

type ratioLine struct {
	DB      string `json:"db"`
	Form    string `json:"form"`
	Tracing string `json:"tracing"`
	Workers int    `json:"workers"`
	Pools   int    `json:"pools,omitempty"`
	// Against names the loop compared with: "raw" (one row per claim and settlement) or
	// "raw-batch" (32 rows per claim, one batched ack).
	Against string  `json:"against"`
	Ratio   float64 `json:"ratio_rowactor_over_raw"`
}

type tracingLine struct {
	DB       string    `json:"db"`
	Form     string    `json:"form"`
	Workers  int       `json:"workers"`
	Cost     float64   `json:"tracing_cost"`
	PerRound []float64 `json:"tracing_cost_per_round"`
	// CPU is what tracing adds to the process's CPU per message (median on - median
	// off), and CPUShare that as a share of the traced run's CPU per message: the cost in
	// throughput where the client's CPU is the bottleneck.
	CPU      float64 `json:"tracing_cpu_us_per_msg"`
	CPUShare float64 `json:"tracing_cpu_share"`
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// loadavg reads the 1, 5 and 15 minute load averages: other work on the machine
// skews the numbers.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func roundTo(x float64, places int) float64 {
	p := math.Pow10(places)
	return math.Round(x*p) / p
}

func mapSlice[T, U any](xs []T, f func(T) U) []U {
	out := make([]U, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}
