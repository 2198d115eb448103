package main

// -mode rss: does the process's memory grow while rowactor drains a long queue? One
// SQLite table in the lease form is filled with -rss-rows rows and drained with 8 workers
// and rowactor's defaults otherwise; the resident set size is read at every tenth of the
// rows settled.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

type rssLine struct {
	Mode    string  `json:"mode"`
	DB      string  `json:"db"`
	Form    string  `json:"form"`
	Workers int     `json:"workers"`
	Rows    int     `json:"rows"`
	Rate    float64 `json:"msgs_per_s"`
	Start   float64 `json:"rss_start_mb"` // after the fill, before Subscribe
	// Min and Max are over the samples at 10%, 20% … 100% of the rows settled.
	Min float64 `json:"rss_min_mb"`
	Max float64 `json:"rss_max_mb"`
	End float64 `json:"rss_end_mb"` // at 100%
	// Growth is from the 10% sample to the end, in percent: the first tenth is warm-up
	// (connections, prepared statements, the heap growing to its working size, and
	// Proto.Actor's process registry, 1024 × 32 maps each allocated when the first
	// delivery actor hashes to it: about 9 MB, filled after some 100,000 deliveries, the
	// first tenth of the default run), and what grows after it is what a long drain keeps
	// growing.
	Growth  float64   `json:"growth_pct"`
	Samples []float64 `json:"rss_mb_by_tenth"`
	// Anon is the anonymous part of each sample (RssAnon: the Go heap, stacks, the
	// runtime's own), the rest being mapped files (the binary, SQLite's WAL index); Live
	// is the Go heap the last garbage collection found live (runtime/metrics
	// /gc/heap/live:bytes, no collection forced), to tell a leak from a heap that is
	// merely larger between collections.
	Anon []float64 `json:"rss_anon_mb_by_tenth"`
	Live []float64 `json:"go_heap_live_mb_by_tenth"`
}

func runRSS(ctx context.Context, cfg config, out *json.Encoder) error {
	tg, err := openSQLite(ctx, cfg.dir)
	if err != nil {
		return fmt.Errorf("open sqlite: %w", err)
	}
	defer tg.close()
	fmt.Fprintf(os.Stderr, "bench: sqlite %s\n", tg.version)
	t := tableFor(dialects.FormLease)
	start := time.Now()
	if err := tg.refill(ctx, t.Table, cfg.rssRows); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	defer tg.drop(ctx, t.Name)
	fmt.Fprintf(os.Stderr, "bench: rss: filled %d rows in %v\n", cfg.rssRows, time.Since(start).Round(time.Millisecond))

	line := rssLine{Mode: "rss", DB: "sqlite", Form: "lease", Workers: growthWorkers, Rows: cfg.rssRows}
	st, err := procStatus("VmRSS")
	if err != nil {
		return err
	}
	line.Start = st[0]

	// The settlement hook counts and, at each tenth, hands the count to the sampler
	// without blocking (the channel holds all ten).
	var (
		settled atomic.Int64
		tenth   = int64(cfg.rssRows / 10)
		marks   = make(chan int64, 10)
		l       = newLatch(cfg.rssRows)
	)
	hook := func(s rowactor.Settlement) {
		if s.Released && s.Err == nil {
			return // given back unstarted (every worker stalled): delivered again
		}
		if s.Err != nil || s.Step != "ack" {
			l.fail(fmt.Errorf("row %d: step %s: %v", s.ID, s.Step, s.Err))
			return
		}
		if n := settled.Add(1); n%tenth == 0 && n/tenth <= 10 {
			marks <- n
		}
		l.settled()
	}
	sampled := make(chan error, 1)
	go func() {
		for range 10 {
			n := <-marks
			st, err := procStatus("VmRSS", "RssAnon")
			if err != nil {
				sampled <- err
				return
			}
			live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
			metrics.Read(live)
			heap := roundTo(float64(live[0].Value.Uint64())/(1<<20), 1)
			line.Samples, line.Anon, line.Live = append(line.Samples, st[0]), append(line.Anon, st[1]), append(line.Live, heap)
			fmt.Fprintf(os.Stderr, "bench: rss sqlite %3d%% %8d rows settled: %6.1f MB (%.1f anonymous; Go heap live %.1f)\n",
				10*len(line.Samples), n, st[0], st[1], heap)
		}
		sampled <- nil
	}()

	b, err := rowactor.New(tg.d, rowactor.WithOnSettled(hook))
	if err != nil {
		return err
	}
	handler := func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		l.begin()
		return rowactor.Ack()
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err = b.Subscribe(wctx, t.Table, "bench", handler, rowactor.Workers(growthWorkers)) // otherwise rowactor's defaults
	var took time.Duration
	if err == nil {
		took, err = l.wait(wctx)
	}
	if _, serr := b.Shutdown(wctx); serr != nil && err == nil {
		err = fmt.Errorf("shutdown: %w", serr)
	}
	if err != nil {
		return err // the sampler may wait for marks that never come; the process ends
	}
	if err := <-sampled; err != nil { // every row settled, so all ten marks were sent
		return err
	}
	if len(line.Samples) != 10 {
		return fmt.Errorf("%d RSS samples of 10", len(line.Samples))
	}
	line.Rate = roundTo(float64(cfg.rssRows)/took.Seconds(), 0)
	line.Min, line.Max = line.Samples[0], line.Samples[0]
	for _, mb := range line.Samples {
		line.Min, line.Max = min(line.Min, mb), max(line.Max, mb)
	}
	line.End = line.Samples[9]
	line.Growth = roundTo(100*(line.End-line.Samples[0])/line.Samples[0], 1)
	fmt.Fprintf(os.Stderr, "bench: rss sqlite %d rows at %.0f msgs/s: %.1f MB at the start, %.1f to %.1f during, %.1f at the end, %+.1f%% after the first tenth (load %s)\n",
		line.Rows, line.Rate, line.Start, line.Min, line.Max, line.End, line.Growth, loadavg())
	return out.Encode(line)
}

// procStatus reads sizes from /proc/self/status (VmRSS, RssAnon, …), in MB, in the
// order asked.
func procStatus(names ...string) ([]float64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(names))
	found := 0
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if i := slices.Index(names, name); ok && i >= 0 {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				return nil, fmt.Errorf("/proc/self/status: %s %q: %w", name, rest, err)
			}
			out[i] = roundTo(kb/1024, 1)
			found++
		}
	}
	if found != len(names) {
		return nil, fmt.Errorf("/proc/self/status lacks one of %q", names)
	}
	return out, nil
}
