package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/rowactortest"
)

// periodicForms and periodicShapes are what the periodic scenarios run on: the lease form,
// on a table with a unique key and processed_at.
var (
	periodicForms  = []rowactor.Form{rowactor.FormLease}
	periodicShapes = []tableShape{withUniqueKey, withProcessedAt}
)

var periodicScenarios = []scenario{
	{
		name:   "a periodic job run by two brokers publishes each second once, finds its newest run by an index, and publishes a missed run once",
		forms:  periodicForms,
		shapes: periodicShapes,
		run:    periodicScenario,
	},
	{
		name:   "a periodic job on a table that cannot keep its runs apart is refused before it starts",
		forms:  periodicForms,
		shapes: periodicShapes,
		run:    periodicRefusedScenario,
	},
	{
		name:   "three periodic jobs on a pool of two connections each publish their runs",
		forms:  periodicForms,
		shapes: periodicShapes,
		run:    periodicSmallPoolScenario,
	},
	{
		name:   "a failed round of an hourly job is tried again within seconds, with a growing wait, not an hour later",
		forms:  periodicForms,
		shapes: periodicShapes,
		run:    periodicRetryScenario,
	},
	{
		name:   "a periodic job wakes for a clock jump made while its round runs",
		forms:  periodicForms,
		shapes: periodicShapes,
		run:    periodicJumpDuringRoundScenario,
	},
	{
		name:   "a broker started after a periodic run, waiting in line behind a holder that dies, publishes that run and the later ones as themselves",
		forms:  periodicForms,
		shapes: periodicShapes,
		run:    periodicLateTakeoverScenario,
	},
	{
		name:   "brokers started together after an outage publish the runs missed before them once, when the first leader's round is given up",
		forms:  periodicForms,
		shapes: periodicShapes,
		run:    periodicOutageTakeoverScenario,
	},
	{
		name:   "a broker in line behind a holder that hangs past its wait and then dies publishes the hourly run",
		forms:  periodicForms,
		shapes: periodicShapes,
		run:    periodicLongHangTakeoverScenario,
	},
	{name: "two periodic jobs on a pool of two connections both keep publishing", forms: periodicForms, shapes: periodicShapes, run: periodicTwoJobsOnASmallPoolScenario},
	{name: "a periodic job beside a subscription and a retention on a pool of two connections publishes runs that are handled", forms: periodicForms, shapes: periodicShapes, run: periodicBesideSubscriptionAndRetentionScenario},
	{name: "a periodic job publishes at most one run for those missed in a short outage, none with SkipMissed", forms: periodicForms, shapes: periodicShapes, run: periodicShortOutageScenario},
	{name: "Shutdown returns within its context while a periodic payload runs", forms: periodicForms, shapes: periodicShapes, run: periodicShutdownBoundedByContextScenario},
	{name: "a periodic run moved to a dead letter table is not published again", forms: periodicForms, shapes: periodicShapes, run: periodicDeadLetterTableScenario},
	{name: "the query for a periodic job's newest run reads the unique index without a sort", forms: periodicForms, shapes: periodicShapes, run: periodicNewestKeyQueryScenario},
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
	// Both brokers go by one clock, which jumps a second at a time instead of the test
	// waiting for each second: both look for the run at each jump, at once.
	clock := rowactortest.NewClock()
	b1, b2 := h.broker(rowactor.WithClock(clock)), h.second(rowactor.WithClock(clock))
	payload := func(_ context.Context, at time.Time) ([]byte, error) { return []byte(at.UTC().Format(keyTime)), nil }
	start := clock.Now()
	p1, err := b1.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), payload, rowactor.PeriodicName("tick"))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := b2.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), payload, rowactor.PeriodicName("tick"))
	if err != nil {
		t.Fatal(err)
	}
	stepSeconds(clock, 4, func(step int) bool { return p1.Published()+p2.Published() >= int64(step) })
	p1.Stop()
	p2.Stop()
	end := clock.Now()
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
	h.exec(fmt.Sprintf("UPDATE %s SET processed_at = ?", h.table.Name), h.drv.timeValue(clock.Now()))
	old := clock.Now().Add(-3 * time.Hour).Truncate(time.Hour)
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
	missed := clock.Now().Truncate(time.Hour)
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
	// A job that keeps failing runs beside it, from the same hour: its tries are not a
	// hot loop.
	var failing atomic.Int32
	q, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), func(context.Context, time.Time) ([]byte, error) {
		failing.Add(1)
		return nil, errors.New("down for good")
	}, rowactor.PeriodicName("broken"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	run := clock.Now().Truncate(time.Hour).Add(time.Hour)
	clock.Advance(run.Sub(clock.Now()) + time.Second)
	time.Sleep(3500 * time.Millisecond) // the broken job's tries at 0, 1 and 3 s
	q.Stop()
	tries := failing.Load()
	waitUntil(t, "the run of the hour after two failures", func() bool { return p.Published() == 1 })
	if got := calls.Load(); got != 3 {
		t.Fatalf("the payload function was called %d times, want 3 (two failures, then the run)", got)
	}
	if n := h.countKey("report@" + run.UTC().Format(keyTime)); n != 1 {
		t.Fatalf("%d rows of the run of %s, want 1", n, run.Format(keyTime))
	}
	if n := tries; n < 2 || n > 3 {
		t.Fatalf("a job that keeps failing was tried %d times in 3.5 s, want 3 (waits of 1 s, then 2 s)", n)
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE unique_key LIKE 'broken@%%'", h.table.Name)); n != 0 {
		t.Fatalf("%d rows of a job whose payload always fails", n)
	}
}

// stuckPeriodic is a periodic job whose payload function is running, and ignores its
// context, when startStuckPeriodic returns: the "periodic payload running during
// Shutdown" situation. Its round holds the job's election lock (and, on PostgreSQL and
// MySQL, a pool connection in a transaction) until rowactor gives the round up.
type stuckPeriodic struct {
	h    *harness
	job  *rowactor.PeriodicJob
	name string
	// returned is closed when the payload function returned (release, or the test's end).
	returned chan struct{}
	release  func()
}

// startStuckPeriodic starts, on b (from New or Open, over h's database), an Every(1s)
// job whose first payload blocks, whatever its context says, until release is called (at
// the test's end at the latest); during, when not nil, runs inside that payload first
// (a payload that calls Shutdown itself, say). It returns once the payload runs.
func startStuckPeriodic(t *testing.T, h *harness, b *rowactor.Broker, during func()) *stuckPeriodic {
	t.Helper()
	s := &stuckPeriodic{h: h, name: "stuck", returned: make(chan struct{})}
	entered, unblock := make(chan struct{}), make(chan struct{})
	var once, released sync.Once
	s.release = func() { released.Do(func() { close(unblock) }) }
	t.Cleanup(s.release)
	job, err := b.Periodic(context.Background(), h.table, h.queue, rowactor.Every(time.Second), func(_ context.Context, at time.Time) ([]byte, error) {
		first := false
		once.Do(func() { first = true })
		if !first {
			return []byte(at.UTC().Format(keyTime)), nil
		}
		defer close(s.returned)
		close(entered)
		if during != nil {
			during()
		}
		<-unblock // ignores ctx on purpose
		return []byte(at.UTC().Format(keyTime)), nil
	}, rowactor.PeriodicName(s.name))
	if err != nil {
		t.Fatal(err)
	}
	s.job = job
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the periodic payload function was never called")
	}
	return s
}

// lock is the stuck job's election lock, as the dialects name it.
func (s *stuckPeriodic) lock() string { return "periodic:" + s.h.table.Name + ":" + s.name }

// assertLetGo fails unless nothing of the stuck job's round is held on the database: the
// lock is free to another session (PostgreSQL's advisory key, MySQL's GET_LOCK, SQLite's
// registry of this process), pg_locks / IS_USED_LOCK show no holder, and no row of the
// job was published.
func (s *stuckPeriodic) assertLetGo(t *testing.T) {
	t.Helper()
	if s.h.drv.keyLocked != nil && s.h.drv.keyLocked(t, s.h.d, dialects.LockKey(s.lock())) {
		t.Error("the periodic job's election lock is still held on the server")
	}
	el := s.h.d.(dialects.Elector)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	led, err := el.Elect(ctx, s.lock(), 0, func(context.Context, any) error { return nil })
	if err != nil || !led {
		t.Errorf("another session could not take the periodic job's election lock at once (led %v, err %v)", led, err)
	}
	if n := s.h.drv.count(t, s.h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE unique_key LIKE 'stuck@%%'", s.h.table.Name)); n != 0 {
		t.Errorf("%d runs of the stuck job published, want none (its round was given up)", n)
	}
}

// TestShutdownReturnsWhileAPeriodicPayloadRuns: a periodic job's payload function ignores
// its context; Shutdown with a 1 s context returns within 3 s, on a broker from Open (which
// closes its own pool) and from New, and afterwards the round's lock and transaction are
// gone. A payload that calls Shutdown itself (2 s context) gets it back within 4 s.
func TestShutdownReturnsWhileAPeriodicPayloadRuns(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			for _, from := range []string{"Open", "New"} {
				newBroker := func(t *testing.T, h *harness) *rowactor.Broker {
					if from == "New" {
						return h.broker()
					}
					b, err := rowactor.Open(context.Background(), drv.url(t, h.d))
					if err != nil {
						t.Fatal(err)
					}
					shutdownAtCleanup(t, b)
					return b
				}
				t.Run(from+"/from outside", func(t *testing.T) {
					h := newHarness(t, drv, rowactor.FormLease, withUniqueKey, withProcessedAt)
					b := newBroker(t, h)
					s := startStuckPeriodic(t, h, b, nil)
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					defer cancel()
					start := time.Now()
					done := make(chan error, 1)
					go func() { _, err := b.Shutdown(ctx); done <- err }()
					select {
					case err := <-done:
						if took := time.Since(start); took > 3*time.Second {
							t.Errorf("Shutdown with a 1 s context took %v while a periodic payload ran", took.Round(100*time.Millisecond))
						}
						if err != nil {
							t.Errorf("Shutdown: %v", err)
						}
					case <-time.After(20 * time.Second):
						s.release()
						t.Fatal("Shutdown with a 1 s context had not returned 20 s later while a periodic payload ran")
					}
					s.assertLetGo(t)
					if s.job.Leading() {
						t.Error("the job still says it leads after Shutdown")
					}
				})
				t.Run(from+"/from the payload", func(t *testing.T) {
					h := newHarness(t, drv, rowactor.FormLease, withUniqueKey, withProcessedAt)
					b := newBroker(t, h)
					type result struct {
						took time.Duration
						err  error
					}
					got := make(chan result, 1)
					s := startStuckPeriodic(t, h, b, func() {
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
						defer cancel()
						start := time.Now()
						_, err := b.Shutdown(ctx)
						got <- result{time.Since(start), err}
					})
					select {
					case r := <-got:
						if r.took > 4*time.Second {
							t.Errorf("Shutdown from a periodic payload with a 2 s context took %v", r.took.Round(100*time.Millisecond))
						}
						if r.err != nil {
							t.Errorf("Shutdown from a periodic payload: %v", r.err)
						}
					case <-time.After(20 * time.Second):
						s.release()
						t.Fatal("Shutdown called from a periodic payload with a 2 s context had not returned 20 s later (deadlock)")
					}
					s.assertLetGo(t)
				})
			}
		})
	}
}

// periodicJumpDuringRoundScenario: an hourly job on a broker going by a test clock. The
// clock jumps to the next hour; while that run's payload is being made, it jumps an hour
// more. The round in progress read its now before the second jump, so the job must wake
// for it after the round, not sleep the hour it measured from the old time.
func periodicJumpDuringRoundScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	clock := rowactortest.NewClock()
	b := h.broker(rowactor.WithClock(clock))
	entered, jumped := make(chan time.Time, 4), make(chan struct{})
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), func(_ context.Context, at time.Time) ([]byte, error) {
		entered <- at
		<-jumped
		return []byte(at.UTC().Format(keyTime)), nil
	}, rowactor.PeriodicName("hourly"), rowactor.SkipMissed())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	waitUntil(t, "the job's first round (nothing due)", p.Leading)
	first := clock.Now().Truncate(time.Hour).Add(time.Hour)
	clock.Advance(first.Sub(clock.Now()) + time.Second)
	select {
	case at := <-entered:
		if !at.Equal(first) {
			t.Fatalf("the payload was made for %s, want the run of %s", at.Format(keyTime), first.Format(keyTime))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not wake for the clock's jump to the next hour")
	}
	second := first.Add(time.Hour)
	clock.Advance(second.Sub(clock.Now()) + time.Second) // while the round of first runs
	close(jumped)
	waitUntil(t, "the run of the hour the clock jumped to during the previous round", func() bool { return p.Published() == 2 })
	for _, run := range []time.Time{first, second} {
		if n := h.countKey("hourly@" + run.UTC().Format(keyTime)); n != 1 {
			t.Errorf("the run of %s has %d rows, want 1", run.Format(keyTime), n)
		}
	}
}

// periodicLateTakeoverScenario, a rolling deploy: broker a runs an Every(2s) job and
// publishes a run; its payload for the next run, T, hangs, holding the job's lock. Broker
// b (SkipMissed) starts 4.5 s after T, finds the lock held and waits in line; then a dies
// holding it (its session killed; on SQLite, whose lock is in the process, a's job
// stopped mid-round). The job ran all along, so no run was missed: b publishes T, T+2 and
// T+4 as themselves, once each.
func periodicLateTakeoverScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	// b logs its rounds (Debug): a round that did not lead tried the lock while a held it.
	bLog := &syncBuffer{}
	// Both go by one clock, which jumps to a's first run, to T and to T+4.5 s instead of
	// the test waiting for them; it keeps the machine's pace between the jumps.
	clock := rowactortest.NewClock()
	a := h.broker(rowactor.WithClock(clock))
	b := h.brokerOn(h.newD(), rowactor.WithClock(clock), rowactor.WithLogger(slog.New(slog.NewTextHandler(bLog, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	toNextRun := func() { // a jump to 100 ms past the next run of Every(2s)
		now := clock.Now()
		clock.Advance(now.Truncate(2 * time.Second).Add(2100 * time.Millisecond).Sub(now))
	}
	var hold atomic.Bool
	held := make(chan time.Time, 1)
	unblock := make(chan struct{})
	defer close(unblock)
	pa, err := a.Periodic(ctx, h.table, h.queue, rowactor.Every(2*time.Second), func(_ context.Context, at time.Time) ([]byte, error) {
		if hold.Load() {
			select {
			case held <- at:
			default:
			}
			<-unblock // a hangs here until it dies
		}
		return []byte(at.UTC().Format(keyTime)), nil
	}, rowactor.PeriodicName("tick"))
	if err != nil {
		t.Fatal(err)
	}
	toNextRun()
	waitUntil(t, "broker a to publish a run", func() bool { return pa.Published() >= 1 })
	hold.Store(true)
	toNextRun()
	var run time.Time // T
	select {
	case run = <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("broker a made no payload after its first run")
	}
	if n := h.countKey("tick@" + run.Add(-2*time.Second).UTC().Format(keyTime)); n != 1 {
		t.Fatalf("the run before T has %d rows, want 1 (a published it)", n)
	}
	if ahead := run.Add(4500 * time.Millisecond).Sub(clock.Now()); ahead > 0 {
		clock.Advance(ahead)
	}
	pb, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(2*time.Second), func(_ context.Context, at time.Time) ([]byte, error) {
		return []byte(at.UTC().Format(keyTime)), nil
	}, rowactor.PeriodicName("tick"), rowactor.SkipMissed())
	if err != nil {
		t.Fatal(err)
	}
	lock := "periodic:" + h.table.Name + ":tick"
	waitUntil(t, "broker b to wait in line behind a", func() bool { return strings.Contains(bLog.String(), "led=false") })
	if h.drv.keyLocked != nil {
		holder := lockHolder(t, h, lock)
		if holder == "" {
			t.Fatal("nobody holds the job's lock while a's round hangs")
		}
		killSession(t, h, holder)
	} else {
		pa.Stop() // gives the hanging round up, publishing nothing, and lets the lock go
	}
	for _, r := range []time.Time{run, run.Add(2 * time.Second), run.Add(4 * time.Second)} {
		key := "tick@" + r.UTC().Format(keyTime)
		waitUntil(t, fmt.Sprintf("broker b to publish the run of T+%v", r.Sub(run)), func() bool { return h.countKey(key) >= 1 })
	}
	pb.Stop()
	for r := run.Add(-2 * time.Second); !r.After(run.Add(4 * time.Second)); r = r.Add(2 * time.Second) {
		if n := h.countKey("tick@" + r.UTC().Format(keyTime)); n != 1 {
			t.Errorf("the run of %s has %d rows, want 1", r.Format(keyTime), n)
		}
	}
}

// TestCronOnDSTDays pins what robfig/cron's parser, read through Cron, does on the days a
// zone changes its clocks (docs/periodic.md, "Daylight saving time"): in New York a daily
// job at 01:30 runs twice on the autumn change (01:30 EDT and, an hour later, 01:30 EST),
// and a daily job at 02:30 does not run on the spring change (02:00-02:59 does not exist);
// an hourly job runs once each real hour; the same jobs in UTC run once a day.
func TestCronOnDSTDays(t *testing.T) {
	t.Parallel()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skipf("no zone database: %v", err)
	}
	runs := func(expr string, from, to time.Time) []string {
		t.Helper()
		s, err := rowactor.Cron(expr)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for run := s.Next(from); !run.IsZero() && run.Before(to); run = s.Next(run) {
			out = append(out, run.UTC().Format(keyTime))
		}
		return out
	}
	day := func(y int, m time.Month, d int) (time.Time, time.Time) {
		from := time.Date(y, m, d, 0, 0, 0, 0, ny)
		return from, from.AddDate(0, 0, 1)
	}
	autumn, autumnEnd := day(2026, time.November, 1) // 02:00 EDT becomes 01:00 EST
	spring, springEnd := day(2026, time.March, 8)    // 02:00 EST becomes 03:00 EDT
	cases := []struct {
		name, expr string
		from, to   time.Time
		want       []string
	}{
		{"01:30 New York, autumn: twice", "CRON_TZ=America/New_York 30 1 * * *", autumn, autumnEnd,
			[]string{"2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"}},
		{"02:30 New York, spring: never", "CRON_TZ=America/New_York 30 2 * * *", spring, springEnd, nil},
		{"02:30 New York, the day after the spring change", "CRON_TZ=America/New_York 30 2 * * *", springEnd, springEnd.AddDate(0, 0, 1),
			[]string{"2026-03-09T06:30:00Z"}},
		{"01:30 New York, spring: once", "CRON_TZ=America/New_York 30 1 * * *", spring, springEnd, []string{"2026-03-08T06:30:00Z"}},
		{"hourly New York, autumn: 25 real hours, 25 runs", "CRON_TZ=America/New_York 0 * * * *", autumn, autumnEnd, nil},
		{"hourly New York, spring: 23 real hours, 23 runs", "CRON_TZ=America/New_York 0 * * * *", spring, springEnd, nil},
		{"06:30 UTC on the autumn change: once", "CRON_TZ=UTC 30 6 * * *", autumn, autumnEnd, []string{"2026-11-01T06:30:00Z"}},
		{"07:30 UTC on the spring change: once", "CRON_TZ=UTC 30 7 * * *", spring, springEnd, []string{"2026-03-08T07:30:00Z"}},
	}
	for _, c := range cases {
		got := runs(c.expr, c.from.Add(-time.Nanosecond), c.to)
		if strings.HasPrefix(c.name, "hourly") {
			hours := int(c.to.Sub(c.from) / time.Hour)
			if len(got) != hours {
				t.Errorf("%s: %d runs, want %d: %v", c.name, len(got), hours, got)
			}
			for i := 1; i < len(got); i++ {
				a, _ := time.Parse(keyTime, got[i-1])
				b, _ := time.Parse(keyTime, got[i])
				if b.Sub(a) != time.Hour {
					t.Errorf("%s: %s then %s, want an hour apart", c.name, got[i-1], got[i])
				}
			}
			continue
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// periodicOutageTakeoverScenario, a restart after an outage: an Every(2s) job's newest
// run is ten minutes old (every process running it was down since). Brokers a and b
// start it together; a leads the first round, whose payload (the latest missed run)
// hangs, and b waits in line; then a's round is given up (a stops). Nobody ran the job
// during the outage, so its runs before a and b started were missed: docs/periodic.md
// ("The other runs were missed while no broker ran the job: the latest of them is
// published once") wants one of them published, the latest. b must not publish the
// outage's last minute run by run because it once found a holding the lock.
func periodicOutageTakeoverScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	bLog := &syncBuffer{}
	a, b := h.broker(), h.brokerOn(h.newD(), rowactor.WithLogger(slog.New(slog.NewTextHandler(bLog, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	start := time.Now()
	old := start.Truncate(2 * time.Second).Add(-10 * time.Minute)
	if _, err := a.Publish(ctx, h.table, h.queue, []byte("old"), rowactor.Unique("tick@"+old.UTC().Format(keyTime))); err != nil {
		t.Fatal(err)
	}
	held := make(chan time.Time, 1)
	unblock := make(chan struct{})
	defer close(unblock)
	var calls atomic.Int64
	pa, err := a.Periodic(ctx, h.table, h.queue, rowactor.Every(2*time.Second), func(_ context.Context, at time.Time) ([]byte, error) {
		if calls.Add(1) == 1 {
			held <- at
			<-unblock // a's first round hangs until it is given up
		}
		return []byte(at.UTC().Format(keyTime)), nil
	}, rowactor.PeriodicName("tick"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("broker a made no payload in its first round")
	}
	pb, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(2*time.Second), func(_ context.Context, at time.Time) ([]byte, error) {
		return []byte(at.UTC().Format(keyTime)), nil
	}, rowactor.PeriodicName("tick"))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "broker b to wait in line behind a", func() bool { return strings.Contains(bLog.String(), "led=false") })
	pa.Stop() // gives the hanging round up, publishing nothing, and lets the lock go
	waitUntil(t, "broker b to publish", func() bool { return pb.Published() >= 1 })
	pb.Stop()
	// Every run in (old, start-2s] came before either broker started: missed. The latest
	// missed run is at or after start-2s, so none of these may have a row.
	runs := h.runsOf("tick", start.Add(-90*time.Second), start.Add(-2*time.Second))
	if len(runs) > 0 {
		var keys []string
		for r := range runs {
			keys = append(keys, r.UTC().Format(keyTime))
		}
		slices.Sort(keys)
		t.Fatalf("broker b published %d runs that came before any broker ran the job (missed during the outage; want only the latest, once): %v (b published %d in all)",
			len(runs), keys, pb.Published())
	}
	// From the latest missed run on, b published every run once (a's round, given up,
	// published none).
	runs = h.runsOf("tick", start.Add(-2*time.Second), time.Now())
	var first, last time.Time
	for r := range runs {
		if first.IsZero() || r.Before(first) {
			first = r
		}
		if r.After(last) {
			last = r
		}
	}
	for r := first; !r.After(last); r = r.Add(2 * time.Second) {
		if runs[r] != 1 {
			t.Errorf("the run of %s has %d rows, want 1 (runs %s to %s)", r.Format(keyTime), runs[r], first.Format(keyTime), last.Format(keyTime))
		}
	}
	if int64(len(runs)) != pb.Published() || pa.Published() != 0 {
		t.Errorf("%d runs since the outage, b published %d and a %d; want them all b's", len(runs), pb.Published(), pa.Published())
	}
}

// periodicLongHangTakeoverScenario: two brokers run an hourly job (SkipMissed), going by
// one test clock. At the hour, the broker that takes the lock hangs in the run's payload
// for longer than the other waits in line (half the time to the next run, at most 10 s);
// then it dies (its job stops, giving the round up and letting the lock go). The run is a
// few seconds late: docs/periodic.md says the next broker in line publishes it, and that
// a run up to a minute late is published as itself. The run must be published within a
// minute of its time, not at the next hour as a missed run (nor, with SkipMissed, never).
func periodicLongHangTakeoverScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	clock := rowactortest.NewClock()
	logs := map[string]*syncBuffer{"a": {}, "b": {}}
	brokers := map[string]*rowactor.Broker{
		"a": h.broker(rowactor.WithClock(clock), rowactor.WithLogger(slog.New(slog.NewTextHandler(logs["a"], &slog.HandlerOptions{Level: slog.LevelDebug})))),
		"b": h.brokerOn(h.newD(), rowactor.WithClock(clock), rowactor.WithLogger(slog.New(slog.NewTextHandler(logs["b"], &slog.HandlerOptions{Level: slog.LevelDebug})))),
	}
	var calls atomic.Int64
	hung := make(chan string, 1)
	unblock := make(chan struct{})
	defer close(unblock)
	jobs := map[string]*rowactor.PeriodicJob{}
	for _, name := range []string{"a", "b"} {
		p, err := brokers[name].Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), func(_ context.Context, at time.Time) ([]byte, error) {
			if calls.Add(1) == 1 {
				hung <- name
				<-unblock // hangs, ignoring its context, until the test ends
			}
			return []byte(at.UTC().Format(keyTime)), nil
		}, rowactor.PeriodicName("hourly"), rowactor.SkipMissed())
		if err != nil {
			t.Fatal(err)
		}
		jobs[name] = p
	}
	for name, l := range logs {
		waitUntil(t, "broker "+name+"'s first round", func() bool { return strings.Contains(l.String(), "a periodic job's round") })
	}
	run := clock.Now().Truncate(time.Hour).Add(time.Hour)
	from := map[string]int{"a": len(logs["a"].String()), "b": len(logs["b"].String())}
	clock.Advance(run.Sub(clock.Now()) + time.Second)
	var holder string
	select {
	case holder = <-hung:
	case <-time.After(10 * time.Second):
		t.Fatal("no broker made the payload of the hour's run")
	}
	other := map[string]string{"a": "b", "b": "a"}[holder]
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs[other].String()[from[other]:], "led=false") {
		if time.Now().After(deadline) {
			t.Fatalf("broker %s never waited in line behind %s", other, holder)
		}
		time.Sleep(50 * time.Millisecond)
	}
	jobs[holder].Stop() // the holder dies: its round is given up and the lock let go
	late := clock.Now().Sub(run)
	key := "hourly@" + run.UTC().Format(keyTime)
	deadline = time.Now().Add(40 * time.Second)
	for h.countKey(key) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the run of %s (%v late when its holder died) was not published by broker %s within 40 s; it is due again only at the next hour, as a missed run that SkipMissed drops",
				run.Format(keyTime), late.Round(time.Second), other)
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitUntil(t, "broker "+other+" to count the run it published", func() bool { return jobs[other].Published() >= 1 })
	jobs[other].Stop()
	if n := h.countKey(key); n != 1 || jobs[other].Published() != 1 || jobs[holder].Published() != 0 {
		t.Errorf("the run has %d rows, %s published %d runs and %s %d; want one row, published by %s", n, other, jobs[other].Published(), holder, jobs[holder].Published(), other)
	}
}

// stepSeconds advances clock by a second n times, a run of an Every(time.Second) job at
// each step, instead of waiting out a second for each. After each step it waits, up to
// 10 s in all, until done(step) reports the step's work done, such as the step's run
// published: so no jump comes while a handler runs. It does not fail; the caller's
// checks tell what did not happen. The clock keeps the machine's pace between the steps.
func stepSeconds(clock *rowactortest.Clock, n int, done func(step int) bool) {
	deadline := time.Now().Add(10 * time.Second)
	for step := 1; step <= n; step++ {
		clock.Advance(time.Second)
		for !done(step) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// periodicPayload makes a run's payload: its time, as in its key.
func periodicPayload(_ context.Context, at time.Time) ([]byte, error) {
	return []byte(at.UTC().Format(keyTime)), nil
}

// countPrefix counts the rows whose unique key starts with name@ (byte range, no LIKE).
func (h *harness) countPrefix(name string) int {
	h.t.Helper()
	low, high := name+"@", name+"A"
	return h.drv.count(h.t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE unique_key >= ? AND unique_key < ?", h.table.Name), low, high)
}

// stopWithin stops p, failing if it takes longer than d.
func stopWithin(t *testing.T, p *rowactor.PeriodicJob, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { p.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Errorf("Stop of %q took longer than %v", p.Name(), d)
		<-done
	}
}

// Two periodic jobs on a pool of 2 connections both keep publishing: their rounds, each
// holding a connection for the lock and needing another to publish, do not deadlock.
func periodicTwoJobsOnASmallPoolScenario(t *testing.T, h *harness, _ rowactor.Form) {
	d, ok := sizedDialect(t, h, 2)
	if !ok {
		t.Skip("SQLite holds no connection per lock")
	}
	ctx := context.Background()
	clock := rowactortest.NewClock()
	b := h.brokerOn(d, rowactor.WithClock(clock))
	var jobs []*rowactor.PeriodicJob
	for _, name := range []string{"a", "b"} {
		p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), periodicPayload, rowactor.PeriodicName(name))
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, p)
	}
	// Four runs' seconds, which the clock jumps to: both jobs' rounds start together at
	// each, as at each second of the machine's clock.
	stepSeconds(clock, 4, func(step int) bool { return jobs[0].Published() >= int64(step) && jobs[1].Published() >= int64(step) })
	for _, p := range jobs {
		if n := h.countPrefix(p.Name()); n < 3 {
			t.Errorf("job %q on a pool of 2 beside one other job: %d runs in 4 s of its clock, want at least 3 (rounds deadlocked on the pool)", p.Name(), n)
		}
	}
	for _, p := range jobs {
		stopWithin(t, p, 5*time.Second)
	}
}

// One periodic job, one subscription and one retention on a pool of 2: the job's runs are
// published and handled.
func periodicBesideSubscriptionAndRetentionScenario(t *testing.T, h *harness, _ rowactor.Form) {
	d, ok := sizedDialect(t, h, 2)
	if !ok {
		t.Skip("SQLite holds no connection per lock")
	}
	ctx := context.Background()
	clock := rowactortest.NewClock()
	b := h.brokerOn(d, rowactor.WithClock(clock))
	if _, err := b.Retain(ctx, h.table, time.Hour, rowactor.RetainEvery(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	h.subscribe(b, func(ctx context.Context, dl *rowactor.Delivery) rowactor.Outcome {
		handled.Add(1)
		return rowactor.Ack()
	})
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), periodicPayload, rowactor.PeriodicName("mix"))
	if err != nil {
		t.Fatal(err)
	}
	// Four runs' seconds, which the clock jumps to, each once the run before was handled.
	stepSeconds(clock, 4, func(step int) bool { return p.Published() >= int64(step) && handled.Load() >= int64(step) })
	if n := h.countPrefix("mix"); n < 3 || handled.Load() < 2 {
		t.Errorf("a job beside a subscription and a retention on a pool of 2: %d runs, %d handled in 4 s of its clock", n, handled.Load())
	}
	stopWithin(t, p, 5*time.Second)
}

// After a 30 s outage of a job every second, the restart publishes at most the latest
// missed run, and none with SkipMissed.
func periodicShortOutageScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	for _, c := range []struct {
		name string
		skip bool
		max  int64
	}{{"skip", true, 1}, {"once", false, 2}} {
		last := time.Now().Add(-30 * time.Second).Truncate(time.Second)
		h.exec(fmt.Sprintf("INSERT INTO %s (grp, payload, unique_key, processed_at) VALUES (?, ?, ?, ?)", h.table.Name),
			h.queue, []byte("before the deploy"), c.name+"@"+last.UTC().Format(keyTime), h.drv.timeValue(last))
		opts := []rowactor.PeriodicOption{rowactor.PeriodicName(c.name)}
		if c.skip {
			opts = append(opts, rowactor.SkipMissed())
		}
		p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), periodicPayload, opts...)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(700 * time.Millisecond)
		p.Stop()
		if p.Published() > c.max {
			t.Errorf("SkipMissed=%v after a 30 s outage of a 1 s job: %d runs published at the restart, want at most %d", c.skip, p.Published(), c.max)
		}
	}
}

// Shutdown(ctx) returns within its context while a periodic payload function runs on.
func periodicShutdownBoundedByContextScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	entered, slept, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	// Shutdown gives the payload up; it still runs on in its goroutine, which the
	// package's leak check would count if the test ended first.
	t.Cleanup(func() { <-slept })
	var once sync.Once
	_, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), func(ctx context.Context, at time.Time) ([]byte, error) {
		first := false
		once.Do(func() { first = true; close(entered) })
		if first {
			// Ignores its context: it runs for 6 s, or until Shutdown has returned. A
			// Shutdown that waited for it would take the 6 s, past the 3 s bound.
			select {
			case <-time.After(6 * time.Second):
			case <-release:
			}
			close(slept)
		}
		return periodicPayload(ctx, at)
	}, rowactor.PeriodicName("slow"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the payload was never called")
	}
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	_, err = b.Shutdown(sctx)
	took := time.Since(start)
	close(release)
	if took > 3*time.Second {
		t.Errorf("Shutdown with a 1 s context took %v while a periodic payload ran (err %v)", took.Round(100*time.Millisecond), err)
	}
}

// A periodic run whose row a subscription moves to a DeadLetterTable is not published
// again: the job does not forget it.
func periodicDeadLetterTableScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	dl := h.table
	dl.Name = h.table.Name + "_dl"
	h.createTable(dl)
	clock := rowactortest.NewClock()
	b := h.broker(rowactor.WithClock(clock))
	var mu sync.Mutex
	seen := map[string]int{} // payload (the run's time) -> deliveries of distinct rows
	ids := map[int64]bool{}
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		mu.Lock()
		if !ids[d.ID()] {
			ids[d.ID()] = true
			seen[string(d.Payload())]++
		}
		mu.Unlock()
		return rowactor.DeadLetter(errors.New("the report cannot be made"))
	}, rowactor.DeadLetterTable(dl.Name))
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), periodicPayload, rowactor.PeriodicName("dl"))
	if err != nil {
		t.Fatal(err)
	}
	// Four runs, each moved to the dead letter table before the next round looks for the
	// job's newest run.
	stepSeconds(clock, 4, func(step int) bool { return p.Published() >= int64(step) && h.countPrefix("dl") == 0 })
	p.Stop()
	mu.Lock()
	defer mu.Unlock()
	for run, n := range seen {
		if n > 1 {
			t.Errorf("run %s was published as %d rows (its first row moved to the dead letter table, and the job forgot it); published %d runs for %d distinct",
				run, n, p.Published(), len(seen))
			break
		}
	}
}

// The query NewestUniqueKey runs (PostgreSQL's with COLLATE "C", as the dialect writes it)
// reads the unique index, among 10,000 keys, with no sort.
func periodicNewestKeyQueryScenario(t *testing.T, h *harness, _ rowactor.Form) {
	for first := 0; first < 10000; first += 500 {
		vals, args := make([]string, 0, 500), make([]any, 0, 1000)
		for i := range 500 {
			vals = append(vals, "(?, ?, ?)")
			args = append(args, h.queue, []byte("x"), fmt.Sprintf("tick@%05d", first+i))
		}
		h.exec(fmt.Sprintf("INSERT INTO %s (grp, payload, unique_key) VALUES %s", h.table.Name, strings.Join(vals, ", ")), args...)
	}
	k := "unique_key"
	if _, ok := h.d.(*postgres.Dialect); ok {
		k = `unique_key COLLATE "C"`
	}
	q := fmt.Sprintf("SELECT unique_key FROM %s WHERE %s >= ? AND %s < ? ORDER BY %s DESC LIMIT 1", h.table.Name, k, k, k)
	if sorts, plan := h.drv.sorts(t, h.d, h.table.Name, q, "tick@", "tickA"); sorts {
		t.Fatalf("NewestUniqueKey's query sorts:\n%s", plan)
	}
}
