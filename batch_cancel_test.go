package rowactor_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// Cancel of a row in a SubscribeBatch batch in work, over every database that serves
// batches (the row lock form; batches are never transactional, so plain mode only): the
// row is marked cancelled (Delivery.Cancelled) while the batch's shared context runs on
// for its other rows, and the batch's commit ends the row as a cancel of a queued row
// would, whatever outcome the handler gave it, and the other rows by theirs.

var batchCancelScenarios = []scenario{
	{
		name:      "Cancel of a row in a batch in work ends it as cancelled and settles the batch's other rows by their outcomes",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError, withClearedUniqueKey},
		run:       batchCancelScenario,
	},
	{
		name:      "Cancel of a row in a batch deletes it where the table keeps no finished rows, whatever its outcome",
		forms:     rowLockOnly,
		plainOnly: true,
		run:       batchCancelDeletesScenario,
	},
	{
		name:      "Cancel of every row of a batch cancels the batch's context",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       batchCancelAllScenario,
	},
	{
		name:      "Cancel of a row in a batch whose handler panics ends that row as cancelled and releases the others",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       batchCancelPanicScenario,
	},
	{
		name:      "Cancel of a row in a batch whose handler is given up on ends that row as cancelled and releases the others",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       batchCancelAbandonedScenario,
	},
	{
		name:      "Cancel racing a batch's settlement reports what the table shows",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       batchCancelRaceScenario,
	},
	{
		name:      "Cancel of a row in a batch cut short by Shutdown does not report a cancel that never took effect",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       batchCancelShutdownScenario,
	},
	{
		name:      "Cancel racing a batch subscription's claim never answers ErrInWork",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       batchCancelRacesClaimScenario,
	},
	{
		name:      "Cancel of a row in a batch whose connection the server kills reports what the table shows",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       batchCancelKilledConnectionScenario,
	},
	{
		name:      "Cancel of a row in a batch whose connection the server kills reports what the table shows where the table keeps no finished rows",
		forms:     rowLockOnly,
		plainOnly: true,
		run:       batchCancelKilledConnectionScenario,
	},
	{
		name:      "Cancel of a row in a batch given up on keeps it cancelled when the handler returns late",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       batchCancelAbandonedHandlerReturnsScenario,
	},
	{
		name:      "Two Cancels of the only row of a batch of one both return nil and settle it once",
		forms:     rowLockOnly,
		plainOnly: true,
		run:       batchCancelTwiceBatchOfOneScenario,
	},
	{
		name:      "Cancel by a batch handler of a row of its own batch with its ctx does not wait for the batch",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       batchCancelFromOwnHandlerScenario,
	},
	{
		name:      "Cancels racing a batch of mixed outcomes each report where their row ends",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       batchCancelMixedOutcomesRaceScenario,
	},
	{
		name:      "Pause while a batch with a cancelled row is in work lets the batch settle as usual",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       batchCancelPauseScenario,
	},
}

// gate is a channel a test closes to let a handler go on; it is closed at the latest as
// the test ends (before its brokers shut down), so a failed test leaves no handler behind.
func (h *harness) gate() (wait <-chan struct{}, open func()) {
	c := make(chan struct{})
	var once sync.Once
	open = func() { once.Do(func() { close(c) }) }
	h.t.Cleanup(open)
	return c, open
}

// heldBatch is a batch a handler holds: its context and its deliveries.
type heldBatch struct {
	ctx context.Context
	ds  []*rowactor.Delivery
}

// waitBatch waits for the batch the handler sends, of n rows.
func (h *harness) waitBatch(got <-chan heldBatch, n int) heldBatch {
	h.t.Helper()
	select {
	case b := <-got:
		if len(b.ds) != n {
			h.t.Fatalf("the first batch holds %d rows, want %d (published before the subscription)", len(b.ds), n)
		}
		return b
	case <-time.After(15 * time.Second):
		h.t.Fatalf("no batch was delivered\nlogs:\n%s", h.logs.String())
	}
	return heldBatch{}
}

// indexOf is the place of row id in the batch.
func (b heldBatch) indexOf(t *testing.T, id int64) int {
	t.Helper()
	i := slices.IndexFunc(b.ds, func(d *rowactor.Delivery) bool { return d.ID() == id })
	if i < 0 {
		t.Fatalf("row %d is not in the batch", id)
	}
	return i
}

// acks is n Ack outcomes.
func acks(n int) []rowactor.Outcome {
	out := make([]rowactor.Outcome, n)
	for i := range out {
		out[i] = rowactor.Ack()
	}
	return out
}

// startCancel runs b.Cancel of row id on a goroutine of its own; its error arrives on the
// channel returned.
func (h *harness) startCancel(b *rowactor.Broker, id int64, reason string) <-chan error {
	done := make(chan error, 1)
	go func() {
		bounded, stop := context.WithTimeout(context.Background(), 20*time.Second)
		defer stop()
		done <- b.Cancel(bounded, h.table, id, reason)
	}()
	return done
}

// cancelReturned waits for a Cancel started by startCancel.
func (h *harness) cancelReturned(done <-chan error) error {
	h.t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(25 * time.Second):
		h.t.Fatalf("Cancel did not return\nlogs:\n%s", h.logs.String())
	}
	return nil
}

// stillWaiting fails the test if the Cancel has returned.
func (h *harness) stillWaiting(done <-chan error, what string) {
	h.t.Helper()
	select {
	case err := <-done:
		h.t.Fatalf("Cancel returned %v %s", err, what)
	case <-time.After(200 * time.Millisecond):
	}
}

// byID indexes settlements by row id; each row settles once here.
func byID(t *testing.T, ss []rowactor.Settlement) map[int64]rowactor.Settlement {
	t.Helper()
	m := make(map[int64]rowactor.Settlement, len(ss))
	for _, s := range ss {
		if _, twice := m[s.ID]; twice {
			t.Fatalf("row %d settled twice: %+v", s.ID, ss)
		}
		m[s.ID] = s
	}
	return m
}

// wantCancelledRow checks a row ended as cancelled with reason, its attempt as in work.
func (h *harness) wantCancelledRow(id int64, reason string, attempt int) {
	h.t.Helper()
	st := h.row(id)
	if !st.exists || st.processedAt == nil || st.lastError == nil || *st.lastError != dialects.CancelledPrefix+reason || st.lockedUntil != nil || st.attempt != attempt {
		h.t.Fatalf("the cancelled row %d: %+v, want it processed with %q, attempt %d", id, st, reason, attempt)
	}
}

// wantCancelledSettlement checks the hook saw a cancelled row's settlement.
func wantCancelledSettlement(t *testing.T, s rowactor.Settlement) {
	t.Helper()
	if s.Err != nil || s.Step != "ack" || s.Outcome.String() != "cancel" || s.Released || !errors.Is(s.HandlerErr, rowactor.ErrCancelled) {
		t.Fatalf("the cancelled row's settlement: %+v, want a drop acked whose HandlerErr wraps ErrCancelled", s)
	}
}

func batchCancelScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	other := h.second()
	ids := h.publish(b, 2)
	keyed, err := b.Publish(ctx, h.table, h.queue, []byte("cancel me"), rowactor.Unique("k1"))
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, keyed)
	got, saw := make(chan heldBatch, 1), make(chan []error, 1)
	release, open := h.gate()
	var calls atomic.Int64
	h.subscribeBatch(b, 3, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		if calls.Add(1) > 1 {
			return acks(len(ds)) // the unique key published again below
		}
		got <- heldBatch{ctx, ds}
		<-release
		errs := make([]error, len(ds))
		for i, d := range ds {
			errs[i] = d.Cancelled()
		}
		saw <- errs
		return acks(len(ds)) // the cancel wins over its row's Ack
	})
	held := h.waitBatch(got, 3)
	at := held.indexOf(t, keyed)
	before := h.row(keyed)

	// Another broker does not hold the batch: its Cancel is refused and changes nothing.
	if err := other.Cancel(ctx, h.table, keyed, "not yours"); !errors.Is(err, rowactor.ErrInWork) {
		t.Fatalf("another broker's Cancel of a row in a batch: %v, want ErrInWork", err)
	}
	if held.ds[at].Cancelled() != nil {
		t.Fatal("the row reads as cancelled after another broker's refused Cancel")
	}

	cancelled := h.startCancel(b, keyed, "customer left")
	waitFor(t, func() bool { return held.ds[at].Cancelled() != nil })
	// The batch's context runs on for its other rows, and the row waits for the batch's
	// commit, as does the Cancel.
	if err := held.ctx.Err(); err != nil {
		t.Fatalf("the batch's context ended on the Cancel of one of its rows: %v (cause %v)", err, context.Cause(held.ctx))
	}
	h.stillWaiting(cancelled, "before the batch settled")
	if st := h.row(keyed); !sameState(st, before) {
		t.Fatalf("the row changed before its batch settled: %+v, was %+v", st, before)
	}
	open()
	if err := h.cancelReturned(cancelled); err != nil {
		t.Fatalf("Cancel of a row in a batch: %v\nlogs:\n%s", err, h.logs.String())
	}
	errs := <-saw // sent before the handler returned
	for i, err := range errs {
		switch {
		case i == at && (!errors.Is(err, rowactor.ErrCancelled) || !strings.Contains(err.Error(), "customer left")):
			t.Fatalf("Cancelled() of the cancelled row: %v, want a cause wrapping ErrCancelled with the reason", err)
		case i != at && err != nil:
			t.Fatalf("Cancelled() of row %d, not cancelled: %v", held.ds[i].ID(), err)
		}
	}
	h.wantCancelledRow(keyed, "customer left", before.attempt)
	settled := byID(t, h.waitSettled(3))
	wantCancelledSettlement(t, settled[keyed])
	for _, id := range ids[:2] {
		if st := h.row(id); !st.exists || st.processedAt == nil || st.lastError != nil || st.attempt != 1 {
			t.Fatalf("row %d of the batch, acked: %+v", id, st)
		}
		if s := settled[id]; s.Err != nil || s.Step != "ack" || s.Outcome.String() != "ack" || s.HandlerErr != nil {
			t.Fatalf("row %d of the batch's settlement: %+v", id, s)
		}
	}
	// The unique key was cleared with the row, as a Drop clears it.
	again, err := b.Publish(ctx, h.table, h.queue, []byte("again"), rowactor.Unique("k1"))
	if err != nil || again == keyed {
		t.Fatalf("Publish of the cancelled row's unique key: id %d (the cancelled row is %d), %v", again, keyed, err)
	}
	if err := b.Cancel(ctx, h.table, keyed, "twice"); !errors.Is(err, rowactor.ErrFinished) {
		t.Fatalf("Cancel of the cancelled row: %v, want ErrFinished", err)
	}
}

func batchCancelDeletesScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	ids := h.publish(b, 3)
	got := make(chan heldBatch, 1)
	release, open := h.gate()
	var calls atomic.Int64
	h.subscribeBatch(b, 3, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		if calls.Add(1) > 1 {
			return acks(len(ds))
		}
		got <- heldBatch{ctx, ds}
		<-release
		out := make([]rowactor.Outcome, len(ds))
		for i := range out {
			out[i] = rowactor.Retry() // the cancel wins over its row's
		}
		return out
	})
	held := h.waitBatch(got, 3)
	victim := ids[1]
	cancelled := h.startCancel(b, victim, "gone")
	waitFor(t, func() bool { return held.ds[held.indexOf(t, victim)].Cancelled() != nil })
	open()
	if err := h.cancelReturned(cancelled); err != nil {
		t.Fatalf("Cancel of a row in a batch: %v", err)
	}
	if h.row(victim).exists {
		t.Fatal("the cancelled row is still in a table that keeps no finished rows")
	}
	first := byID(t, h.waitSettled(3))
	wantCancelledSettlement(t, first[victim])
	for _, id := range []int64{ids[0], ids[2]} {
		if s := first[id]; s.Err != nil || s.Step != "retry" {
			t.Fatalf("row %d of the batch's settlement: %+v, want its retry", id, s)
		}
	}
	for _, s := range h.waitSettled(2) { // the retried rows, delivered again
		if s.ID == victim || s.Err != nil || s.Step != "ack" || s.Attempt != 2 {
			t.Fatalf("redelivery %+v, want an ack of a retried row on attempt 2", s)
		}
	}
	h.quiet(200 * time.Millisecond) // the Retry did not bring the cancelled row back
	if err := b.Cancel(ctx, h.table, victim, "again"); !errors.Is(err, rowactor.ErrNotFound) {
		t.Fatalf("Cancel of the deleted row: %v, want ErrNotFound", err)
	}
}

func batchCancelAllScenario(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	ids := h.publish(b, 2)
	got, saw := make(chan heldBatch, 1), make(chan error, 1)
	h.subscribeBatch(b, 2, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		got <- heldBatch{ctx, ds}
		select {
		case <-ctx.Done():
			saw <- context.Cause(ctx)
		case <-time.After(15 * time.Second):
			saw <- nil
		}
		return acks(len(ds))
	})
	held := h.waitBatch(got, 2)
	first := h.startCancel(b, ids[0], "first")
	waitFor(t, func() bool { return held.ds[held.indexOf(t, ids[0])].Cancelled() != nil })
	if err := held.ctx.Err(); err != nil {
		t.Fatalf("the batch's context ended with a row of it left: %v", err)
	}
	h.stillWaiting(first, "with its batch's handler still running")
	second := h.startCancel(b, ids[1], "second")
	for _, c := range []<-chan error{first, second} {
		if err := h.cancelReturned(c); err != nil {
			t.Fatalf("Cancel of a row of the batch: %v\nlogs:\n%s", err, h.logs.String())
		}
	}
	if cause := <-saw; !errors.Is(cause, rowactor.ErrCancelled) || !strings.Contains(cause.Error(), "second") {
		t.Fatalf("the batch's context's cause: %v, want the last Cancel's, wrapping ErrCancelled", cause)
	}
	h.wantCancelledRow(ids[0], "first", 1)
	h.wantCancelledRow(ids[1], "second", 1)
	for _, s := range h.waitSettled(2) {
		wantCancelledSettlement(t, s)
	}
}

func batchCancelPanicScenario(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	ids := h.publish(b, 3)
	got := make(chan heldBatch, 1)
	release, open := h.gate()
	var calls atomic.Int64
	h.subscribeBatch(b, 3, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		if calls.Add(1) > 1 {
			return acks(len(ds))
		}
		got <- heldBatch{ctx, ds}
		<-release
		panic("boom")
	})
	held := h.waitBatch(got, 3)
	victim := ids[2]
	cancelled := h.startCancel(b, victim, "not needed")
	waitFor(t, func() bool { return held.ds[held.indexOf(t, victim)].Cancelled() != nil })
	open()
	if err := h.cancelReturned(cancelled); err != nil {
		t.Fatalf("Cancel of a row in a batch whose handler panicked: %v\nlogs:\n%s", err, h.logs.String())
	}
	h.wantCancelledRow(victim, "not needed", 1)
	first := byID(t, h.waitSettled(3))
	wantCancelledSettlement(t, first[victim])
	for _, id := range ids[:2] {
		if s := first[id]; !s.Released || s.Panic == nil || s.Step != "release" {
			t.Fatalf("row %d of the batch that panicked: %+v, want it released with the panic", id, s)
		}
	}
	for _, s := range h.waitSettled(2) {
		if s.ID == victim || s.Err != nil || s.Step != "ack" || s.Attempt != 1 {
			t.Fatalf("redelivery %+v, want an ack of a released row on attempt 1 (a release spends none)", s)
		}
	}
	for _, id := range ids[:2] {
		if st := h.row(id); st.processedAt == nil || st.lastError != nil {
			t.Fatalf("row %d after its redelivery: %+v", id, st)
		}
	}
}

func batchCancelAbandonedScenario(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	ids := h.publish(b, 3)
	got := make(chan heldBatch, 1)
	stuck, _ := h.gate()
	var calls atomic.Int64
	h.subscribeBatch(b, 3, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		if calls.Add(1) > 1 {
			return acks(len(ds))
		}
		got <- heldBatch{ctx, ds}
		<-stuck // ignores its context
		return acks(len(ds))
	}, rowactor.Timeout(100*time.Millisecond))
	held := h.waitBatch(got, 3)
	victim := ids[0]
	began := time.Now()
	if err := h.cancelReturned(h.startCancel(b, victim, "stuck")); err != nil {
		t.Fatalf("Cancel of a row in a batch whose handler ignores its context: %v\nlogs:\n%s", err, h.logs.String())
	}
	if took := time.Since(began); took < 50*time.Millisecond {
		t.Fatalf("Cancel returned after %v, before the batch's handler was given up on", took)
	}
	if held.ds[0].Cancelled() == nil {
		t.Fatal("the cancelled row does not read as cancelled")
	}
	h.wantCancelledRow(victim, "stuck", 1)
	first := byID(t, h.waitSettled(3))
	wantCancelledSettlement(t, first[victim])
	for _, id := range ids[1:] {
		if s := first[id]; !s.Released || !errors.Is(s.Err, rowactor.ErrAbandoned) {
			t.Fatalf("row %d of the abandoned batch: %+v, want it released as abandoned", id, s)
		}
	}
	for _, s := range h.waitSettled(2) {
		if s.ID == victim || s.Err != nil || s.Step != "ack" {
			t.Fatalf("redelivery %+v, want an ack of a released row", s)
		}
	}
}

// batchCancelRaceScenario cancels every row of a batch while its handler returns Ack on
// its own: each Cancel either won (nil: the row ends with the reason) or came after the
// batch's settlement began (ErrFinished: the row ends acked, without it).
func batchCancelRaceScenario(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	const n = 6
	ids := h.publish(b, n)
	got := make(chan heldBatch, 1)
	release, open := h.gate()
	h.subscribeBatch(b, n, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		got <- heldBatch{ctx, ds}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return acks(len(ds))
	})
	h.waitBatch(got, n)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs = make(map[int64]error, n)
	)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i == n/2 {
				open() // the handler returns as the Cancels come
			}
			bounded, stop := context.WithTimeout(context.Background(), 15*time.Second)
			defer stop()
			err := b.Cancel(bounded, h.table, id, "raced")
			mu.Lock()
			errs[id] = err
			mu.Unlock()
		}()
	}
	wg.Wait()
	h.waitSettled(n)
	for _, id := range ids {
		st, err := h.row(id), errs[id]
		switch {
		case err == nil:
			if st.processedAt == nil || st.lastError == nil || *st.lastError != dialects.CancelledPrefix+"raced" {
				t.Fatalf("row %d: Cancel returned nil, and the row is %+v", id, st)
			}
		case errors.Is(err, rowactor.ErrFinished):
			if st.processedAt == nil || st.lastError != nil {
				t.Fatalf("row %d: Cancel returned %v, and the row is %+v", id, err, st)
			}
		default:
			t.Fatalf("row %d: Cancel returned %v", id, err)
		}
	}
}

// batchCancelShutdownScenario: a batch handler that ignores its context (and has no
// deadline) still runs when Shutdown's drain ends, and Shutdown gives its rows back. The
// Cancel of one of its rows then must not return nil (nil means the row ended as
// cancelled): either the row is cancelled, or Cancel says it was not.
func batchCancelShutdownScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	ids := h.publish(b, 2)
	got := make(chan heldBatch, 1)
	stuck, _ := h.gate()
	h.subscribeBatch(b, 2, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		got <- heldBatch{ctx, ds}
		<-stuck
		return acks(len(ds))
	})
	held := h.waitBatch(got, 2)
	cancelled := h.startCancel(b, ids[0], "customer left")
	waitFor(t, func() bool { return held.ds[held.indexOf(t, ids[0])].Cancelled() != nil })
	sctx, stop := context.WithTimeout(ctx, 500*time.Millisecond)
	defer stop()
	if _, err := b.Shutdown(sctx); !errors.Is(err, rowactor.ErrNotDrained) {
		t.Fatalf("Shutdown with a batch handler stuck: %v, want ErrNotDrained", err)
	}
	switch err, st := h.cancelReturned(cancelled), h.row(ids[0]); {
	case err == nil:
		if st.processedAt == nil || st.lastError == nil || *st.lastError != dialects.CancelledPrefix+"customer left" {
			t.Fatalf("Cancel returned nil, and the row is %+v (not cancelled: Shutdown gave it back)", st)
		}
	case !errors.Is(err, rowactor.ErrClosed):
		t.Fatalf("Cancel cut short by Shutdown: %v, want ErrClosed", err)
	case !st.exists || st.processedAt != nil || st.lastError != nil:
		t.Fatalf("Cancel returned %v, and the row is %+v", err, st)
	}
	if st := h.row(ids[1]); !st.exists || st.processedAt != nil || st.lastError != nil {
		t.Fatalf("the batch's other row after Shutdown gave the batch back: %+v", st)
	}
}

// batchCancelRacesClaimScenario: only this broker consumes the table, so a row is never
// in work under another holder; a Cancel issued right after each publish (while a batch
// claim takes the row, the batch starts, runs or settles) must end the row (nil) or find
// it finished (ErrFinished), never refuse it as another's.
func batchCancelRacesClaimScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	h.subscribeBatch(b, 4, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
		}
		return acks(len(ds))
	}, rowactor.Workers(2))
	const n = 60
	for i := 0; i < n; i++ {
		id := h.publish(b, 1)[0]
		if i%3 == 1 {
			time.Sleep(time.Duration(i%7) * 100 * time.Microsecond)
		}
		bounded, stop := context.WithTimeout(ctx, 15*time.Second)
		err := b.Cancel(bounded, h.table, id, "raced the claim")
		stop()
		st := h.row(id)
		switch {
		case err == nil && (st.lastError == nil || *st.lastError != dialects.CancelledPrefix+"raced the claim"):
			t.Fatalf("Cancel of row %d (#%d) right after its publish returned nil, and the row is %+v", id, i, st)
		case err != nil && !errors.Is(err, rowactor.ErrFinished):
			t.Fatalf("Cancel of row %d (#%d) right after its publish: %v", id, i, err)
		}
	}
}

// batchCancelKilledConnectionScenario: the server ends the batch's connection while a
// row of it is cancelled; the cancelled row must still end cancelled, the other row be
// handled, once each.
func batchCancelKilledConnectionScenario(t *testing.T, h *harness, form rowactor.Form) {
	d, kill := killablePool(t, h)
	b := h.brokerOn(d)
	ids := h.publish(b, 2)
	got := make(chan heldBatch, 1)
	stuck, open := h.gate()
	calls := 0
	h.subscribeBatch(b, 2, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		calls++
		if calls > 1 {
			return acks(len(ds))
		}
		got <- heldBatch{ctx, ds}
		<-stuck
		return acks(len(ds))
	}, rowactor.Workers(1))
	held := h.waitBatch(got, 2)
	done := h.startCancel(b, ids[0], "gone")
	waitFor(t, func() bool { return held.ds[held.indexOf(t, ids[0])].Cancelled() != nil })
	if n := kill(); n == 0 {
		t.Fatal("no connection killed")
	}
	time.Sleep(100 * time.Millisecond)
	open()
	err := h.cancelReturned(done)
	t.Logf("Cancel after the kill: %v", err)
	deadline := time.Now().Add(15 * time.Second)
	for {
		st0, st1 := h.row(ids[0]), h.row(ids[1])
		ok0 := !st0.exists || st0.processedAt != nil
		ok1 := !st1.exists || st1.processedAt != nil
		if ok0 && ok1 {
			// The cancel's own commit died with the connection: the row went back, and
			// either the Cancel cancelled it in the table (nil), or a redelivery ended it
			// first and the Cancel says so. Never nil for a row that does not end as
			// cancelled, never an error for one that does.
			cancelled := st0.exists && st0.lastError != nil && *st0.lastError == dialects.CancelledPrefix+"gone"
			if h.table.ProcessedAt == "" {
				cancelled = !st0.exists && err == nil
			}
			switch {
			case err == nil && !cancelled:
				t.Fatalf("Cancel returned nil, the row %+v", st0)
			case err != nil && (cancelled || !errors.Is(err, rowactor.ErrFinished) && !errors.Is(err, rowactor.ErrNotFound)):
				t.Fatalf("Cancel returned %v, the row %+v", err, st0)
			}
			if st1.exists && st1.lastError != nil {
				t.Fatalf("the other row: %+v", st1)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rows %+v %+v did not end (Cancel said %v)\nlogs:\n%s", st0, st1, err, h.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// batchCancelAbandonedHandlerReturnsScenario: the handler of a batch given up on returns
// just after the abandon settled a cancelled row of it (-race sees what the two
// goroutines share).
func batchCancelAbandonedHandlerReturnsScenario(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	ids := h.publish(b, 2)
	got := make(chan heldBatch, 1)
	returned := make(chan struct{})
	var calls atomic.Int32
	h.subscribeBatch(b, 2, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		if calls.Add(1) > 1 {
			return acks(len(ds))
		}
		got <- heldBatch{ctx, ds}
		defer close(returned)
		// Ignores its context, and returns on its own after the batch was given up on
		// (the deadline, 100ms, and the grace, 1s): nothing orders it after the abandon.
		time.Sleep(1600 * time.Millisecond)
		return acks(len(ds))
	}, rowactor.Timeout(100*time.Millisecond), rowactor.Workers(1))
	h.waitBatch(got, 2)
	if err := h.cancelReturned(h.startCancel(b, ids[0], "stuck")); err != nil {
		t.Fatalf("Cancel: %v\nlogs:\n%s", err, h.logs.String())
	}
	<-returned
	h.waitSettled(3) // the batch's two rows, then the released row's redelivery
	h.wantCancelledRow(ids[0], "stuck", 1)
	time.Sleep(100 * time.Millisecond)
}

// batchCancelTwiceBatchOfOneScenario: two Cancels of the one row of a batch of one: the
// context ends, both return nil (the second waits for the first's end), the row is
// settled once.
func batchCancelTwiceBatchOfOneScenario(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	ids := h.publish(b, 1)
	got, saw := make(chan heldBatch, 1), make(chan error, 1)
	h.subscribeBatch(b, 1, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		got <- heldBatch{ctx, ds}
		select {
		case <-ctx.Done():
			saw <- context.Cause(ctx)
		case <-time.After(15 * time.Second):
			saw <- nil
		}
		return []rowactor.Outcome{rowactor.Retry()}
	})
	h.waitBatch(got, 1)
	c1, c2 := h.startCancel(b, ids[0], "one"), h.startCancel(b, ids[0], "one")
	for _, c := range []<-chan error{c1, c2} {
		if err := h.cancelReturned(c); err != nil {
			t.Fatalf("Cancel: %v", err)
		}
	}
	if cause := <-saw; !errors.Is(cause, rowactor.ErrCancelled) {
		t.Fatalf("cause %v", cause)
	}
	ss := h.waitSettled(1)
	wantCancelledSettlement(t, ss[0])
	h.quiet(300 * time.Millisecond)
	if st := h.row(ids[0]); st.exists {
		t.Fatalf("row %+v, want it deleted", st)
	}
}

// batchCancelFromOwnHandlerScenario: Broker.Cancel says that called from the row's own
// handler it would wait for itself, and that passed the handler's ctx it returns at once.
// A batch handler that does so for one of its rows must not wait for its own batch.
func batchCancelFromOwnHandlerScenario(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	ids := h.publish(b, 2)
	took := make(chan time.Duration, 1)
	var calls atomic.Int32
	h.subscribeBatch(b, 2, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		if calls.Add(1) > 1 {
			return acks(len(ds))
		}
		bounded, stop := context.WithTimeout(ctx, 3*time.Second) // the test's bound, not the advice's
		defer stop()
		began := time.Now()
		err := b.Cancel(bounded, h.table, ds[0].ID(), "self")
		took <- time.Since(began)
		t.Logf("Cancel from the handler: %v", err)
		return acks(len(ds))
	})
	select {
	case d := <-took:
		if d > time.Second {
			t.Errorf("Cancel of a row of its own batch, passed the handler's ctx, waited %v for the batch itself", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no batch")
	}
	h.waitSettled(2)
	h.wantCancelledRow(ids[0], "self", 1)
}

// batchCancelMixedOutcomesRaceScenario: every row of batches whose handler returns Ack,
// Retry or Drop is cancelled while the handler returns; each Cancel's answer must match
// where its row ends.
func batchCancelMixedOutcomesRaceScenario(t *testing.T, h *harness, form rowactor.Form) {
	const n = 6
	for round := 0; round < 6; round++ {
		b := h.broker()
		ids := h.publish(b, n)
		var calls atomic.Int32
		started := make(chan struct{}, 1)
		h.subscribeBatch(b, n, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
			if calls.Add(1) == 1 {
				started <- struct{}{}
				time.Sleep(5 * time.Millisecond)
			}
			out := make([]rowactor.Outcome, len(ds))
			for i := range out {
				switch i % 3 {
				case 0:
					out[i] = rowactor.Ack()
				case 1:
					out[i] = rowactor.Retry()
				default:
					out[i] = rowactor.Drop()
				}
			}
			return out
		})
		<-started
		errs := make([]error, n)
		done := make(chan int, n)
		for i, id := range ids {
			go func() {
				bounded, stop := context.WithTimeout(context.Background(), 15*time.Second)
				defer stop()
				time.Sleep(time.Duration(i*round) * time.Millisecond / 2)
				errs[i] = b.Cancel(bounded, h.table, id, "raced")
				done <- i
			}()
		}
		for range ids {
			<-done
		}
		for i, id := range ids {
			st, err := h.row(id), errs[i]
			raced := st.lastError != nil && *st.lastError == dialects.CancelledPrefix+"raced"
			switch {
			case err == nil:
				if st.processedAt == nil || !raced {
					t.Fatalf("round %d row %d: Cancel returned nil, and the row is %+v", round, id, st)
				}
			case errors.Is(err, rowactor.ErrFinished):
				if st.processedAt == nil || raced {
					t.Fatalf("round %d row %d: Cancel returned %v, and the row is %+v", round, id, err, st)
				}
			default:
				t.Fatalf("round %d row %d: Cancel returned %v, row %+v\nlogs:\n%s", round, id, err, st, h.logs.String())
			}
		}
		ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := b.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		stop()
	drain:
		for {
			select {
			case <-h.settled:
			default:
				break drain
			}
		}
	}
}

// batchCancelPauseScenario: a Pause while a batch with a cancelled row is in work lets
// the batch settle as usual: the row ends cancelled, Cancel returns nil, the other row is
// acked.
func batchCancelPauseScenario(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	ids := h.publish(b, 2)
	got := make(chan heldBatch, 1)
	stuck, open := h.gate()
	sub := h.subscribeBatch(b, 2, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		got <- heldBatch{ctx, ds}
		<-stuck
		return acks(len(ds))
	})
	held := h.waitBatch(got, 2)
	done := h.startCancel(b, ids[1], "paused")
	waitFor(t, func() bool { return held.ds[held.indexOf(t, ids[1])].Cancelled() != nil })
	ctx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	if err := sub.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	open()
	if err := h.cancelReturned(done); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	h.wantCancelledRow(ids[1], "paused", 1)
	ss := byID(t, h.waitSettled(2))
	wantCancelledSettlement(t, ss[ids[1]])
	if s := ss[ids[0]]; s.Err != nil || s.Step != "ack" {
		t.Fatalf("the other row: %+v", s)
	}
	h.quiet(200 * time.Millisecond)
}
