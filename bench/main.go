// Command bench measures how fast rowactor drains a queue table, next to a bare loop that
// runs the very same SQL by hand, so the difference is the runtime's overhead.
//
//	go run ./bench -db sqlite -form lease -workers 1,8 -rows 20000 -rounds 3
//
// For each worker count and round it fills a fresh table outside the timed window, lets
// each contender drain it (their order alternates from round to round), and after the
// rounds prints one JSON line per contender and one with the ratio of the two.
// docs/benchmarks.md describes the method and the numbers.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects/sqlite"
)

type config struct {
	db, form string
	workers  []int
	rows     int
	rounds   int
	dir      string
}

func main() {
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

// parseFlags reads the flags and refuses what this build cannot serve.
func parseFlags(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&cfg.db, "db", "sqlite", "database: sqlite")
	fs.StringVar(&cfg.form, "form", "lease", "claim form: lease")
	workers := fs.String("workers", "1,8", "comma-separated worker counts")
	fs.IntVar(&cfg.rows, "rows", 20000, "rows per drain")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds per worker count")
	fs.StringVar(&cfg.dir, "dir", "", "directory for the database file (default: a fresh temporary one)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	case cfg.db == "postgres" || cfg.db == "mysql":
		return cfg, fmt.Errorf("-db %s: not in this build yet (this build benchmarks sqlite)", cfg.db)
	case cfg.db != "sqlite":
		return cfg, fmt.Errorf("-db %q: unknown database (want sqlite)", cfg.db)
	case cfg.form == "advisory":
		return cfg, errors.New("-form advisory: not in this build yet (this build benchmarks the lease form)")
	case cfg.form == "rowlock":
		return cfg, errors.New("-form rowlock: SQLite has no row locks (want lease)")
	case cfg.form != "lease":
		return cfg, fmt.Errorf("-form %q: unknown form (want lease)", cfg.form)
	case cfg.rows < 1 || cfg.rounds < 1:
		return cfg, errors.New("-rows and -rounds must be at least 1")
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

func run(cfg config) error {
	ctx := context.Background()
	dir := cfg.dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "rowactor-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	path := filepath.Join(dir, "bench.db")
	// One pool with sqlite.Open's pragmas (WAL, busy_timeout, synchronous=NORMAL), shared
	// by both contenders.
	d, err := sqlite.Open(ctx, path)
	if err != nil {
		return err
	}
	defer d.Close()
	var version string
	if err := d.DB().QueryRowContext(ctx, "select sqlite_version()").Scan(&version); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: sqlite %s, %s, GOMAXPROCS=%d, load average %s, %s\n",
		version, runtime.Version(), runtime.GOMAXPROCS(0), loadavg(), path)
	defer func() { fmt.Fprintf(os.Stderr, "bench: load average %s at the end\n", loadavg()) }()

	out := json.NewEncoder(os.Stdout)
	for _, n := range cfg.workers {
		results := make(map[string][]result)
		for round := 1; round <= cfg.rounds; round++ {
			order := slices.Clone(contenders)
			if round%2 == 0 {
				slices.Reverse(order)
			}
			for _, c := range order {
				if err := refill(ctx, d, cfg.rows); err != nil {
					return fmt.Errorf("fill for %s: %w", c.name, err)
				}
				r, err := c.drain(ctx, d, n, cfg.rows)
				if err != nil {
					return fmt.Errorf("%s, %d workers, round %d: %w", c.name, n, round, err)
				}
				if err := checkEmpty(ctx, d); err != nil {
					return fmt.Errorf("%s, %d workers, round %d: %w", c.name, n, round, err)
				}
				results[c.name] = append(results[c.name], r)
				fmt.Fprintf(os.Stderr, "bench: workers=%d round=%d %-8s %8.0f msgs/s %6.1f allocs/msg (%v, %d goroutines after)\n",
					n, round, c.name, r.rate(), r.allocsPerMsg(), r.took.Round(time.Millisecond), runtime.NumGoroutine())
			}
		}
		for _, c := range contenders {
			rs := results[c.name]
			rates := mapSlice(rs, result.rate)
			if err := out.Encode(summary{
				DB: cfg.db, Form: cfg.form, Contender: c.name, Workers: n, Rows: cfg.rows, Rounds: cfg.rounds,
				Median: roundTo(median(rates), 0), Min: roundTo(slices.Min(rates), 0), Max: roundTo(slices.Max(rates), 0),
				Allocs: roundTo(median(mapSlice(rs, result.allocsPerMsg)), 1),
			}); err != nil {
				return err
			}
		}
		// Rounds pair the contenders: the ratio is taken within each round, then its median.
		ratios := make([]float64, cfg.rounds)
		for i := range ratios {
			ratios[i] = results["rowactor"][i].rate() / results["raw"][i].rate()
		}
		if err := out.Encode(ratioLine{DB: cfg.db, Form: cfg.form, Workers: n, Ratio: roundTo(median(ratios), 3)}); err != nil {
			return err
		}
	}
	return nil
}

// summary is one contender's line for one worker count.
type summary struct {
	DB        string  `json:"db"`
	Form      string  `json:"form"`
	Contender string  `json:"contender"`
	Workers   int     `json:"workers"`
	Rows      int     `json:"rows"`
	Rounds    int     `json:"rounds"`
	Median    float64 `json:"msgs_per_s_median"`
	Min       float64 `json:"msgs_per_s_min"`
	Max       float64 `json:"msgs_per_s_max"`
	Allocs    float64 `json:"allocs_per_msg"`
}

type ratioLine struct {
	DB      string  `json:"db"`
	Form    string  `json:"form"`
	Workers int     `json:"workers"`
	Ratio   float64 `json:"ratio_rowactor_over_raw"`
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
