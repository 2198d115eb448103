package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/rowactortest"
)

func init() {
	scenarios = append(scenarios,
		scenario{
			name:   "a periodic job run by two brokers publishes each second once, finds its newest run by an index, and publishes a missed run once",
			forms:  []rowactor.Form{rowactor.FormLease},
			shapes: []tableShape{withUniqueKey, withProcessedAt},
			run:    periodicScenario,
		},
		scenario{
			name:   "a periodic job on a table that cannot keep its runs apart is refused before it starts",
			forms:  []rowactor.Form{rowactor.FormLease},
			shapes: []tableShape{withUniqueKey, withProcessedAt},
			run:    periodicRefusedScenario,
		},
	)
}

// keyTime is how a run's time is written in its unique key.
const keyTime = "2006-01-02T15:04:05Z"

// runsOf counts the rows of each second in [from, to] under the job's name, and checks
// that each holds its time as payload.
func (h *harness) runsOf(name string, from, to time.Time) map[time.Time]int {
	h.t.Helper()
	runs := map[time.Time]int{}
	for s := from.Truncate(time.Second); !s.After(to); s = s.Add(time.Second) {
		key := name + "@" + s.UTC().Format(keyTime)
		if n := h.drv.count(h.t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE unique_key = ?", h.table.Name), key); n > 0 {
			runs[s] = n
		}
	}
	return runs
}

// wantEverySecond fails unless runs holds one row for every second from its first to
// its last, and at least min of them.
func wantEverySecond(t *testing.T, runs map[time.Time]int, least int) (first, last time.Time) {
	t.Helper()
	for s := range runs {
		if first.IsZero() || s.Before(first) {
			first = s
		}
		if s.After(last) {
			last = s
		}
	}
	if len(runs) < least {
		t.Fatalf("%d runs, want at least %d: %v", len(runs), least, runs)
	}
	for s := first; !s.After(last); s = s.Add(time.Second) {
		if runs[s] != 1 {
			t.Fatalf("the run of %s has %d rows, want 1 (runs %s to %s)", s.Format(keyTime), runs[s], first.Format(keyTime), last.Format(keyTime))
		}
	}
	return first, last
}

func periodicScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b1, b2 := h.broker(), h.second()
	payload := func(_ context.Context, at time.Time) ([]byte, error) { return []byte(at.UTC().Format(keyTime)), nil }
	start := time.Now()
	p1, err := b1.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), payload, rowactor.PeriodicName("tick"))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := b2.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), payload, rowactor.PeriodicName("tick"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3500 * time.Millisecond)
	p1.Stop()
	p2.Stop()
	end := time.Now()
	runs := h.runsOf("tick", start.Add(-time.Second), end.Add(time.Second))
	first, last := wantEverySecond(t, runs, 3)
	if first.Before(start) || last.After(end) {
		t.Fatalf("runs from %v to %v, outside the time the job ran (%v to %v)", first, last, start, end)
	}
	total := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name))
	if total != len(runs) || p1.Published()+p2.Published() != int64(total) {
		t.Fatalf("%d rows, %d runs, published %d + %d", total, len(runs), p1.Published(), p2.Published())
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE unique_key = ? AND payload = ?", h.table.Name),
		"tick@"+first.UTC().Format(keyTime), []byte(first.UTC().Format(keyTime))); n != 1 {
		t.Fatal("the first run's payload is not payload(its time)")
	}

	// The newest run is found through the unique index, read in its order, among 10,000
	// rows of other keys.
	for first := 0; first < 10000; first += 500 {
		vals, args := make([]string, 0, 500), make([]any, 0, 1000)
		for i := range 500 {
			vals = append(vals, "(?, ?, ?)")
			args = append(args, h.queue, []byte("x"), fmt.Sprintf("job-%05d", first+i))
		}
		h.exec(fmt.Sprintf("INSERT INTO %s (grp, payload, unique_key) VALUES %s", h.table.Name, strings.Join(vals, ", ")), args...)
	}
	q := fmt.Sprintf("SELECT unique_key FROM %s WHERE unique_key >= ? AND unique_key < ? ORDER BY unique_key DESC LIMIT 1", h.table.Name)
	if sorts, plan := h.drv.sorts(t, h.d, h.table.Name, q, "tick@", "tickA"); sorts {
		t.Fatalf("the newest run's read sorts the rows instead of reading the unique index:\n%s", plan)
	}

	// Runs missed while no broker ran the job: the latest of them is published once, at
	// once, and runs are finished rows too.
	h.exec(fmt.Sprintf("UPDATE %s SET processed_at = ?", h.table.Name), h.drv.timeValue(time.Now()))
	old := time.Now().Add(-3 * time.Hour).Truncate(time.Hour)
	h.exec(fmt.Sprintf("INSERT INTO %s (grp, payload, unique_key, processed_at) VALUES (?, ?, ?, ?)", h.table.Name),
		h.queue, []byte("old"), "hourly@"+old.UTC().Format(keyTime), h.drv.timeValue(old))
	hourly := func(opts ...rowactor.PeriodicOption) *rowactor.PeriodicJob {
		p, err := b1.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), payload, append(opts, rowactor.PeriodicName("hourly"))...)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	skip := hourly(rowactor.SkipMissed())
	time.Sleep(300 * time.Millisecond)
	skip.Stop()
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE unique_key LIKE 'hourly@%%'", h.table.Name)); n != 1 || skip.Published() != 0 {
		t.Fatalf("SkipMissed published missed runs: %d rows", n)
	}
	p := hourly()
	missed := time.Now().Truncate(time.Hour)
	waitUntil(t, "the missed run", func() bool { return p.Published() == 1 })
	p.Stop()
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE unique_key LIKE 'hourly@%%'", h.table.Name)); n != 2 ||
		h.countKey("hourly@"+missed.UTC().Format(keyTime)) != 1 {
		t.Fatalf("after a 3 hour gap: %d hourly rows, want the old one and the latest missed run (%s)", n, missed.Format(keyTime))
	}
	// Started again, the job finds that run and publishes nothing.
	again := hourly()
	time.Sleep(300 * time.Millisecond)
	again.Stop()
	if again.Published() != 0 {
		t.Fatal("a run already published was published again")
	}
}

func periodicRefusedScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	payload := func(context.Context, time.Time) ([]byte, error) { return nil, nil }
	bad := []struct {
		name   string
		edit   func(*rowactor.Table)
		sched  rowactor.Schedule
		pay    rowactor.PeriodicPayload
		option string
	}{
		{"no unique key column", func(t *rowactor.Table) { t.UniqueKey = "" }, rowactor.Every(time.Second), payload, "Table.UniqueKey"},
		{"no processed_at", func(t *rowactor.Table) { t.ProcessedAt = "" }, rowactor.Every(time.Second), payload, "Table.ProcessedAt"},
		{"keys cleared at the ack", func(t *rowactor.Table) { t.ClearUniqueKeyAtAck = true }, rowactor.Every(time.Second), payload, "Table.ClearUniqueKeyAtAck"},
		{"part of a second", func(*rowactor.Table) {}, rowactor.Every(1500 * time.Millisecond), payload, "Every"},
		{"no payload", func(*rowactor.Table) {}, rowactor.Every(time.Second), nil, "Periodic"},
		{"no schedule", func(*rowactor.Table) {}, nil, payload, "Periodic"},
		{"a column the table lacks", func(t *rowactor.Table) { t.UniqueKey = "no_such_column" }, rowactor.Every(time.Second), payload, ""},
	}
	for _, c := range bad {
		tb := h.table
		c.edit(&tb)
		_, err := b.Periodic(ctx, tb, h.queue, c.sched, c.pay)
		var ce *rowactor.ConfigError
		if !errors.As(err, &ce) || (c.option != "" && ce.Option != c.option) {
			t.Errorf("%s: %v, want a *ConfigError of %q", c.name, err, c.option)
		}
	}
	if _, err := rowactor.Cron("61 * * * *"); err == nil {
		t.Error("a cron expression with minute 61 was accepted")
	}
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), payload)
	if err != nil {
		t.Fatal(err)
	}
	var ce *rowactor.ConfigError
	if _, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), payload); !errors.As(err, &ce) || ce.Option != "PeriodicName" {
		t.Fatalf("a second job of the same name on one broker: %v", err)
	}
	p.Stop()
	if _, err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), payload); !errors.Is(err, rowactor.ErrClosed) {
		t.Fatalf("Periodic after Shutdown: %v", err)
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != 0 {
		t.Fatalf("%d rows written by refused jobs", n)
	}
}

func init() {
	scenarios = append(scenarios, scenario{
		name:   "three periodic jobs on a pool of two connections each publish their runs",
		forms:  []rowactor.Form{rowactor.FormLease},
		shapes: []tableShape{withUniqueKey, withProcessedAt},
		run:    periodicSmallPoolScenario,
	})
}

// periodicSmallPoolScenario: a round reads and publishes on its lock's own connection, so
// jobs whose rounds come at the same second do not wait for each other's connections
// (PostgreSQL's broker listens on one of the two).
func periodicSmallPoolScenario(t *testing.T, h *harness, _ rowactor.Form) {
	d, ok := sizedDialect(t, h, 2)
	if !ok {
		t.Skip("SQLite's lock holds no connection")
	}
	ctx := context.Background()
	b := h.brokerOn(d)
	var jobs []*rowactor.PeriodicJob
	for _, name := range []string{"a", "b", "c"} {
		p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), func(context.Context, time.Time) ([]byte, error) { return []byte(name), nil },
			rowactor.PeriodicName(name))
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, p)
	}
	waitUntil(t, "two runs of each job", func() bool {
		for _, p := range jobs {
			if p.Published() < 2 {
				return false
			}
		}
		return true
	})
	for _, p := range jobs {
		p.Stop()
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := b.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
}

func init() {
	scenarios = append(scenarios, scenario{
		name:   "a failed round of an hourly job is tried again within seconds, with a growing wait, not an hour later",
		forms:  []rowactor.Form{rowactor.FormLease},
		shapes: []tableShape{withUniqueKey, withProcessedAt},
		run:    periodicRetryScenario,
	})
}

// periodicRetryScenario: the run of three o'clock fails twice (the payload function's
// error stands for a database out of reach too). It is published as itself seconds later,
// while it is due: SkipMissed does not drop it. A job that keeps failing is not tried in a
// hot loop.
func periodicRetryScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	clock := rowactortest.NewClock()
	b := h.broker(rowactor.WithClock(clock))
	var calls atomic.Int32
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), func(_ context.Context, at time.Time) ([]byte, error) {
		if calls.Add(1) <= 2 {
			return nil, errors.New("the report service is down")
		}
		return []byte(at.UTC().Format(keyTime)), nil
	}, rowactor.PeriodicName("report"), rowactor.SkipMissed())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	time.Sleep(200 * time.Millisecond)
	run := clock.Now().Truncate(time.Hour).Add(time.Hour)
	clock.Advance(run.Sub(clock.Now()) + time.Second)
	waitUntil(t, "the run of the hour after two failures", func() bool { return p.Published() == 1 })
	if got := calls.Load(); got != 3 {
		t.Fatalf("the payload function was called %d times, want 3 (two failures, then the run)", got)
	}
	if n := h.countKey("report@" + run.UTC().Format(keyTime)); n != 1 {
		t.Fatalf("%d rows of the run of %s, want 1", n, run.Format(keyTime))
	}

	var failing atomic.Int32
	q, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), func(context.Context, time.Time) ([]byte, error) {
		failing.Add(1)
		return nil, errors.New("down for good")
	}, rowactor.PeriodicName("broken"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	run = run.Add(time.Hour)
	clock.Advance(run.Sub(clock.Now()) + time.Second)
	time.Sleep(3500 * time.Millisecond) // tries at 0, 1 and 3 s
	q.Stop()
	if n := failing.Load(); n < 2 || n > 3 {
		t.Fatalf("a job that keeps failing was tried %d times in 3.5 s, want 3 (waits of 1 s, then 2 s)", n)
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE unique_key LIKE 'broken@%%'", h.table.Name)); n != 0 {
		t.Fatalf("%d rows of a job whose payload always fails", n)
	}
}
