package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/settler"
)

// scenario is one behaviour of SPEC.md, run over every (database, form) it applies to.
type scenario struct {
	name   string
	forms  []rowactor.Form // nil: every form the database serves
	shapes []tableShape
	// notifying limits the scenario to databases that wake other processes.
	notifying bool
	// plainOnly leaves the scenario out of runModeMatrix's transactional runs (batch
	// handlers cannot be transactional).
	plainOnly bool
	run       func(t *testing.T, h *harness, form rowactor.Form)
}

// attemptColumn is the attempt column after a row was delivered n times: the lease and
// advisory forms count at the claim, the row lock form when a retry returns the row.
func attemptColumn(form rowactor.Form, deliveries, retries int) int {
	if form == rowactor.FormRowLock {
		return 1 + retries
	}
	return 1 + deliveries
}

// The scenario matrices. Each topic file declares one list of its scenarios (named after
// its topic, as fifoScenarios in fifo_test.go); a list runs once it is named here.

// scenarios run over every (database, form) by TestConformance.
var scenarios = slices.Concat(
	// Claims, leases, polls and workers.
	coreScenarios,
	oneModelScenarios,
	settlementNoteScenarios,
	expiredClaimScenarios,
	staleLeaseScenarios,
	wakeDuringClaimScenarios,
	idlePollScenarios,
	idleWorkerScenarios,
	earlyWorkerScenarios,
	prefetchScenarios,
	sharedPoolScenarios,
	tuningScenarios,
	// Order and uniqueness.
	priorityScenarios,
	fifoScenarios,
	fifoOrderScenarios,
	uniqueScenarios,
	// Batches, events and job control.
	batchScenarios,
	batchHandlerScenarios,
	eventScenarios,
	jobScenarios,
	// Dead letters and retention.
	deadLetterWholeRowScenarios,
	retainScenarios,
	retainDeadScenarios,
	retainStopMidRoundScenarios,
	// Periodic jobs.
	periodicScenarios,
	periodicInputScenarios,
	periodicLockScenarios,
	// Shutdown.
	shutdownCancelledScenarios,
	shutdownInHandlerScenarios,
	failingClaimerShutdownScenarios,
)

// outcomeScenarios run over every (database, form, mode) by TestOutcomeConformance.
var outcomeScenarios = slices.Concat(
	outcomeCoreScenarios,
	funcScenarios,
	cancelInWorkScenarios,
	cancelElsewhereScenarios,
	batchCancelScenarios,
)

// transactionalScenarios run with Transactional() over every (database, form) by
// TestTransactionalConformance.
var transactionalScenarios = slices.Concat(
	transactionalCoreScenarios,
	transactionalEventScenarios,
)

var coreScenarios = []scenario{
	{name: "ack deletes the row", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		c := newCalls()
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome { c.add(d); return rowactor.Ack() }, rowactor.Workers(2))
		ids := h.publish(b, 5)
		for _, s := range h.waitSettled(5) {
			if s.Err != nil || s.Step != "ack" {
				t.Fatalf("settlement %+v", s)
			}
		}
		for _, id := range ids {
			if h.row(id).exists {
				t.Fatalf("row %d still exists after ack", id)
			}
			if got := c.of(id); len(got) != 1 || got[0] != 1 {
				t.Fatalf("row %d delivered with attempts %v, want [1]", id, got)
			}
		}
	}},
	{name: "ack marks processed_at and the row is not claimed again", shapes: []tableShape{withProcessedAt}, run: func(t *testing.T, h *harness, form rowactor.Form) {
		b := h.broker()
		c := newCalls()
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome { c.add(d); return rowactor.Ack() })
		before := time.Now()
		id := h.publish(b, 1)[0]
		h.waitSettled(1)
		h.quiet(300 * time.Millisecond)
		st := h.row(id)
		if !st.exists || st.lockedUntil != nil || st.attempt != attemptColumn(form, 1, 0) {
			t.Fatalf("row after ack: %+v", st)
		}
		within(t, st.processedAt, before, 5*time.Second)
		if n := c.n.Load(); n != 1 {
			t.Fatalf("handled %d times, want 1", n)
		}
	}},
	{name: "drop ends the row like ack", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Drop() })
		id := h.publish(b, 1)[0]
		if s := h.waitSettled(1)[0]; s.Err != nil || s.Outcome.String() != "drop" || s.Step != "ack" {
			t.Fatalf("settlement %+v", s)
		}
		if h.row(id).exists {
			t.Fatal("row still exists after drop")
		}
	}},
	{name: "retry redelivers with the attempt counted", shapes: []tableShape{withProcessedAt}, run: func(t *testing.T, h *harness, form rowactor.Form) {
		b := h.broker()
		c := newCalls()
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			c.add(d)
			if d.Attempt() == 1 {
				return rowactor.Retry()
			}
			return rowactor.Ack()
		})
		id := h.publish(b, 1)[0]
		got := h.waitDeliveries(2)
		if got[0].Step != "retry" || got[1].Step != "ack" {
			t.Fatalf("steps %s, %s", got[0].Step, got[1].Step)
		}
		if a := c.of(id); len(a) != 2 || a[0] != 1 || a[1] != 2 {
			t.Fatalf("attempts %v, want [1 2]", a)
		}
		if st := h.row(id); st.attempt != attemptColumn(form, 2, 1) || st.processedAt == nil || st.lockedUntil != nil {
			t.Fatalf("row after retry and ack: %+v", st)
		}
	}},
	{name: "retry after delays the row in the table", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		c := newCalls()
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			c.add(d)
			if d.Attempt() == 1 {
				return rowactor.RetryAfter(time.Hour)
			}
			return rowactor.Ack()
		})
		id := h.publish(b, 1)[0]
		if s := h.waitSettled(1)[0]; s.Step != "retry_after" || s.Err != nil {
			t.Fatalf("settlement %+v", s)
		}
		st := h.row(id)
		within(t, st.retryAfter, time.Now().Add(time.Hour), time.Minute)
		if st.lockedUntil != nil {
			t.Fatalf("lease not cleared: %+v", st)
		}
		h.quiet(400 * time.Millisecond) // not due: not claimed
		h.exec(fmt.Sprintf("UPDATE %s SET retry_after = ? WHERE id = ?", h.table.Name), h.drv.timeValue(time.Now().Add(-time.Second)), id)
		if s := h.waitSettled(1)[0]; s.Step != "ack" || s.Attempt != 2 {
			t.Fatalf("second settlement %+v", s)
		}
	}},
	{name: "retry after without a retry_after column retries at once and warns", shapes: []tableShape{withoutRetryAfter}, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			if d.Attempt() == 1 {
				return rowactor.RetryAfter(time.Hour)
			}
			return rowactor.Ack()
		})
		id := h.publish(b, 1)[0]
		got := h.waitDeliveries(2)
		if got[0].Step != "retry" || got[1].Step != "ack" || got[1].Attempt != 2 {
			t.Fatalf("settlements %+v", got)
		}
		if h.row(id).exists {
			t.Fatal("row still exists")
		}
		if !strings.Contains(h.logs.String(), "no retry_after column") {
			t.Fatalf("no warning logged:\n%s", h.logs.String())
		}
	}},
	{name: "max attempts moves a failing row to the dead-letter group", run: func(t *testing.T, h *harness, form rowactor.Form) {
		b := h.broker()
		c := newCalls()
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome { c.add(d); return rowactor.Retry() },
			rowactor.MaxAttempts(3), rowactor.DeadLetterGroup("dead"))
		id := h.publish(b, 1)[0]
		got := h.waitDeliveries(3)
		if got[2].Step != "dead_letter" || got[2].Err != nil || got[2].Attempt != 3 {
			t.Fatalf("third settlement %+v", got[2])
		}
		h.quiet(300 * time.Millisecond)
		if a := c.of(id); len(a) != 3 {
			t.Fatalf("attempts %v, want 3 deliveries", a)
		}
		st := h.row(id)
		if st.group != "dead" || st.lockedUntil != nil || st.attempt != attemptColumn(form, 3, 2) {
			t.Fatalf("dead letter row %+v", st)
		}
		if !strings.Contains(h.logs.String(), "attempts are spent") {
			t.Fatalf("no warning logged:\n%s", h.logs.String())
		}
	}},
	{name: "max attempts 1 moves on the first failure", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.RetryAfter(time.Minute) },
			rowactor.MaxAttempts(1), rowactor.DeadLetterGroup("dead"))
		id := h.publish(b, 1)[0]
		if s := h.waitSettled(1)[0]; s.Step != "dead_letter" || s.Err != nil {
			t.Fatalf("settlement %+v", s)
		}
		if st := h.row(id); st.group != "dead" || st.retryAfter != nil {
			t.Fatalf("row %+v", st)
		}
	}},
	{name: "max attempts moves a failing row into the dead-letter table", shapes: []tableShape{withoutGroup}, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		dead := h.table
		dead.Name = h.table.Name + "_dead"
		h.createTable(dead)
		b := h.broker()
		h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Retry() },
			rowactor.MaxAttempts(2), rowactor.DeadLetterTable(dead.Name))
		id := h.publish(b, 1)[0]
		if s := h.waitDeliveries(2)[1]; s.Step != "dead_letter" || s.Err != nil {
			t.Fatalf("settlement %+v", s)
		}
		if h.row(id).exists {
			t.Fatal("row still in the queue table")
		}
		st := h.drv.state(t, h.d, dead, id)
		if !st.exists || st.lockedUntil != nil {
			t.Fatalf("dead-letter table row %+v", st)
		}
		if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE payload = ?", dead.Name), []byte("job-0")); n != 1 {
			t.Fatalf("dead-letter table holds %d copies of the payload", n)
		}
	}},
	{name: "a handler panic releases the row at once", run: func(t *testing.T, h *harness, form rowactor.Form) {
		b := h.broker()
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			if d.Attempt() == 1 {
				panic("boom")
			}
			return rowactor.Ack()
		}, rowactor.Lease(time.Hour))
		id := h.publish(b, 1)[0]
		got := h.waitSettled(2) // with an hour's lease, only a release lets it come back
		// The release's report may arrive after the redelivery's: the row was free the
		// moment the release committed.
		if got[0].Step == "ack" {
			got[0], got[1] = got[1], got[0]
		}
		if got[0].Panic == nil || !got[0].Released || got[0].Step != "release" {
			t.Fatalf("first settlement %+v", got[0])
		}
		if got[1].Step != "ack" || got[1].Attempt != 2 {
			t.Fatalf("second settlement %+v", got[1])
		}
		if h.row(id).exists {
			t.Fatal("row still exists")
		}
	}, forms: []rowactor.Form{rowactor.FormLease}},
	{name: "a handler panic releases the key at once", forms: []rowactor.Form{rowactor.FormAdvisory}, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			if d.Attempt() == 1 {
				panic("boom")
			}
			return rowactor.Ack()
		})
		id := h.publish(b, 1)[0]
		got := h.waitSettled(2)
		if got[0].Step == "ack" { // the release's report may arrive after the redelivery's
			got[0], got[1] = got[1], got[0]
		}
		if got[0].Panic == nil || !got[0].Released || got[1].Step != "ack" || got[1].Attempt != 2 {
			t.Fatalf("settlements %+v", got)
		}
		if h.row(id).exists {
			t.Fatal("row still exists")
		}
	}},
	{name: "a stale token's settlement returns ErrLeaseLost and changes nothing", forms: []rowactor.Form{rowactor.FormLease}, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		other := time.Now().Add(time.Hour).Truncate(time.Second)
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			// Another claim took the row: its token replaces ours.
			h.exec(fmt.Sprintf("UPDATE %s SET locked_until = ?, attempt = attempt + 1 WHERE id = ?", h.table.Name), h.drv.timeValue(other), d.ID())
			return rowactor.Ack()
		})
		id := h.publish(b, 1)[0]
		s := h.waitSettled(1)[0]
		if !errors.Is(s.Err, rowactor.ErrLeaseLost) {
			t.Fatalf("settlement error %v, want ErrLeaseLost", s.Err)
		}
		st := h.row(id)
		if !st.exists || st.attempt != 3 || st.lockedUntil == nil || !st.lockedUntil.Equal(other) {
			t.Fatalf("row changed by a stale settlement: %+v", st)
		}
	}},
	{name: "a handler that outlives its lease keeps its row", forms: []rowactor.Form{rowactor.FormLease}, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		var calls atomic.Int64
		handler := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			calls.Add(1)
			time.Sleep(2500 * time.Millisecond) // two and a half leases
			return rowactor.Ack()
		}
		h.subscribe(b, handler, rowactor.Lease(time.Second))
		id := h.publish(b, 1)[0]
		// Another broker polls the table all along: it must never get the row.
		h.subscribe(h.second(), handler, rowactor.Lease(time.Second), rowactor.PollInterval(20*time.Millisecond))
		if s := h.waitSettled(1)[0]; s.Err != nil || s.Step != "ack" {
			t.Fatalf("settlement %+v", s)
		}
		h.quiet(300 * time.Millisecond)
		if n := calls.Load(); n != 1 {
			t.Fatalf("handled %d times, want 1", n)
		}
		if h.row(id).exists {
			t.Fatal("row still exists")
		}
	}},
	{name: "rows sharing a key are worked one at a time across brokers", forms: []rowactor.Form{rowactor.FormAdvisory},
		shapes: []tableShape{func(t *rowactor.Table) { t.AdvisoryKey = t.Name + "-{grp}" }},
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			var inWork, peak atomic.Int64
			handler := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				n := inWork.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(20 * time.Millisecond)
				inWork.Add(-1)
				return rowactor.Ack()
			}
			b := h.broker()
			ids := h.publish(b, 8)
			h.subscribe(b, handler, rowactor.Workers(4))
			h.subscribe(h.second(), handler, rowactor.Workers(4))
			for _, s := range h.waitSettled(8) {
				if s.Err != nil {
					t.Fatalf("settlement %+v", s)
				}
			}
			if p := peak.Load(); p != 1 {
				t.Fatalf("%d rows of one key in work at once", p)
			}
			if h.drv.keyLocked != nil && h.drv.keyLocked(t, h.d, h.table.Name+"-"+h.queue) {
				t.Fatal("the key is still locked after every row settled")
			}
			for _, id := range ids {
				if h.row(id).exists {
					t.Fatalf("row %d left", id)
				}
			}
		}},
	{name: "rows behind a busy key come without waiting for the poll", forms: []rowactor.Form{rowactor.FormAdvisory},
		shapes: []tableShape{func(t *rowactor.Table) { t.AdvisoryKey = t.Name + "-{grp}" }},
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			b := h.broker()
			h.publish(b, 5)
			h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() },
				rowactor.Workers(2), rowactor.PollInterval(time.Hour))
			h.waitSettled(5) // 15 s at most, against an hour's poll for each row after the first
		}},
	{name: "a retried row comes back without waiting for the poll", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			if d.Attempt() == 1 {
				return rowactor.Retry()
			}
			return rowactor.Ack()
		}, rowactor.Workers(2), rowactor.PollInterval(time.Hour)) // two workers: the claim comes back short
		time.Sleep(100 * time.Millisecond)
		h.publish(b, 1)
		h.waitSettled(2)
	}},
	{name: "rows with distinct keys are worked side by side", forms: []rowactor.Form{rowactor.FormAdvisory}, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		var inWork atomic.Int64
		release := make(chan struct{})
		b := h.broker()
		h.publish(b, 3)
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			inWork.Add(1)
			<-release
			return rowactor.Ack()
		}, rowactor.Workers(3))
		waitFor(t, func() bool { return inWork.Load() == 3 })
		close(release)
		h.waitSettled(3)
	}},
	{name: "a publish wakes the subscription without waiting for the poll", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }, rowactor.PollInterval(time.Hour))
		time.Sleep(100 * time.Millisecond) // let the first (empty) claim pass
		h.publish(b, 1)
		h.waitSettled(1) // 15 s at most, against an hour's poll
	}},
	{name: "a publish from another process wakes the subscription through the database", notifying: true, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		h.subscribe(h.broker(), func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }, rowactor.PollInterval(time.Hour))
		time.Sleep(300 * time.Millisecond) // the first (empty) claim and the listener's start pass
		other := h.second()
		tx, commit, _ := h.drv.begin(t, h.d)
		if _, err := other.PublishTx(context.Background(), tx, h.table, h.queue, []byte("from afar")); err != nil {
			t.Fatal(err)
		}
		h.quiet(300 * time.Millisecond) // not before the commit
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		h.waitSettled(1) // 15 s at most, against an hour's poll
	}},
	{name: "PublishTx rows exist only when the caller commits", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		tx, _, rollback := h.drv.begin(t, h.d)
		gone, err := b.PublishTx(context.Background(), tx, h.table, h.queue, []byte("rolled back"))
		if err != nil {
			t.Fatal(err)
		}
		if err := rollback(); err != nil {
			t.Fatal(err)
		}
		tx, commit, _ := h.drv.begin(t, h.d)
		kept, err := b.PublishTx(context.Background(), tx, h.table, h.queue, []byte("committed"))
		if err != nil {
			t.Fatal(err)
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
		if s := h.waitSettled(1)[0]; s.ID != kept {
			t.Fatalf("delivered row %d, want %d", s.ID, kept)
		}
		h.quiet(200 * time.Millisecond)
		if h.row(gone).exists {
			t.Fatal("rolled-back row exists")
		}
	}},
	{name: "workers bound the deliveries in work and can be raised while running", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		var inWork, peak atomic.Int64
		release := make(chan struct{})
		sub := h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			n := inWork.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			<-release
			inWork.Add(-1)
			return rowactor.Ack()
		}, rowactor.Workers(2))
		h.publish(b, 6)
		waitFor(t, func() bool { return inWork.Load() == 2 })
		time.Sleep(200 * time.Millisecond)
		if p := peak.Load(); p != 2 {
			t.Fatalf("peak %d deliveries in work with Workers(2)", p)
		}
		sub.SetWorkers(5)
		waitFor(t, func() bool { return inWork.Load() == 5 })
		close(release)
		h.waitSettled(6)
		if p := peak.Load(); p != 5 {
			t.Fatalf("peak %d deliveries in work after SetWorkers(5)", p)
		}
	}},
	{name: "shutdown lets deliveries in work settle", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		started := make(chan struct{}, 3)
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			started <- struct{}{}
			time.Sleep(300 * time.Millisecond)
			return rowactor.Ack()
		}, rowactor.Workers(3))
		ids := h.publish(b, 3)
		for range 3 {
			<-started
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rep, err := b.Shutdown(ctx)
		if err != nil || !rep.Drained || rep.Released != 0 {
			t.Fatalf("Shutdown = %+v, %v", rep, err)
		}
		for _, s := range h.waitSettled(3) {
			if s.Err != nil {
				t.Fatalf("settlement %+v", s)
			}
		}
		for _, id := range ids {
			if h.row(id).exists {
				t.Fatalf("row %d not settled", id)
			}
		}
		if _, err := b.Publish(context.Background(), h.table, h.queue, nil); !errors.Is(err, rowactor.ErrClosed) {
			t.Fatalf("Publish after Shutdown: %v, want ErrClosed", err)
		}
		if _, err := b.Subscribe(context.Background(), h.table, "other", nil); !errors.Is(err, rowactor.ErrClosed) {
			t.Fatalf("Subscribe after Shutdown: %v, want ErrClosed", err)
		}
		if _, err := b.Shutdown(ctx); !errors.Is(err, rowactor.ErrClosed) {
			t.Fatalf("second Shutdown: %v, want ErrClosed", err)
		}
	}},
	{name: "shutdown releases what is left and a late settlement returns ErrClosed", run: func(t *testing.T, h *harness, form rowactor.Form) {
		b := h.broker()
		started := make(chan struct{}, 2)
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			started <- struct{}{}
			<-ctx.Done() // Shutdown cancels it once it stops waiting
			return rowactor.Ack()
		}, append(leaseOptions(form, time.Hour), rowactor.Workers(2))...)
		ids := h.publish(b, 2)
		<-started
		<-started
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		rep, err := b.Shutdown(ctx)
		if !errors.Is(err, rowactor.ErrNotDrained) || !errors.Is(err, context.DeadlineExceeded) || rep.Drained {
			t.Fatalf("Shutdown = %+v, %v; want not drained, and an error matching ErrNotDrained and the deadline", rep, err)
		}
		// Each row is released, but for one thing a loaded server may cause: in the lease
		// form a release that runs past the stop's grace is cut, the row keeps its lease
		// (fenced by its token) until it runs out, and its settlement says so. The report
		// counts only the rows released.
		var released []int64
		for _, s := range h.waitSettled(2) {
			if !errors.Is(s.Err, rowactor.ErrClosed) || s.Outcome.String() != "ack" || s.Step != "release" {
				t.Fatalf("late settlement %+v, want ack refused with ErrClosed", s)
			}
			if s.Released {
				released = append(released, s.ID)
			} else if form != rowactor.FormLease || !errors.Is(s.Err, settler.ErrCutByStop) {
				t.Fatalf("late settlement %+v: not released, and not a lease release the stop cut", s)
			}
		}
		if rep.Released != len(released) || len(released) == 0 {
			t.Fatalf("Shutdown reported %d released; the settlements released %v\nlogs:\n%s", rep.Released, released, h.logs.String())
		}
		for _, id := range ids {
			st := h.row(id)
			if !st.exists || (st.lockedUntil != nil) == slices.Contains(released, id) || st.attempt != attemptColumn(form, 1, 0) {
				t.Fatalf("row %d after shutdown (released: %v): %+v", id, released, st)
			}
		}
		// Released at once: another broker takes the rows now, not at lease expiry.
		h.subscribe(h.second(), func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }, rowactor.Workers(2))
		for _, s := range h.waitSettled(len(released)) {
			// The row lock form's rollback spends no attempt.
			if s.Err != nil || s.Attempt != attemptColumn(form, 1, 0) || !slices.Contains(released, s.ID) {
				t.Fatalf("redelivery %+v of the released %v", s, released)
			}
		}
	}},
}

func TestConformance(t *testing.T) {
	t.Parallel()
	if len(drivers) == 0 {
		t.Fatal("no database drivers in the matrix")
	}
	for _, drv := range drivers {
		for _, form := range drv.forms {
			for _, sc := range scenarios {
				if sc.forms != nil && !hasForm(sc.forms, form) {
					continue
				}
				if sc.notifying && !drv.notifies {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/%s", drv.name, form, sc.name), func(t *testing.T) {
					t.Parallel()
					h := newHarness(t, drv, form, sc.shapes...)
					sc.run(t, h, form)
				})
			}
		}
	}
}

// leaseOptions sets a lease on lease-form tables; other forms refuse the option.
func leaseOptions(form rowactor.Form, d time.Duration) []rowactor.SubscribeOption {
	if form != rowactor.FormLease {
		return nil
	}
	return []rowactor.SubscribeOption{rowactor.Lease(d)}
}

func hasForm(forms []rowactor.Form, f rowactor.Form) bool {
	for _, x := range forms {
		if x == f {
			return true
		}
	}
	return false
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 15 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
