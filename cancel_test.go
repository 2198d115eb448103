package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// Cancel of a row in work, over every (database, form, transactional): the delivery of
// this broker's that holds the row has its handler's context cancelled with a cause that
// wraps ErrCancelled, and settles the row as a cancel of a queued row would, whatever the
// handler returns; another broker's Cancel of the same row is refused.

func withClearedUniqueKey(t *rowactor.Table) {
	t.UniqueKey, t.ClearUniqueKeyAtAck = "unique_key", true
}

var cancelInWorkScenarios = []scenario{
	{
		name:   "Cancel of a row in work cancels its handler's context and ends the row with the reason, whatever the handler returns",
		shapes: []tableShape{withProcessedAt, withError, withClearedUniqueKey},
		run:    cancelInWorkScenario,
	},
	{
		name: "Cancel of a row in work deletes it where the table keeps no finished rows",
		run:  cancelInWorkDeletesScenario,
	},
	{
		name:   "Cancel of a row whose handler ignores its context ends the row once the delivery gives up on the handler",
		shapes: []tableShape{withProcessedAt, withError},
		run:    cancelIgnoredScenario,
	},
	{
		name:   "Cancel of a claimed row waiting for a worker ends it without calling the handler",
		shapes: []tableShape{withProcessedAt, withError},
		run:    cancelWaitingScenario,
	},
	{
		name:   "Cancel racing the handler's return reports what the table shows",
		shapes: []tableShape{withProcessedAt, withError},
		run:    cancelRaceScenario,
	},
}

// handlerSaw is what a handler blocked until its context ended read from it.
type handlerSaw struct {
	err, cause error
	// before and after are Delivery.Cancelled before the cancel and once the context ended.
	before, after error
}

func cancelInWorkScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	other := h.second()
	id, err := b.Publish(ctx, h.table, h.queue, []byte("cancel me"), rowactor.Unique("k1"))
	if err != nil {
		t.Fatal(err)
	}
	started, saw := make(chan int64, 1), make(chan handlerSaw, 1)
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if d.ID() != id {
			return rowactor.Ack() // the row published again below
		}
		h.note(ctx, d, "written before the cancel")
		before := d.Cancelled()
		started <- d.ID()
		<-ctx.Done()
		saw <- handlerSaw{ctx.Err(), context.Cause(ctx), before, d.Cancelled()}
		return rowactor.Ack() // the cancel wins over it
	}, leaseOptions(form, time.Minute)...)
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatalf("the row was not delivered\nlogs:\n%s", h.logs.String())
	}
	before := h.row(id)

	// Another broker (another process, as far as the table can tell) does not hold the
	// row: its Cancel is refused and changes nothing. (SQLite has one writer: in
	// transactional mode the handler's transaction holds it, so another broker's
	// statement that would write fails busy instead, having changed nothing either.)
	err = other.Cancel(ctx, h.table, id, "not yours")
	if !errors.Is(err, rowactor.ErrInWork) && (err == nil || h.drv.name != "sqlite" || !h.tx) {
		t.Fatalf("another broker's Cancel of the row in work: %v, want ErrInWork", err)
	}
	if st := h.row(id); !sameState(st, before) {
		t.Fatalf("another broker's refused Cancel changed the row: %+v, was %+v", st, before)
	}
	select {
	case s := <-saw:
		t.Fatalf("the handler's context ended on another broker's Cancel: %+v", s)
	default:
	}

	bounded, stop := context.WithTimeout(ctx, 15*time.Second)
	defer stop()
	if err := b.Cancel(bounded, h.table, id, "customer left"); err != nil {
		t.Fatalf("Cancel of the row in work: %v\nlogs:\n%s", err, h.logs.String())
	}
	s := <-saw // sent before the handler returned, so before Cancel returned
	if !errors.Is(s.err, context.Canceled) || !errors.Is(s.cause, rowactor.ErrCancelled) || !strings.Contains(s.cause.Error(), "customer left") {
		t.Fatalf("the handler's context: Err %v, Cause %v; want Canceled and a cause wrapping ErrCancelled with the reason", s.err, s.cause)
	}
	if s.before != nil || s.after != s.cause {
		t.Fatalf("Delivery.Cancelled: %v before the cancel, %v after; want nil, then the context's cause", s.before, s.after)
	}
	st := h.row(id)
	if !st.exists || st.processedAt == nil || st.lastError == nil || *st.lastError != dialects.CancelledPrefix+"customer left" || st.lockedUntil != nil {
		t.Fatalf("the cancelled row: %+v, want it processed with the reason and no lease", st)
	}
	if st.attempt != before.attempt {
		t.Fatalf("the cancelled row's attempt %d, was %d in work", st.attempt, before.attempt)
	}
	settled := h.waitSettled(1)[0]
	if settled.ID != id || settled.Err != nil || settled.Step != "ack" || settled.Outcome.String() != "cancel" ||
		!errors.Is(settled.HandlerErr, rowactor.ErrCancelled) {
		t.Fatalf("the cancelled delivery's settlement: %+v", settled)
	}
	h.wantKept(map[string]int{"written before the cancel": 0})
	// The unique key was cleared with the row, as a Drop clears it.
	again, err := b.Publish(ctx, h.table, h.queue, []byte("again"), rowactor.Unique("k1"))
	if err != nil || again == id {
		t.Fatalf("Publish of the cancelled row's unique key: id %d (the cancelled row is %d), %v", again, id, err)
	}
	if err := b.Cancel(ctx, h.table, id, "twice"); !errors.Is(err, rowactor.ErrFinished) {
		t.Fatalf("Cancel of the cancelled row: %v, want ErrFinished", err)
	}
	if _, err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// sameState compares two reads of a row by value.
func sameState(a, b rowState) bool {
	eqT := func(x, y *time.Time) bool { return x == nil && y == nil || x != nil && y != nil && x.Equal(*y) }
	eqS := func(x, y *string) bool { return x == nil && y == nil || x != nil && y != nil && *x == *y }
	return a.exists == b.exists && a.attempt == b.attempt && a.group == b.group && eqT(a.lockedUntil, b.lockedUntil) &&
		eqT(a.retryAfter, b.retryAfter) && eqT(a.processedAt, b.processedAt) && eqS(a.lastError, b.lastError)
}

func cancelInWorkDeletesScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	id := h.publish(b, 1)[0]
	started := make(chan struct{}, 1)
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		h.note(ctx, d, "discarded")
		started <- struct{}{}
		<-ctx.Done()
		return rowactor.Retry() // the cancel wins over it
	}, leaseOptions(form, time.Minute)...)
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatalf("the row was not delivered\nlogs:\n%s", h.logs.String())
	}
	bounded, stop := context.WithTimeout(ctx, 15*time.Second)
	defer stop()
	if err := b.Cancel(bounded, h.table, id, "gone"); err != nil {
		t.Fatalf("Cancel of the row in work: %v", err)
	}
	if h.row(id).exists {
		t.Fatal("the cancelled row is still in a table that keeps no finished rows")
	}
	h.wantKept(map[string]int{"discarded": 0})
	if s := h.waitSettled(1)[0]; s.ID != id || s.Err != nil || s.Step != "ack" {
		t.Fatalf("the cancelled delivery's settlement: %+v", s)
	}
	h.quiet(200 * time.Millisecond) // the handler's Retry did not bring it back
	if err := b.Cancel(ctx, h.table, id, "again"); !errors.Is(err, rowactor.ErrNotFound) {
		t.Fatalf("Cancel of the deleted row: %v, want ErrNotFound", err)
	}
}

// cancelRaceScenario cancels rows while their handlers return Ack on their own: each
// Cancel either won (nil: the row ends with the reason) or came after the settlement began
// (ErrFinished: the row ends acked, without it). Never both, never neither.
func cancelRaceScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	const n = 6
	ids := h.publish(b, n)
	var mu sync.Mutex
	running := map[int64]chan struct{}{}
	started := make(chan int64, n)
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		go1 := make(chan struct{})
		mu.Lock()
		running[d.ID()] = go1
		mu.Unlock()
		started <- d.ID()
		select {
		case <-go1:
		case <-ctx.Done():
		}
		return rowactor.Ack()
	}, append(leaseOptions(form, time.Minute), rowactor.Workers(n))...)
	var wg sync.WaitGroup
	errs := make(map[int64]error, n)
	for i := 0; i < n; i++ {
		var id int64
		select {
		case id = <-started:
		case <-time.After(15 * time.Second):
			t.Fatalf("%d of %d rows delivered\nlogs:\n%s", i, n, h.logs.String())
		}
		mu.Lock()
		release := running[id]
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				close(release) // the handler returns as the Cancel comes
			}
			bounded, stop := context.WithTimeout(ctx, 15*time.Second)
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

// cancelIgnoredScenario: a handler that ignores its cancelled context is abandoned at its
// deadline's grace like any other, and the row its delivery gives back is cancelled then
// (or, when a claim took it again first, in its next delivery).
func cancelIgnoredScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	id := h.publish(b, 1)[0]
	started, stuck := make(chan struct{}, 4), make(chan struct{})
	defer close(stuck)
	var calls sync.Mutex
	n := 0
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		calls.Lock()
		n++
		first := n == 1
		calls.Unlock()
		started <- struct{}{}
		if first {
			<-stuck // ignores its context
			return rowactor.Ack()
		}
		<-ctx.Done()
		return rowactor.Ack()
	}, append(leaseOptions(form, time.Minute), rowactor.Timeout(100*time.Millisecond))...)
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatalf("the row was not delivered\nlogs:\n%s", h.logs.String())
	}
	bounded, stop := context.WithTimeout(ctx, 15*time.Second)
	defer stop()
	began := time.Now()
	if err := b.Cancel(bounded, h.table, id, "stuck"); err != nil {
		t.Fatalf("Cancel of a row whose handler ignores its context: %v\nlogs:\n%s", err, h.logs.String())
	}
	if took := time.Since(began); took < 500*time.Millisecond {
		t.Fatalf("Cancel returned after %v, before the delivery gave up on its handler", took)
	}
	st := h.row(id)
	if st.processedAt == nil || st.lastError == nil || *st.lastError != dialects.CancelledPrefix+"stuck" {
		t.Fatalf("the cancelled row: %+v", st)
	}
}

// cancelWaitingScenario: a row claimed behind another of its partition key waits in the
// subscription for it (WorkersByKey); a Cancel takes it out and ends it without calling
// the handler, and the row in work goes on.
func cancelWaitingScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	ids := h.publish(b, 2)
	started, release := make(chan int64, 2), make(chan struct{})
	sub := h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- d.ID()
		<-release
		return rowactor.Ack()
	}, append(leaseOptions(form, time.Minute), rowactor.WorkersByKey(2, func(*rowactor.Delivery) string { return "one key" }))...)
	var held int64
	select {
	case held = <-started:
	case <-time.After(15 * time.Second):
		t.Fatalf("no row was delivered\nlogs:\n%s", h.logs.String())
	}
	waiting := ids[0] + ids[1] - held
	waitFor(t, func() bool { return sub.InWork() == 2 }) // claimed, waiting for its key
	bounded, stop := context.WithTimeout(ctx, 15*time.Second)
	defer stop()
	if err := b.Cancel(bounded, h.table, waiting, "not needed"); err != nil {
		t.Fatalf("Cancel of the waiting row: %v\nlogs:\n%s", err, h.logs.String())
	}
	st := h.row(waiting)
	if st.processedAt == nil || st.lastError == nil || *st.lastError != dialects.CancelledPrefix+"not needed" || st.lockedUntil != nil {
		t.Fatalf("the cancelled waiting row: %+v", st)
	}
	if s := h.waitSettled(1)[0]; s.ID != waiting || s.Err != nil || s.Step != "ack" || !errors.Is(s.HandlerErr, rowactor.ErrCancelled) {
		t.Fatalf("the waiting row's settlement: %+v", s)
	}
	if st := h.row(held); st.processedAt != nil {
		t.Fatalf("the row in work was settled too: %+v", st)
	}
	close(release)
	if s := h.waitSettled(1)[0]; s.ID != held || s.Err != nil || s.Outcome.String() != "ack" {
		t.Fatalf("the row in work's settlement: %+v", s)
	}
	select {
	case id := <-started:
		t.Fatalf("the handler was called for row %d after the cancel", id)
	default:
	}
}

// Cancel's answer says what became of the row: never nil for a cancel Shutdown cut short,
// never ErrInWork for a row this broker's own subscription is claiming.
var cancelAnswerScenarios = []scenario{
	{
		name:   "Cancel cut short by Shutdown does not report a cancel that never took effect",
		shapes: []tableShape{withProcessedAt, withError},
		run:    cancelCutShortByShutdownScenario,
	},
	{
		name:   "Cancel racing this broker's own claim never answers ErrInWork",
		shapes: []tableShape{withProcessedAt, withError},
		run:    cancelRacingOwnClaimScenario,
	},
}

func TestCancelAnswersWhatBecameOfTheRow(t *testing.T) { runModeMatrix(t, cancelAnswerScenarios) }

// cancelCutShortByShutdownScenario: a handler that ignores its cancelled context (and has
// no deadline) is still running when Shutdown's drain ends; Shutdown gives its row back
// to the queue. The Cancel waiting for that delivery must then not return nil (nil means
// the row ended as cancelled): either the row is cancelled, or Cancel says it was not.
func cancelCutShortByShutdownScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	id := h.publish(b, 1)[0]
	started, sawCancel, stuck := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- struct{}{}
		<-ctx.Done()
		sawCancel <- struct{}{}
		<-stuck // ignores its context
		return rowactor.Ack()
	}, leaseOptions(form, time.Minute)...)
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatalf("the row was not delivered\nlogs:\n%s", h.logs.String())
	}
	cancelled := make(chan error, 1)
	go func() {
		bounded, stop := context.WithTimeout(ctx, 20*time.Second)
		defer stop()
		cancelled <- b.Cancel(bounded, h.table, id, "customer left")
	}()
	select {
	case <-sawCancel:
	case <-time.After(15 * time.Second):
		t.Fatal("the handler's context was not cancelled")
	}
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		sctx, stop := context.WithTimeout(ctx, 200*time.Millisecond) // the handler is stuck already: any drain ends with it running
		defer stop()
		_, _ = b.Shutdown(sctx)
	}()
	var err error
	select {
	case err = <-cancelled:
	case <-time.After(15 * time.Second):
		close(stuck)
		t.Fatal("Cancel did not return after Shutdown")
	}
	close(stuck) // the late handler's return changes nothing
	<-shut
	st := h.row(id)
	cancelledRow := st.processedAt != nil && st.lastError != nil && *st.lastError == dialects.CancelledPrefix+"customer left"
	if err == nil && !cancelledRow {
		t.Fatalf("Cancel returned nil, and the row is %+v (not cancelled: Shutdown gave it back)", st)
	}
	if err != nil && !errors.Is(err, rowactor.ErrClosed) && !cancelledRow {
		t.Fatalf("Cancel cut short by Shutdown: %v, want ErrClosed", err)
	}
}

// cancelRacingOwnClaimScenario: only this broker consumes the table, so a row is
// never in work under another holder; a Cancel issued right after each publish (while
// the subscription's claim takes the row, hands it over, starts it or settles it) must
// end the row (nil) or find it finished (ErrFinished), never refuse it as another's.
func cancelRacingOwnClaimScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	opts := append(leaseOptions(form, time.Minute), rowactor.Workers(2))
	if form == rowactor.FormLease {
		opts = append(opts, rowactor.Prefetch(2))
	}
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
		}
		return rowactor.Ack()
	}, opts...)
	const n = 60
	for i := 0; i < n; i++ {
		id := h.publish(b, 1)[0]
		if i%3 == 1 {
			time.Sleep(time.Duration(i%7) * 100 * time.Microsecond)
		}
		bounded, stop := context.WithTimeout(ctx, 15*time.Second)
		err := b.Cancel(bounded, h.table, id, "raced the claim")
		stop()
		if err != nil && !errors.Is(err, rowactor.ErrFinished) {
			t.Fatalf("Cancel of row %d (#%d) right after its publish: %v", id, i, err)
		}
	}
}

func withCancelRequests(t *rowactor.Table) { t.CancelRequests = t.Name + "_cancels" }

// Cancel of a row in work in another process, through the table's CancelRequests, over
// every (database, form, transactional).
var cancelElsewhereScenarios = []scenario{
	{
		name:   "Cancel of a row that another process holds reaches its handler through the cancel-request table and ends the row with the reason",
		shapes: []tableShape{withProcessedAt, withError, withCancelRequests},
		run:    cancelElsewhereScenario,
	},
	{
		name:   "a cancel request left by an asker that died is carried out by the holder once it reads it",
		shapes: []tableShape{withProcessedAt, withError, withCancelRequests},
		run:    cancelRequestOutlivesItsAskerScenario,
	},
	{
		name:   "a Cancel whose context ends while another process holds the row withdraws its request",
		forms:  []rowactor.Form{rowactor.FormLease},
		shapes: []tableShape{withProcessedAt, withCancelRequests},
		run:    cancelAskerGivesUpScenario,
	},
	{
		name:   "two processes cancelling one row held by a third both see it cancelled",
		shapes: []tableShape{withProcessedAt, withError, withCancelRequests},
		run:    cancelByTwoAskersScenario,
	},
	{
		name:   "a row its delivery moves to its dead letter as another process asks to cancel it stays a dead letter",
		shapes: []tableShape{withProcessedAt, withError, withCancelRequests},
		run:    cancelRacingDeadLetterScenario,
	},
	{
		name:   "a row its delivery moves to its dead letter as another process asks to cancel it stays a dead letter, in a table that keeps no finished rows",
		shapes: []tableShape{withCancelRequests},
		run:    cancelRacingDeadLetterScenario,
	},
	{
		name:   "a row its delivery acks and deletes as another process asks to cancel it is reported finished",
		shapes: []tableShape{withCancelRequests},
		run:    cancelRacingAckScenario,
	},
	{
		name:      "the cancel of a queued row fenced by its group changes nothing once the row left the group or died",
		shapes:    []tableShape{withProcessedAt, withError, withDeadAt},
		plainOnly: true, // no delivery: the mode changes nothing
		run:       fencedCancelScenario,
	},
	{
		name:      "a subscription to a table whose cancel-request table is missing is refused before anything is claimed",
		shapes:    []tableShape{withCancelRequests},
		plainOnly: true, // refused before any delivery: the mode changes nothing
		run:       cancelRequestsMissingScenario,
	},
}

// holdUntilCancelled subscribes b with a handler that holds the first delivery until its
// context ends, then reports what it read from it and returns Ack (which the cancel
// overrides). It returns once the row is in work.
func holdUntilCancelled(t *testing.T, h *harness, b *rowactor.Broker, form rowactor.Form) (id int64, saw chan handlerSaw) {
	t.Helper()
	id = h.publish(b, 1)[0]
	started, saw := make(chan struct{}, 1), make(chan handlerSaw, 1)
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- struct{}{}
		<-ctx.Done()
		saw <- handlerSaw{ctx.Err(), context.Cause(ctx), nil, d.Cancelled()}
		return rowactor.Ack()
	}, leaseOptions(form, time.Minute)...)
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatalf("the row was not delivered\nlogs:\n%s", h.logs.String())
	}
	return id, saw
}

// wantCancelledInWork checks what a cancel of a row in work leaves: the handler's context
// cancelled with the reason, the row processed with it and its lease gone, the attempt
// as it was in work, and the settlement a cancel's.
func wantCancelledInWork(t *testing.T, h *harness, id int64, saw chan handlerSaw, reason string, attempt int) {
	t.Helper()
	var s handlerSaw
	select {
	case s = <-saw:
	case <-time.After(15 * time.Second):
		t.Fatalf("the handler's context was not cancelled\nlogs:\n%s", h.logs.String())
	}
	if !errors.Is(s.err, context.Canceled) || !errors.Is(s.cause, rowactor.ErrCancelled) || !strings.Contains(s.cause.Error(), reason) {
		t.Fatalf("the handler's context: Err %v, Cause %v; want Canceled and a cause wrapping ErrCancelled with the reason", s.err, s.cause)
	}
	settled := h.waitSettled(1)[0]
	if settled.ID != id || settled.Err != nil || settled.Step != "ack" || settled.Outcome.String() != "cancel" {
		t.Fatalf("the cancelled delivery's settlement: %+v", settled)
	}
	st := h.row(id)
	if !st.exists || st.processedAt == nil || st.lastError == nil || *st.lastError != dialects.CancelledPrefix+reason || st.lockedUntil != nil || st.attempt != attempt {
		t.Fatalf("the cancelled row: %+v, want it processed with the reason, no lease, attempt %d", st, attempt)
	}
}

func cancelElsewhereScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	holder := h.broker()
	id, saw := holdUntilCancelled(t, h, holder, form)
	inWork := h.row(id)

	asker := h.second() // another process, as far as the tables can tell
	bounded, stop := context.WithTimeout(ctx, 15*time.Second)
	defer stop()
	start := time.Now()
	if err := asker.Cancel(bounded, h.table, id, "customer left"); err != nil {
		t.Fatalf("another process's Cancel of the row in work: %v\nlogs:\n%s", err, h.logs.String())
	}
	t.Logf("the other process's Cancel returned after %v", time.Since(start).Round(time.Millisecond))
	wantCancelledInWork(t, h, id, saw, "customer left", inWork.attempt)
	// The asker forgot its request once answered.
	if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.CancelRequests); n != 0 {
		t.Fatalf("%d cancel requests left after the answer, want 0", n)
	}
	if err := asker.Cancel(ctx, h.table, id, "twice"); !errors.Is(err, rowactor.ErrFinished) {
		t.Fatalf("Cancel of the cancelled row: %v, want ErrFinished", err)
	}
}

func cancelRequestOutlivesItsAskerScenario(t *testing.T, h *harness, form rowactor.Form) {
	holder := h.broker()
	id, saw := holdUntilCancelled(t, h, holder, form)
	inWork := h.row(id)

	// A request recorded as Cancel records it, by an asker that died since.
	reqs, err := dialects.CancelRequestsOf(h.d, h.table)
	if err != nil {
		t.Fatal(err)
	}
	if err := reqs.Request(context.Background(), id, 42, "asked and gone"); err != nil {
		t.Fatal(err)
	}
	wantCancelledInWork(t, h, id, saw, "asked and gone", inWork.attempt)
	// Nobody waits for the answer: it stays, for whoever reads the table.
	waitFor(t, func() bool {
		return h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.CancelRequests+" WHERE answer = ?", dialects.CancelAnswerCancelled) == 1
	})
}

// cancelAskerGivesUpScenario: a Cancel whose context ends while another process holds
// the row (here a lease whose process is gone) reports the row in work, and withdraws its
// request, so that none outlives its asker.
func cancelAskerGivesUpScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	id := h.publish(b, 1)[0]
	h.exec(fmt.Sprintf("UPDATE %s SET locked_until = ? WHERE id = ?", h.table.Name), h.drv.timeValue(time.Now().Add(time.Hour)), id)
	before := h.row(id)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := b.Cancel(ctx, h.table, id, "asked and gone")
	if !errors.Is(err, rowactor.ErrInWork) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a Cancel whose context ended while the row was in work elsewhere: %v, want ErrInWork and the deadline", err)
	}
	if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.CancelRequests); n != 0 {
		t.Fatalf("%d requests left after the asker gave up, want its request withdrawn", n)
	}
	if st := h.row(id); !sameState(st, before) {
		t.Fatalf("the row changed: %+v, was %+v", st, before)
	}
}

func cancelRequestsMissingScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	h.publish(b, 1)
	h.exec("DROP TABLE " + h.table.CancelRequests)
	_, err := b.Subscribe(context.Background(), h.table, h.queue, func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		t.Error("a row was delivered")
		return rowactor.Ack()
	})
	var ce *rowactor.ConfigError
	if !errors.As(err, &ce) || ce.Option != "Table.CancelRequests" || !strings.Contains(ce.Fix, "ApplySchema") {
		t.Fatalf("Subscribe with the cancel-request table missing: %v, want a *ConfigError on Table.CancelRequests naming ApplySchema", err)
	}
	h.quiet(100 * time.Millisecond)
}

func cancelByTwoAskersScenario(t *testing.T, h *harness, form rowactor.Form) {
	holder := h.broker()
	id, saw := holdUntilCancelled(t, h, holder, form)
	inWork := h.row(id)
	askers := []*rowactor.Broker{h.second(), h.second()}
	ctx, stop := context.WithTimeout(context.Background(), 15*time.Second)
	defer stop()
	errs := make([]error, len(askers))
	asked := make([]time.Time, len(askers))
	var wg sync.WaitGroup
	for i, a := range askers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			asked[i] = time.Now()
			errs[i] = a.Cancel(ctx, h.table, id, "two askers")
		}()
	}
	wg.Wait()
	wantCancelledInWork(t, h, id, saw, "two askers", inWork.attempt)
	// An asker whose goroutine started only after the other's cancel ended the row (the
	// suite's load can delay it that long) finds a finished row, as any later Cancel does:
	// ErrFinished. One that asked while the row was in work sees it cancelled.
	ended := *h.row(id).processedAt
	for i, err := range errs {
		late := asked[i].After(ended) && errors.Is(err, rowactor.ErrFinished)
		if err != nil && !late {
			t.Errorf("asker %d's Cancel of the row both asked to cancel (asked %v, the row ended %v): %v, want nil",
				i, asked[i].Format(time.RFC3339Nano), ended.Format(time.RFC3339Nano), err)
		}
	}
	if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.CancelRequests); n != 0 {
		t.Fatalf("%d requests left after both askers returned, want none", n)
	}
}

// settleAsAsked subscribes b with a handler that waits for a cancel request to be
// recorded, then returns outcome at once: its settlement and the holder's cancel race,
// the settlement mostly first (the holder reads requests every half second).
func settleAsAsked(t *testing.T, h *harness, b *rowactor.Broker, form rowactor.Form, outcome rowactor.Outcome, opts ...rowactor.SubscribeOption) (id int64) {
	t.Helper()
	id = h.publish(b, 1)[0]
	started := make(chan struct{}, 1)
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- struct{}{}
		for h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.CancelRequests) == 0 && ctx.Err() == nil {
			time.Sleep(2 * time.Millisecond)
		}
		return outcome
	}, append(leaseOptions(form, time.Minute), opts...)...)
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatalf("the row was not delivered\nlogs:\n%s", h.logs.String())
	}
	return id
}

func cancelRacingDeadLetterScenario(t *testing.T, h *harness, form rowactor.Form) {
	holder := h.broker()
	id := settleAsAsked(t, h, holder, form, rowactor.DeadLetter(errors.New("poison")), rowactor.DeadLetterGroup("dead"))
	ctx, stop := context.WithTimeout(context.Background(), 15*time.Second)
	defer stop()
	err := h.second().Cancel(ctx, h.table, id, "asked as it died")
	s := h.waitSettled(1)[0]
	st := h.row(id)
	switch s.Step {
	case "dead_letter": // the delivery settled first: the dead letter stays as it is
		if !errors.Is(err, rowactor.ErrFinished) || !st.exists || st.group != "dead" || st.processedAt != nil {
			t.Fatalf("the delivery moved the row to its dead letter first: Cancel %v (want ErrFinished), row %+v (want it in group dead, unprocessed)", err, st)
		}
	case "ack": // the holder's cancel won
		if err != nil || s.Outcome.String() != "cancel" {
			t.Fatalf("the holder's cancel settled first (%+v): Cancel %v, want nil", s, err)
		}
	default:
		t.Fatalf("settlement %+v", s)
	}
}

func cancelRacingAckScenario(t *testing.T, h *harness, form rowactor.Form) {
	holder := h.broker()
	id := settleAsAsked(t, h, holder, form, rowactor.Ack())
	ctx, stop := context.WithTimeout(context.Background(), 15*time.Second)
	defer stop()
	err := h.second().Cancel(ctx, h.table, id, "asked as it finished")
	s := h.waitSettled(1)[0]
	switch s.Outcome.String() {
	case "ack":
		if !errors.Is(err, rowactor.ErrFinished) {
			t.Fatalf("the delivery acked the row first: Cancel %v, want ErrFinished", err)
		}
	case "cancel":
		if err != nil {
			t.Fatalf("the holder's cancel settled first: Cancel %v, want nil", err)
		}
	default:
		t.Fatalf("settlement %+v", s)
	}
	if h.row(id).exists {
		t.Fatal("the row is still in a table that keeps no finished rows")
	}
}

// On SQLite a queue table whose ids can be handed out again (INTEGER PRIMARY KEY without
// AUTOINCREMENT) is refused cancel requests: one left by an asker that died would cancel
// a later row given the same id.
func TestCancelRequestsRefuseATableThatReusesIDs(t *testing.T) {
	t.Parallel()
	h := newHarness(t, driverNamed(t, "sqlite"), rowactor.FormLease, withCancelRequests)
	h.exec("DROP TABLE " + h.table.Name)
	h.exec("CREATE TABLE " + h.table.Name + " (id INTEGER PRIMARY KEY, payload BLOB NOT NULL, grp TEXT, attempt INTEGER NOT NULL DEFAULT 0," +
		" retry_after TEXT, headers TEXT, locked_until TEXT)")
	b := h.broker()
	_, err := b.Subscribe(context.Background(), h.table, h.queue, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	var ce *rowactor.ConfigError
	if !errors.As(err, &ce) || ce.Option != "Table.CancelRequests" || !strings.Contains(ce.Reason, "AUTOINCREMENT") {
		t.Fatalf("Subscribe to a table without AUTOINCREMENT, with cancel requests: %v, want a *ConfigError on Table.CancelRequests", err)
	}
}

func fencedCancelScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	fc, ok := h.d.(dialects.FencedCanceller)
	if !ok {
		t.Fatalf("the %s dialect has no fenced cancel", h.drv.name)
	}
	ids := h.publish(b, 3)
	moved, dead, queued := ids[0], ids[1], ids[2]
	h.exec(fmt.Sprintf("UPDATE %s SET grp = 'elsewhere' WHERE id = ?", h.table.Name), moved)
	h.exec(fmt.Sprintf("UPDATE %s SET dead_at = ? WHERE id = ?", h.table.Name), h.drv.timeValue(time.Now()), dead)
	for _, id := range []int64{moved, dead} {
		before := h.row(id)
		if err := fc.CancelInGroup(ctx, h.table, id, time.Now(), "fenced", h.queue, false); err == nil {
			t.Fatalf("the fenced cancel of row %d, out of its group or dead, returned nil", id)
		}
		if st := h.row(id); !sameState(st, before) {
			t.Fatalf("the fenced cancel changed row %d: %+v, was %+v", id, st, before)
		}
	}
	if err := fc.CancelInGroup(ctx, h.table, queued, time.Now(), "fenced", h.queue, false); err != nil {
		t.Fatalf("the fenced cancel of a queued row in its group: %v", err)
	}
	if st := h.row(queued); st.processedAt == nil || st.lastError == nil || *st.lastError != dialects.CancelledPrefix+"fenced" {
		t.Fatalf("the queued row after its fenced cancel: %+v", st)
	}
}

// TestCancelOfARowBeingGivenBackCancelsIt: a row the measured room gives back (its
// process's workers all stuck; strand.go) is out of the backlog and in no book until its
// release commits, and still leased meanwhile. A Cancel that comes then must not take the
// lease for another process's and answer ErrInWork: it looks again, and cancels the row
// once it is queued. testhook.BeforeGiveBack holds the release back so that the Cancel
// comes in that window on every run: 300 ms, and 2.5 s, longer than Cancel's looks for a
// row that its own claims may take (cancelTries, about 1.4 s), which must not bound the
// wait for a give-back.
func TestCancelOfARowBeingGivenBackCancelsIt(t *testing.T) {
	t.Parallel()
	for _, hold := range []time.Duration{300 * time.Millisecond, 2500 * time.Millisecond} {
		t.Run(hold.String(), func(t *testing.T) {
			t.Parallel()
			cancelOfARowBeingGivenBack(t, hold)
		})
	}
}

func cancelOfARowBeingGivenBack(t *testing.T, hold time.Duration) {
	eachDriverAndForm(t, []rowactor.Form{rowactor.FormLease}, func(t *testing.T, h *harness) {
		b := h.broker()
		stuck, id := stickAndGiveBack(t, h, b, func(int64) { time.Sleep(hold) })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Cancel(ctx, h.table, id, "no longer wanted"); err != nil {
			t.Fatalf("Cancel of row %d as its process gave it back: %v; want it cancelled", id, err)
		}
		if st := h.row(id); st.exists {
			t.Fatalf("row %d after its Cancel returned nil: %+v; want it dropped", id, st)
		}
		stuck.unblock()
	})
}
