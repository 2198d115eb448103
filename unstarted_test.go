package rowactor_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// A row claimed and given back before its handler started (Pause, Shutdown's drain, a
// Cancel while it waited for a worker) gets back the attempt its claim counted: it reads
// as it did before the claim, in the table and in Attempt() at its next delivery, in every
// form and mode (SPEC: "given back before its handler started"). A row whose handler did
// start keeps its attempt spent when it is released ("shutdown releases what is left" in
// conformance_test.go).

var unstartedScenarios = []scenario{
	{name: "pause gives waiting rows back with the attempt they had", run: pauseGivesBackTheAttemptScenario},
	{name: "a graceful shutdown gives waiting rows back with the attempt they had", run: shutdownGivesBackTheAttemptScenario},
	{name: "a cancel of a waiting row leaves the attempt it had", shapes: []tableShape{withProcessedAt, withError}, run: cancelWaitingKeepsTheAttemptScenario},
	{name: "a shutdown whose context has ended gives back what never started with the attempt it had", run: cancelledShutdownGivesBackTheAttemptScenario},
}

func TestRowsGivenBackUnstartedKeepTheirAttempt(t *testing.T) {
	t.Parallel()
	runModeMatrix(t, unstartedScenarios)
}

// waitingRows are the subscription options that keep one row in work and others claimed
// behind it, waiting for the worker: Workers(1) and Prefetch(3) in the lease form (the
// issue's case), one partition key elsewhere (Prefetch is the lease form's only), which
// lets one row of the key wait. It returns the options and how many rows wait.
func waitingRows(form rowactor.Form) ([]rowactor.SubscribeOption, int) {
	opts := []rowactor.SubscribeOption{rowactor.MaxAttempts(3), rowactor.DeadLetterGroup("dead")}
	if form == rowactor.FormLease {
		return append(opts, rowactor.Workers(1), rowactor.Prefetch(3), rowactor.Lease(time.Minute)), 3
	}
	return append(opts, rowactor.WorkersByKey(1, func(*rowactor.Delivery) string { return "one" })), 1
}

// blockFirst is a handler whose first call holds its worker until release closes (or its
// context ends), while later calls run next.
type blockFirst struct {
	first    atomic.Int64 // the blocked row's id
	started  chan struct{}
	release  chan struct{}
	mu       sync.Mutex
	attempts map[int64][]int
	next     func(d *rowactor.Delivery) rowactor.Outcome
}

func newBlockFirst(next func(d *rowactor.Delivery) rowactor.Outcome) *blockFirst {
	return &blockFirst{started: make(chan struct{}), release: make(chan struct{}), attempts: map[int64][]int{}, next: next}
}

func (b *blockFirst) handle(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
	if b.first.CompareAndSwap(0, d.ID()) {
		close(b.started)
		select {
		case <-b.release:
		case <-ctx.Done():
		}
		return rowactor.Ack()
	}
	b.mu.Lock()
	b.attempts[d.ID()] = append(b.attempts[d.ID()], d.Attempt())
	b.mu.Unlock()
	return b.next(d)
}

func (b *blockFirst) of(id int64) []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.attempts[id]...)
}

// holding waits until the first row's handler runs and waiting rows wait behind it.
func (h *harness) holding(sub *rowactor.Subscription, b *blockFirst, waiting int) {
	h.t.Helper()
	select {
	case <-b.started:
	case <-time.After(15 * time.Second):
		h.t.Fatalf("no row was delivered\nlogs:\n%s", h.logs.String())
	}
	waitFor(h.t, func() bool { return sub.InWork() == 1+waiting })
}

// waitReleased waits for n rows given back, and fails on any other settlement.
func (h *harness) waitReleased(n int) {
	h.t.Helper()
	for _, s := range h.waitSettled(n) {
		if s.Step != "release" || !s.Released {
			h.t.Fatalf("settlement %+v, want a row given back", s)
		}
	}
}

// others are ids but first.
func others(ids []int64, first int64) []int64 {
	var out []int64
	for _, id := range ids {
		if id != first {
			out = append(out, id)
		}
	}
	return out
}

// checkAttempt fails unless each row's attempt column reads want and no lease is held.
func (h *harness) checkAttempt(ids []int64, want int, when string) {
	h.t.Helper()
	for _, id := range ids {
		if st := h.row(id); !st.exists || st.attempt != want || st.lockedUntil != nil || st.group != h.queue {
			h.t.Fatalf("row %d %s: %+v, want attempt %d in group %q and no lease", id, when, st, want, h.queue)
		}
	}
}

// pauseGivesBackTheAttemptScenario: the case. Two Pause/Resume cycles with rows
// waiting for the one worker left them at attempt 3, read Attempt()==3 on their first
// run, and a transient Fail moved them straight to the dead letter (MaxAttempts(3)).
func pauseGivesBackTheAttemptScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	opts, waiting := waitingRows(form)
	ids := h.publish(b, 1+waiting)
	bf := newBlockFirst(func(d *rowactor.Delivery) rowactor.Outcome {
		if d.Attempt() == 1 {
			return rowactor.Fail(errors.New("transient"))
		}
		return rowactor.Ack()
	})
	sub := h.subscribe(b, bf.handle, opts...)
	for cycle := 1; cycle <= 2; cycle++ {
		h.holding(sub, bf, waiting)
		if err := sub.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		h.waitReleased(waiting)
		h.checkAttempt(others(ids, bf.first.Load()), 1, "given back by Pause")
		if err := sub.Resume(ctx); err != nil {
			t.Fatal(err)
		}
	}
	h.holding(sub, bf, waiting)
	close(bf.release)
	// The first row's ack, then each waiting row's first run: a Fail that retries.
	seen := map[int64]bool{}
	for len(seen) < 1+waiting {
		s := h.waitSettled(1)[0]
		if seen[s.ID] {
			continue // a retried row's next run
		}
		seen[s.ID] = true
		switch {
		case s.ID == bf.first.Load():
			if s.Step != "ack" || s.Err != nil {
				t.Fatalf("the first row's settlement %+v", s)
			}
		case s.Step != "retry_after" || s.Err != nil || s.Attempt != 1:
			t.Fatalf("the first run of row %d settled %+v, want retry_after at attempt 1 (not the dead letter)", s.ID, s)
		}
	}
	for _, id := range others(ids, bf.first.Load()) {
		if a := bf.of(id); len(a) == 0 || a[0] != 1 {
			t.Fatalf("row %d delivered with attempts %v, want 1 first", id, a)
		}
		// The retry may already have run and acked (deleting the row) by now; what
		// must never be is the row in another group after one failure.
		st := h.row(id)
		if st.exists && st.group != h.queue {
			t.Fatalf("row %d moved to %q after one failure: %+v", id, st.group, st)
		}
		if !st.exists && len(bf.of(id)) < 2 {
			t.Fatalf("row %d is gone after one failure and no second run: %+v", id, st)
		}
	}
}

// shutdownGivesBackTheAttemptScenario: a graceful Shutdown gives the waiting rows back as
// its drain begins, and they keep the attempt they had; the next broker's first run reads
// Attempt()==1.
func shutdownGivesBackTheAttemptScenario(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	opts, waiting := waitingRows(form)
	ids := h.publish(b, 1+waiting)
	bf := newBlockFirst(func(*rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	sub := h.subscribe(b, bf.handle, opts...)
	h.holding(sub, bf, waiting)
	type shut struct {
		rep rowactor.ShutdownReport
		err error
	}
	done := make(chan shut, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		rep, err := b.Shutdown(ctx)
		done <- shut{rep, err}
	}()
	h.waitReleased(waiting) // the drain gives back what never started
	close(bf.release)
	r := <-done
	if r.err != nil || !r.rep.Drained || r.rep.Released != waiting {
		t.Fatalf("Shutdown = %+v, %v; want drained, %d released", r.rep, r.err, waiting)
	}
	if s := h.waitSettled(1)[0]; s.ID != bf.first.Load() || s.Step != "ack" || s.Err != nil {
		t.Fatalf("the first row's settlement %+v", s)
	}
	waited := others(ids, bf.first.Load())
	h.checkAttempt(waited, 1, "given back by Shutdown")

	next := newCalls()
	h.subscribe(h.second(), func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome { next.add(d); return rowactor.Ack() })
	h.waitSettled(waiting)
	for _, id := range waited {
		if a := next.of(id); len(a) != 1 || a[0] != 1 {
			t.Fatalf("row %d redelivered with attempts %v, want [1]", id, a)
		}
	}
}

// cancelWaitingKeepsTheAttemptScenario: a row cancelled while it waits for a worker ends
// as cancelled (processed, the reason in its error column) without its handler running,
// and reads the attempt it had, as a cancel of the queued row leaves it.
func cancelWaitingKeepsTheAttemptScenario(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	opts, waiting := waitingRows(form)
	ids := h.publish(b, 1+waiting)
	bf := newBlockFirst(func(*rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	sub := h.subscribe(b, bf.handle, opts...)
	h.holding(sub, bf, waiting)
	id := others(ids, bf.first.Load())[0]
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := b.Cancel(ctx, h.table, id, "customer left"); err != nil {
		t.Fatalf("Cancel of waiting row %d: %v", id, err)
	}
	st := h.row(id)
	if !st.exists || st.processedAt == nil || st.lastError == nil || *st.lastError != dialects.CancelledError("customer left") || st.lockedUntil != nil {
		t.Fatalf("cancelled row %d: %+v, want processed with the reason", id, st)
	}
	if st.attempt != 1 {
		t.Fatalf("cancelled row %d reads attempt %d, want 1: its handler never ran", id, st.attempt)
	}
	if a := bf.of(id); len(a) != 0 {
		t.Fatalf("the handler ran for the cancelled row %d: attempts %v", id, a)
	}
	close(bf.release)
}

// cancelledShutdownGivesBackTheAttemptScenario: a Shutdown whose context has already ended,
// under a busy queue, gives back the rows waiting for a worker and those of claims that
// return as the subscription stops (handoff.go), none of whose handlers started: each
// reads the attempt it had, while a row whose handler started keeps its attempt spent.
func cancelledShutdownGivesBackTheAttemptScenario(t *testing.T, h *harness, form rowactor.Form) {
	const rounds, rows = 3, 40
	ids := h.publish(h.broker(rowactor.WithPollOnly()), rows)
	var mu sync.Mutex
	started := map[int64]bool{}
	var handled atomic.Int64
	opts := []rowactor.SubscribeOption{rowactor.Workers(4), rowactor.PollInterval(5 * time.Millisecond)}
	if form == rowactor.FormLease {
		opts = append(opts, rowactor.Prefetch(8), rowactor.Lease(time.Minute))
	}
	for range rounds {
		b := h.second()
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			mu.Lock()
			started[d.ID()] = true
			mu.Unlock()
			time.Sleep(time.Millisecond)
			handled.Add(1)
			return rowactor.Ack()
		}, opts...)
		start := handled.Load()
		waitFor(t, func() bool { return handled.Load() > start || handled.Load() >= rows })
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, _ = b.Shutdown(ctx) // ErrNotDrained with context.Canceled, or nil
	}
	// The releases may outlive Shutdown (its context had ended): wait for every row left
	// whose handler never started to read the attempt it was published with, unleased.
	// One exception is told to the service: a give-back that Shutdown's budget cut short
	// on a loaded server (its settlement reports the error, not released) leaves the row
	// as its claim left it, its lease to run out or its key let go with the attempt
	// spent.
	cut := map[int64]bool{}
	var bad []rowState
	deadline := time.Now().Add(15 * time.Second)
	for {
		for drained := false; !drained; {
			select {
			case s := <-h.settled:
				if s.Step == "release" && !s.Released && s.Err != nil {
					cut[s.ID] = true
				}
			default:
				drained = true
			}
		}
		bad = bad[:0]
		mu.Lock()
		for _, id := range ids {
			if started[id] || cut[id] {
				continue
			}
			if st := h.row(id); st.exists && (st.attempt != 1 || st.lockedUntil != nil) {
				bad = append(bad, st)
			}
		}
		mu.Unlock()
		if len(bad) == 0 {
			if len(cut) > 0 {
				t.Logf("%d give-backs cut short by Shutdown's budget, each reported", len(cut))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows whose handler never started did not read attempt 1, unleased, in 15 s: %+v", len(bad), bad)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
