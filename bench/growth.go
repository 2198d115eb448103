package main

// -mode growth: does a claim cost more as the table grows? Each case fills a lease table
// with the DDL rowactor.Schema renders, times rowactor draining its first rows (8
// workers, otherwise rowactor's defaults), then times a raw loop's claims on what is left,
// and drops the table undrained. The last case keeps history: a table described with a
// processed_at column, whose acked rows stay, marked, holds many finished rows beside a
// few queued ones; its claims must not walk the finished rows.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

const (
	growthWorkers = 8     // the drain's busy setting
	keptQueued    = 10000 // rows queued beside the finished ones of the kept-history case
)

// claimMeasure says how claim_p99_ms was measured.
const claimMeasure = "raw loop: each ClaimLeases(limit 1) call timed, 8 goroutines each claiming and acking one row at a time (drain.go's rawLease)"

type growthLine struct {
	Mode     string  `json:"mode"`
	DB       string  `json:"db"`
	Form     string  `json:"form"`
	Workers  int     `json:"workers"`
	Queued   int     `json:"queued"`
	Finished int     `json:"finished"`
	Timed    int     `json:"rows_timed"` // rows whose handling the msgs/s window spans
	Rate     float64 `json:"msgs_per_s"`
	Allocs   float64 `json:"allocs_per_msg"`
	CPU      float64 `json:"cpu_us_per_msg"`
	ClaimP50 float64 `json:"claim_p50_ms"`
	ClaimP99 float64 `json:"claim_p99_ms"`
	Claims   int     `json:"claims_timed"`
	ClaimBy  string  `json:"claim_measured_by"`
}

type growthCase struct{ queued, finished int }

func runGrowth(ctx context.Context, cfg config, tg *target, out *json.Encoder) error {
	var cases []growthCase
	for _, n := range cfg.growthSizes {
		cases = append(cases, growthCase{queued: n})
	}
	if cfg.growthFinished > 0 {
		cases = append(cases, growthCase{queued: keptQueued, finished: cfg.growthFinished})
	}
	for _, c := range cases {
		l, err := growthOnce(ctx, cfg, tg, c)
		if err != nil {
			return fmt.Errorf("growth %s, %d queued, %d finished: %w", tg.db, c.queued, c.finished, err)
		}
		fmt.Fprintf(os.Stderr, "bench: growth %s queued=%d finished=%d %8.0f msgs/s %6.1f allocs/msg %5.0f µs CPU/msg, claim p50 %.2f p99 %.2f ms (load %s)\n",
			l.DB, l.Queued, l.Finished, l.Rate, l.Allocs, l.CPU, l.ClaimP50, l.ClaimP99, loadavg())
		if err := out.Encode(l); err != nil {
			return err
		}
	}
	return nil
}

func growthOnce(ctx context.Context, cfg config, tg *target, c growthCase) (growthLine, error) {
	t := tableFor(dialects.FormLease).Table
	if c.finished > 0 {
		t.Name = fmt.Sprintf("bench_kept_%d", os.Getpid())
		t.ProcessedAt = "processed_at"
	}
	start := time.Now()
	ddl, err := tg.create(ctx, t)
	if err != nil {
		return growthLine{}, err
	}
	defer tg.drop(ctx, t.Name)
	fmt.Fprintf(os.Stderr, "bench: growth %s %s: claim index %s\n", tg.db, t.Name, indexDDL(ddl))
	if c.finished > 0 {
		// Finished rows, as acks leave them in a table that keeps history: any non-NULL
		// processed_at takes a row out of the claim (CURRENT_TIMESTAMP is one on every
		// database, whatever the column's type).
		if err := tg.fill(ctx, t.Name, c.finished); err != nil {
			return growthLine{}, err
		}
		if err := tg.exec(ctx, "UPDATE "+t.Name+" SET processed_at = CURRENT_TIMESTAMP"); err != nil {
			return growthLine{}, err
		}
	}
	if err := tg.fill(ctx, t.Name, c.queued); err != nil {
		return growthLine{}, err
	}
	if err := tg.settle(ctx, t.Name); err != nil {
		return growthLine{}, err
	}
	if n, err := queued(ctx, tg, t); err != nil || n != c.queued {
		return growthLine{}, fmt.Errorf("filled %d queued rows of %d: %v", n, c.queued, err)
	}
	fmt.Fprintf(os.Stderr, "bench: growth %s %s: filled %d rows in %v\n", tg.db, t.Name, c.queued+c.finished, time.Since(start).Round(time.Millisecond))

	// rowactor drains the first rows; the rest stay queued. Shutdown lets the rows in
	// work settle and gives back those claimed but not started.
	line := growthLine{Mode: "growth", DB: tg.db, Form: "lease", Workers: growthWorkers, Queued: c.queued, Finished: c.finished, ClaimBy: claimMeasure}
	line.Timed = min(cfg.growthN, c.queued)
	runtime.GC()
	r, _, err := runRowactor(ctx, tg, tableDesc{t}, growthWorkers, line.Timed, false)
	if err != nil {
		return line, err
	}
	line.Rate, line.Allocs, line.CPU = roundTo(r.rate(), 0), roundTo(r.allocsPerMsg(), 1), roundTo(r.cpuPerMsg(), 1)

	// Then the raw loop's claims on what is left, as many as the timed rows.
	left, err := queued(ctx, tg, t)
	if err != nil {
		return line, err
	}
	took, err := timeClaims(ctx, tg, t, min(cfg.growthN, left))
	if err != nil {
		return line, err
	}
	slices.Sort(took)
	line.Claims, line.ClaimP50, line.ClaimP99 = len(took), ms(percentile(took, 50)), ms(percentile(took, 99))
	return line, nil
}

// queued counts the rows a claim could take: all of them, less the finished ones of a
// table that keeps history.
func queued(ctx context.Context, tg *target, t rowactor.Table) (int, error) {
	q := "SELECT count(*) FROM " + t.Name
	if t.ProcessedAt != "" {
		q += " WHERE " + t.ProcessedAt + " IS NULL"
	}
	n, err := tg.query(ctx, q)
	return int(n), err
}

// indexDDL picks the index statements (PostgreSQL, SQLite) or clauses (MySQL) out of
// rowactor.Schema's DDL.
func indexDDL(ddl string) string {
	var idx []string
	for _, line := range strings.Split(ddl, "\n") {
		if line = strings.TrimSpace(line); strings.Contains(line, "INDEX ") {
			idx = append(idx, strings.TrimSuffix(line, ";"))
		}
	}
	if len(idx) == 0 {
		return "none: the primary key serves the claim (rowactor.Schema renders an index only for a group or processed_at column)"
	}
	return strings.Join(idx, "; ")
}

// timeClaims runs drain.go's raw lease loop on growthWorkers goroutines for n claims,
// timing each ClaimLeases call. The loops end when the claims are spent or a claim finds
// nothing (rows still leased by a loop at the very end); rows past them stay queued.
func timeClaims(ctx context.Context, tg *target, t rowactor.Table, n int) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	q, err := tg.d.Open(ctx, dialects.QueueSpec{Table: t})
	if err != nil {
		return nil, err
	}
	defer q.Close()
	tq := &timedClaims{LeaseQueue: q.(dialects.LeaseQueue)}
	tq.left.Store(int64(n))
	l := newLatch(n) // counted by rawLease, never waited for
	var (
		wg   sync.WaitGroup
		errs = make([]error, growthWorkers)
	)
	for i := range growthWorkers {
		wg.Go(func() { _, errs[i] = rawLease(ctx, tq, tg.costs, l) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return tq.took, nil
}

// timedClaims is a lease queue whose claims are timed and counted down: once they are
// spent it answers that nothing is due, which ends rawLease.
type timedClaims struct {
	dialects.LeaseQueue
	left atomic.Int64
	mu   sync.Mutex
	took []time.Duration
}

func (q *timedClaims) ClaimLeases(ctx context.Context, now, until time.Time, limit int) ([]dialects.Row, error) {
	if q.left.Add(-1) < 0 {
		return nil, nil
	}
	start := time.Now()
	rows, err := q.LeaseQueue.ClaimLeases(ctx, now, until, limit)
	d := time.Since(start)
	if err == nil {
		q.mu.Lock()
		q.took = append(q.took, d)
		q.mu.Unlock()
	}
	return rows, err
}
