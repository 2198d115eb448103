package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/trace"

	"github.com/rowactor/rowactor/claimer"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/deadline"
	"github.com/rowactor/rowactor/internal/testhook"
	"github.com/rowactor/rowactor/leaserenewer"
	"github.com/rowactor/rowactor/settler"
)

// Result is what became of one delivery.
type Result struct {
	Row     dialects.Row
	Outcome settler.Outcome
	// Step is the statement that ran (StepRelease for a delivery released unsettled).
	Step dialects.StepKind
	// Event names the subscription's own event that ran in place of Step's statement.
	Event string
	// Err is nil when the settlement took effect; ErrLeaseLost, ErrClosed or a database
	// error otherwise.
	Err error
	// Released reports a row given back unsettled (lease released, key unlocked).
	Released bool
	// closed reports a session's connection closed rather than returned.
	closed bool
	// Panic holds a handler panic's value.
	Panic any
	// Tag is what the handler returned beside its outcome (the root package's delivery).
	Tag any
}

// Who gives a delivery's worker back (delivery.worker).
const (
	workerHeld uint32 = iota
	workerFreed
	workerKept
)

// delivery states, moved by compare-and-swap between the handler goroutine and the actor.
const (
	running   uint32 = iota
	handled          // the handler returned; its outcome waits for the actor
	released         // the actor released the row before the handler returned (a stop)
	abandoned        // the actor gave up on the handler past its deadline (timeout.go)
	queued           // the outcome's settlement is queued in a batch (queueSettlement)
)

type delivery struct {
	// mb is the delivery actor's mailbox (mailbox.go); sys and self are its actor's.
	mb      mailbox
	sys     *actor.ActorSystem
	self    *actor.PID
	sub     *Subscription
	claim   claimer.Claim
	outcome settler.Outcome
	tag     any
	panic   any
	// leaseTx is a transactional lease delivery's own transaction; beginErr says it could
	// not be opened (the handler then never ran).
	leaseTx  dialects.LeaseTx
	beginErr error
	// txMu guards leaseTx between the handler's goroutine opening it and a stop ending it
	// (lentLeaseTx); txEnded says the actor ended it, or will. settled says the actor
	// settled the row, or gave it back (the small fields sit together: a delivery is
	// allocated per row, and padding was bytes for the GC).
	txMu    sync.Mutex
	txEnded bool
	settled bool
	// stopTook says a stop took the row from a handler that had returned (onStopping).
	stopTook bool
	// handBack gives a waiting row back for other consumers, its workers all stuck
	// (strand.go): released with releaseOnly, and reported without an error.
	handBack bool
	// connPassed says the delivery answered its subscription's claim request (chain.go),
	// whose answer accounts for the delivery's connection from then on.
	connPassed bool
	// dctx is the handler's context, whose deadline Config.Timeout sets (timeout.go): dc,
	// made in the delivery to save its allocation.
	dctx *deadline.Context
	dc   deadline.Context
	// span is the delivery's consumer span, started with the actor; spanCtx carries it.
	span        trace.Span
	spanCtx     context.Context
	handlerTook time.Duration
	// worker says who gives the delivery's worker back: nobody yet (workerHeld); the
	// delivery, before its settlement (workerFreed: workerFreeMsg); or its settled note
	// (workerKept). The handler's goroutine and a stop may race for it (freeWorkerHere, end).
	// state is where the handler is (running, handled, released, abandoned).
	worker atomic.Uint32
	state  atomic.Uint32
	// spawned is when the delivery took its worker, and workTook how long it kept it:
	// the subscription sizes its waiting room from it (room.go), if roomGen, the room's
	// generation when the row was claimed, is still the room's.
	spawned  time.Time
	workTook time.Duration
	roomGen  uint64
	// keyPanic is why a row is given back unstarted: the WorkersByKey key function
	// panicked on it (guard.go).
	keyPanic *keyPanic
	// keyed: the row counts against its partition key, key, until settled (WorkersByKey).
	// releaseOnly gives a prefetched row back without calling the handler (a drain began
	// before a worker took it).
	key         string
	keyed       bool
	releaseOnly bool
	// inBook says the delivery is in its subscription's book of deliveries in work;
	// cancel is where a Cancel and the settlement meet (cancel.go).
	inBook bool
	cancel atomic.Pointer[cancelRequest]
	// handlerCtx is dctx, published for a Cancel once the delivery started.
	handlerCtx atomic.Pointer[deadline.Context]
	// cancelOnly settles a claimed row that waited for a worker as cancelled, without
	// calling the handler (a Cancel found it waiting).
	cancelOnly *cancelRequest
	// stopResult is what the actor's stop did to the row while its handler still ran
	// (stopRunning); stopDone opens once it is set. A pointer: most deliveries never
	// stop so, and a Result in place made every delivery 280 bytes larger.
	stopResult *Result
	stopDone   latch
	// note is the delivery's settledMsg, sent as it ends; batchReq is its settlement's
	// room in a batch (settler.Batcher).
	note     settledMsg
	batchReq settler.BatchRequest
	// returned opens once the handler returned and its goroutine read the state.
	returned latch
	// taken says who decided the handler's start: run, which calls it, or the actor's
	// stop before it began (stopUnstarted), which gives the row back.
	taken atomic.Bool
	// chain is the claim a row lock delivery makes for its freed worker as it settles
	// (chain.go); nil unless it offered one.
	chain *chainClaim
}

// handledMsg tells the delivery actor its handler returned.
type handledMsg struct{}

func (handledMsg) IgnoreDeadLetterLogging() {}

// settledMsg tells the subscription actor a delivery ended. freed says the settlement
// may have made a row claimable at once: a row returned to the queue, or (advisory form)
// a key unlocked, behind which rows of the same key wait.
type settledMsg struct {
	d     *delivery
	freed bool
	// rows is how many rows the delivery held (a batch's); 0 means one.
	rows int
	// keyed says the row counted against its partition key, key.
	keyed bool
	key   string
	// workerFreed says the delivery gave its worker back already (workerFreeMsg).
	workerFreed bool
	// handled says the delivery was spawned to run its handler (not only to give its
	// row back).
	handled bool
	// connPassed says the delivery's connection is not given back to the budget here:
	// it answered a claim request, whose answer accounts for it (chain.go).
	connPassed bool
}

func (*settledMsg) IgnoreDeadLetterLogging() {}

// workerFreeMsg tells the subscription actor a delivery's handler returned and its
// settlement is under way (freesWorkerEarly): its worker may take the next row meanwhile.
// The row stays in work (leased and renewed, locked, or its key held) until settled.
type workerFreeMsg struct{ d *delivery }

func (workerFreeMsg) IgnoreDeadLetterLogging() {}

func (d *delivery) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		d.startSpan(!d.releaseOnly && d.cancelOnly == nil)
		if d.cancelOnly != nil {
			d.cancel.Store(d.cancelOnly) // endCancel hands it the result
			r := d.settleCancelledUnstarted(d.cancelOnly)
			d.settled = true
			d.finishSpan(r, 0)
			d.sub.report(r)
			d.end(c, r)
			d.stopSelf(c)
			return
		}
		if d.releaseOnly {
			if hook := testhook.BeforeGiveBack.Load(); hook != nil && d.handBack {
				(*hook)(d.sub.cfg.Table, d.claim.Row.ID)
			}
			r := d.giveBack(d.sub.cfg.ctx)
			switch {
			case d.keyPanic != nil:
				r.Panic, r.Err = d.keyPanic.value, errors.Join(d.keyPanic, r.Err) // the broker is open
			case d.handBack:
				// The broker is open: the row went back for another worker.
			default:
				r.Err = errors.Join(r.Err, settler.ErrClosed)
			}
			d.settled = true
			d.finishSpan(r, 0)
			d.sub.report(r)
			d.end(c, r)
			d.stopSelf(c)
			return
		}
		if req := d.cancel.Load(); req != nil {
			// Cancelled between its spawn and its start: the handler is not called.
			r := d.settleCancelledUnstarted(req)
			d.settled = true
			d.finishSpan(r, 0)
			d.sub.report(r)
			d.end(c, r)
			d.stopSelf(c)
			return
		}
		d.sys, d.self = c.ActorSystem(), c.Self()
		d.dctx = &d.dc
		d.sub.initDeadline(d.dctx, d)
		d.handlerCtx.Store(d.dctx)
		if req := d.cancel.Load(); req != nil {
			d.dctx.Cancel(req.cause) // cancelled as it started: Cancel saw no context yet
		}
		d.mb.runHandler() // on this goroutine, once the mailbox is idle
	case overrunMsg:
		// The handler runs a grace past its deadline, unless it returned meanwhile.
		if !d.settled && d.state.CompareAndSwap(running, abandoned) {
			d.abandon(c)
		}
	case handledMsg:
		d.onHandled(c)
	case *claimer.Request:
		d.onClaimRequest(c, m)
	case soloMsg:
		d.onSolo(c)
	case batchDoneMsg:
		if !d.settled { // a stop that came first finished it (onStopping)
			d.finishQueued(c)
			d.stopSelf(c)
		}
	case *actor.Stopping:
		d.onStopping(c)
	}
}

// onHandled frees the delivery's worker, when it may before the settlement, and settles;
// or, offering to claim the worker's next row as it settles (chain.go), waits for the
// subscription's answer.
func (d *delivery) onHandled(c actor.Context) {
	if d.freesWorkerEarly() && d.worker.CompareAndSwap(workerHeld, workerFreed) {
		d.workTook = time.Since(d.spawned)
		if d.chains() {
			// The subscription answers with a claim for the worker, or soloMsg.
			d.chain = &chainClaim{}
			c.Send(c.Parent(), chainFreeMsg{d})
			return
		}
		c.Send(c.Parent(), workerFreeMsg{d})
	}
	d.settleHandled(c)
}

// settleHandled settles the outcome of a handler that returned, and ends the delivery;
// unless the settlement was queued in a batch, which ends it when it answers.
func (d *delivery) settleHandled(c actor.Context) {
	guard := d.sub.guardsSettlements()
	if guard {
		d.sub.poison.Settling(d.claim.Row.ID)
		defer d.sub.poison.Settled(d.claim.Row.ID) // should the settlement panic
	}
	if !guard && d.queueSettlement() {
		return // the batch's answer finishes the delivery (batchDoneMsg)
	}
	r := d.settleTraced()
	d.sub.notePoison(r)
	if guard {
		// At once, not after the hook: a claim waiting for the note must not wait for
		// the service's WithOnSettled callback too (Settled is idempotent).
		d.sub.poison.Settled(d.claim.Row.ID)
	}
	d.answerChain(c) // after Settled: its claim may take this very row again
	d.settled = true
	d.finishSpan(r, d.handlerTook)
	d.sub.report(r)
	d.end(c, r)
	d.stopSelf(c)
}

// batchDoneMsg tells a delivery the batch its settlement was queued in answered it.
type batchDoneMsg struct{}

func (batchDoneMsg) IgnoreDeadLetterLogging() {}

// queueSettlement queues the settlement of the handler's outcome in its subscription's
// batch (settler.Batcher.Queue) when it is a plain ack or retry, and reports whether it
// did: the delivery then ends when the batch answers (batchDoneMsg, or onStopping should
// a stop come first), and no goroutine waits for the batch meanwhile. It runs on the
// handler's goroutine as the handler returns (freeWorkerHere), or in the actor
// (handledMsg); anything else (a cancel, a panic, a span of its own, another step) goes
// the actor's way (settle).
//
// What it must not break: a row has one end. The outcome's settlement and a stop's
// release meet on the delivery's state: the settlement queues only if it moves handled to
// queued, and a stop releases the row only if it moves handled to released (onStopping);
// a stop that finds the settlement queued waits for its answer instead. A Cancel meets it
// on the cancel pointer, as settle does (takeCancel).
func (d *delivery) queueSettlement() bool {
	b := d.sub.batcher
	if b == nil || d.span != noSpan || d.leaseTx != nil || d.beginErr != nil || d.panic != nil || d.cancel.Load() != nil ||
		d.batchReq.Used() {
		return false
	}
	// Plan consults the service's retry policy for a Fail alone, which never queues here:
	// for the others it is pure, and the actor's way plans again.
	if v := d.outcome.Verdict; v != settler.Ack && v != settler.Drop && v != settler.Retry {
		return false
	}
	cfg := &d.sub.cfg
	step, note := cfg.Rules.Plan(d.outcome, d.claim.Row.Attempt, cfg.Now())
	// A step with a note to log (notePlan) goes the actor's way: a queued one has none.
	if step.Kind != dialects.StepAck && step.Kind != dialects.StepRetry || !settler.Batchable(step) || note != settler.NoteNone {
		return false
	}
	if !d.cancel.CompareAndSwap(nil, settlingMark) {
		return false // a Cancel came first: the actor settles the row as cancelled (settle)
	}
	if hook := testhook.BeforeQueueing.Load(); hook != nil {
		(*hook)(cfg.Table)
	}
	// All a stop reads of the settlement is written before the state says queued: a stop
	// that sees it waits for the answer at once (finishQueued). A stop that comes first
	// releases the row with a batch request of its own (stopTook), never this one.
	b.Prepare(&d.batchReq, step, d.claim.Lease, d)
	if !d.state.CompareAndSwap(handled, queued) {
		return true // a stop came first, and releases the row (onStopping)
	}
	b.Enqueue(&d.batchReq)
	return true
}

// BatchAnswered hands the batch's answer to the actor: here, on the batch leader's
// goroutine when it may (settler.Answered).
func (d *delivery) BatchAnswered(here bool) {
	if here {
		d.mb.postHere(batchDoneMsg{})
		return
	}
	d.mb.PostUserMessage(batchDoneMsg{})
}

// finishQueued ends a delivery whose settlement was queued in a batch, with the batch's
// answer, which it waits for (a stop may come before it).
func (d *delivery) finishQueued(c actor.Context) {
	r := Result{Row: d.claim.Row, Outcome: d.outcome, Step: d.batchReq.Step(), Tag: d.tag, Err: d.batchReq.Answer()}
	d.sub.notePoison(r)
	d.settled = true
	d.finishSpan(r, d.handlerTook)
	d.sub.report(r)
	d.end(c, r)
}

// stopSelf stops the delivery actor, as c.Stop(c.Self()) does, by posting the stop to
// its own mailbox: Proto.Actor's Stop first looks the PID up in the process registry and
// allocates a cached reference to it, a lock and an allocation per row that only the
// registry's mark of a dead process (which its removal makes anyway, as the actor
// finishes stopping) would justify. On a service's own system with Proto.Actor's metrics
// on (WithActorSystem), Stop is what counts the actor stopped, so it runs there.
func (d *delivery) stopSelf(c actor.Context) {
	if c.ActorSystem().Config.MetricsProvider != nil {
		c.Stop(c.Self())
		return
	}
	d.mb.PostSystemMessage(stopMsg)
}

// stopMsg is the system message that stops an actor (Proto.Actor's is unexported).
var stopMsg = &actor.Stop{}

// onStopping settles what a stop leaves: a delivery not yet settled gives its row back,
// its handler not started (stopUnstarted), still running (stopRunning), or returned with
// an outcome that came too late.
func (d *delivery) onStopping(c actor.Context) {
	if d.settled {
		return
	}
	d.settled = true
	if d.dctx != nil && d.taken.CompareAndSwap(false, true) {
		d.stopUnstarted(c)
		return
	}
	if d.sub.cfg.Transactional && d.state.Load() == running {
		d.awaitHandler()
	}
	// Stopped before settling: the handler still runs, or its outcome came too late.
	if d.state.CompareAndSwap(running, released) {
		d.finishSpan(Result{Step: dialects.StepRelease, Err: settler.ErrClosed}, 0)
		d.stopRunning()
		d.end(c, *d.stopResult)
		return
	}
	if d.state.CompareAndSwap(handled, released) {
		// The row is the stop's to release, while the handler's goroutine may still be
		// filling the delivery's batch request (queueSettlement): the release takes a
		// request of its own.
		d.stopTook = true
	} else if d.state.Load() == queued {
		d.finishQueued(c) // its batch answers the settlement: the stop waits for that
		return
	}
	var r Result
	if d.beginErr != nil && d.panic == nil {
		r = d.giveBack(d.sub.cfg.ctx) // its handler never started: the attempt goes back too
	} else {
		r = d.release(d.outcome)
	}
	if r.Err == nil {
		r.Err = settler.ErrClosed
	} else if !errors.Is(r.Err, settler.ErrClosed) {
		r.Err = errors.Join(settler.ErrClosed, r.Err) // a release that failed says so
	}
	d.finishSpan(r, d.handlerTook)
	d.sub.report(r)
	d.end(c, r)
}

// freesWorkerEarly says whether the delivery gives its worker back as its handler returns,
// before its settlement: the next row's claim (and handler) then overlaps this row's
// settlement instead of waiting for its round trips. Workers bounds the handlers running,
// not the settlements; a row still counts in work, and holds its connection against the
// pool's budget (row lock, advisory), until settled. A FIFO group's next row waits for
// its head's settlement, so a FIFO subscription keeps the worker until then; so does a
// transactional one, whose settlement commits the handler's own writes (not measured
// apart yet: kept as it was).
func (d *delivery) freesWorkerEarly() bool {
	cfg := &d.sub.cfg
	return d.sub.batcher != nil || cfg.Form != dialects.FormLease && !cfg.FIFO && !cfg.Transactional
}

// end counts what the delivery gave back (directly: at shutdown the subscription actor
// may stop before it reads its mailbox) and frees its worker.
func (d *delivery) end(c actor.Context, r Result) {
	d.arrive()
	d.endCancel(r)
	switch {
	case d.handBack:
		// Not Shutdown's release: one given back while the broker ran (strand.go).
		d.sub.givingBack.Add(-1)
		d.sub.claimsDone.Add(1)
	case r.Released:
		d.sub.released.Add(1)
	}
	if r.closed {
		d.sub.closed.Add(1)
	}
	// A custom event may have returned its row or not: one claim finds out.
	freed := r.Step == dialects.StepRetry || r.Step == dialects.StepRelease || r.Step == dialects.StepCustom ||
		d.sub.cfg.Form == dialects.FormAdvisory
	workerFreed := !d.worker.CompareAndSwap(workerHeld, workerKept)
	if !workerFreed && d.state.Load() == handled {
		d.workTook = time.Since(d.spawned)
	}
	// The note lives in the delivery, which ends here: sending its address costs no
	// allocation.
	d.note = settledMsg{d: d, freed: freed, workerFreed: workerFreed, keyed: d.keyed, key: d.key,
		handled: !d.releaseOnly && d.cancelOnly == nil, connPassed: d.connPassed}
	c.Send(c.Parent(), &d.note)
}

// arrive tells the batcher the delivery's settlement joins no batch, unless it did.
func (d *delivery) arrive() {
	if b := d.sub.batcher; b != nil {
		b.Arrive(&d.batchReq)
	}
}

// run calls the handler outside the mailbox, on the goroutine w that processed Started
// (mailbox). A panic is an unsettled delivery; a return after the deadline is a
// failure (lateOutcome).
func (d *delivery) run(w *worker) {
	if !d.taken.CompareAndSwap(false, true) {
		return // the actor stopped first and gave the row back (stopUnstarted)
	}
	if tx, ok := d.begin(); ok {
		start := time.Now()
		d.dctx.SetTimeout(d.sub.cfg.Timeout)
		var ctx context.Context = d.dctx
		if d.span != noSpan {
			ctx = trace.ContextWithSpan(ctx, d.span)
		} else if sc := trace.SpanContextFromContext(d.spanCtx); sc.IsValid() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, sc) // the publisher's (startSpan)
		}
		d.outcome, d.tag, d.panic = d.sub.call(ctx, d.claim.Row, tx)
		d.handlerTook = time.Since(start)
		if d.panic == nil && d.dctx.Expired() {
			d.outcome = lateOutcome(d.outcome, d.dctx.Timeout())
		}
	}
	d.dctx.Finish()
	won := d.state.CompareAndSwap(running, handled)
	d.returned.open()
	if won {
		if !d.freeWorkerHere(w) {
			d.mb.postHere(handledMsg{})
		}
		return
	}
	if d.state.Load() == abandoned {
		// The actor gave the row back (and ended a lent transaction) already, and told the
		// hook: the outcome changes nothing.
		d.sub.noteLateReturn(d.claim.Row, d.outcome.Verdict.String(), d.handlerTook)
		return
	}
	// The row was released (shutdown) while the handler ran: its outcome cannot settle.
	// The stop gave the row back already (stopRunning), and counted it: the hook is told
	// what the handler returned, and what the stop did.
	<-d.stopDone.wait()
	rr := *d.stopResult
	d.sub.report(Result{Row: d.claim.Row, Outcome: d.outcome, Step: dialects.StepRelease, Tag: d.tag,
		Released: rr.Released, closed: rr.closed, Err: errors.Join(settler.ErrClosed, rr.Err)})
}

// freeWorkerHere gives the worker back as the handler returns, and when the subscription
// actor was idle, its next step runs on this goroutine (w), the settlement on another:
// the worker then goes to the next row without a hand-off between goroutines, and with
// one worker the next row's handler starts here as well (mailbox.deferStart). A
// hand-off is paid either way; this way it is not between one handler and the next. It
// reports whether the settlement went elsewhere.
//
// Only a batched settlement goes elsewhere: it waits for its batch anyway. One of its
// own (advisory, row lock) is SQL the next claim would meet head on: on SQLite that
// claim, started sooner, ran beside the settlement's write and cost more (advisory
// form, one worker: 7,200 → 6,300 rows/s, CPU 157 → 191 µs per row).
func (d *delivery) freeWorkerHere(w *worker) bool {
	if w == nil || d.sub.batcher == nil || !d.worker.CompareAndSwap(workerHeld, workerFreed) {
		return false // a stop that came as the handler returned settles the worker (end)
	}
	d.workTook = time.Since(d.spawned)
	if !d.sub.mb.postNext(workerFreeMsg{d}, w) {
		return false // the subscription actor runs elsewhere: this goroutine settles
	}
	if !d.queueSettlement() {
		d.mb.PostUserMessage(handledMsg{})
	}
	return true
}

// stopUnstarted gives back the row of a delivery whose actor stops before its handler
// began: the handler, which runs once the mailbox is idle, is not called, and the row
// goes back unstarted, the attempt its claim counted with it.
func (d *delivery) stopUnstarted(c actor.Context) {
	d.dctx.Finish()
	d.state.Store(released)
	r := d.giveBack(d.sub.cfg.ctx)
	r.Err = errors.Join(settler.ErrClosed, r.Err)
	d.finishSpan(r, 0)
	d.sub.report(r)
	d.end(c, r)
}

// stopGrace is how long a stopping transactional delivery waits for its handler to
// return once its context ended: a handler that honours its context returns at once, and
// its transaction is then rolled back on its own connection, which goes back to the pool;
// one that ignores it has its transaction ended under it (stopRunning).
const stopGrace = 250 * time.Millisecond

// awaitHandler ends the handler's context and waits up to stopGrace for it to return.
func (d *delivery) awaitHandler() {
	d.dctx.Cancel(settler.ErrClosed)
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case <-d.returned.wait():
	case <-t.C:
	}
}

// stopRunning gives the row of a delivery whose handler still runs back as its actor
// stops (Shutdown), without waiting for the handler, which may ignore its context: the
// handler's context ends first, so that a statement it runs with it ends (database/sql
// serialises a rollback behind it); then, in transactional mode, the lent transaction is
// ended under the handler as the give-up after Timeout does (interrupt: its connection
// leaves the pool, so closing an owned pool does not wait for the handler either), and
// the row goes back by its form's rule. The result waits in stopResult for the handler's
// goroutine, which tells the hook once the handler returns.
func (d *delivery) stopRunning() {
	defer func() {
		if d.stopResult == nil {
			// The release panicked (the mailbox recovers it, and the lease runs out): the
			// handler's goroutine still reads a result as it returns.
			d.stopResult = &Result{}
		}
		d.stopDone.open()
	}()
	d.dctx.Cancel(settler.ErrClosed)
	if d.sub.cfg.Transactional {
		r := d.interrupt(nil)
		d.stopResult = &r
		return
	}
	// Outside transactional mode the handler holds nothing of the row.
	r := d.releaseOn(d.sub.cfg.ctx, settler.Outcome{}, nil)
	d.stopResult = &r
}

// begin finds the transaction a transactional handler is lent: the claim's (row lock), the
// session's (advisory, opened by the claimer), or one of its own (lease). ok is false
// when the lease transaction could not be opened: the row is then released unhandled.
func (d *delivery) begin() (tx dialects.DeliveryTx, ok bool) {
	cfg := &d.sub.cfg
	if !cfg.Transactional {
		return nil, true
	}
	switch cfg.Form {
	case dialects.FormRowLock:
		return d.claim.Locked.(dialects.DeliveryTx), true
	case dialects.FormAdvisory:
		return d.claim.Session.(dialects.DeliveryTx), true
	}
	q, isTx := cfg.Queue.(dialects.TxLeaseQueue)
	if !isTx {
		d.beginErr = fmt.Errorf("rowactor: the %s queue cannot lend a transaction", cfg.Table)
		return nil, false
	}
	ltx, err := q.BeginDelivery(cfg.ctx)
	if err != nil {
		d.beginErr = fmt.Errorf("begin the delivery's transaction: %w", err)
		cfg.Log.Warn("rowactor: could not open a transactional delivery's transaction; the row is released",
			slog.String("table", cfg.Table), slog.Int64("id", d.claim.Row.ID), slog.Any("error", err))
		return nil, false
	}
	d.txMu.Lock()
	ended := d.txEnded
	if !ended {
		d.leaseTx = ltx
	}
	d.txMu.Unlock()
	if ended {
		// The actor stopped (Shutdown) while the transaction was being opened, and gave
		// the row back: the handler does not run.
		_ = ltx.Rollback(cfg.ctx)
		d.beginErr = settler.ErrClosed
		return nil, false
	}
	return ltx, true
}

// lentLeaseTx is the transaction a transactional lease delivery lent its handler, for
// interrupt, which may run while the handler's goroutine is still opening it (a stop as
// the handler starts): from then on begin opens none for the handler.
func (d *delivery) lentLeaseTx() dialects.LeaseTx {
	d.txMu.Lock()
	defer d.txMu.Unlock()
	d.txEnded = true
	return d.leaseTx
}

// settle plans the outcome's step and runs it where the form says. The rarer ends are
// functions of their own, to keep this one's stack frame small (logPlan).
func (d *delivery) settle() Result {
	req := d.takeCancel()
	if req != nil || d.beginErr != nil || d.panic != nil {
		return d.settleUnplanned(req)
	}
	cfg := &d.sub.cfg
	step, note := cfg.Rules.Plan(d.outcome, d.claim.Row.Attempt, cfg.Now())
	refused := d.sub.notePlan(d.claim.Row, d.outcome, step, note)
	if step.Kind == dialects.StepRelease || step.Kind == dialects.StepCustom && !cfg.Rules.Events[step.Event] {
		return d.settleReleased(step, refused)
	}
	return d.runStep(step, d.outcome, d.tag)
}

// settleUnplanned settles a delivery whose outcome is not planned: cancelled (req), its
// transaction never opened, or its handler panicked.
func (d *delivery) settleUnplanned(req *cancelRequest) Result {
	if req != nil {
		return d.settleCancelled(req)
	}
	if d.panic == nil && d.beginErr != nil {
		// The lease delivery's transaction could not be opened: the handler never
		// started, so the row goes back with the attempt its claim counted.
		r := d.giveBack(d.sub.cfg.ctx)
		r.Err = errors.Join(d.beginErr, r.Err)
		return r
	}
	r := d.release(d.outcome)
	r.Panic, r.Tag = d.panic, d.tag
	return r
}

// settleReleased releases the row of a step that releases it: one planned so, or refused
// (refused), or a custom event the subscription does not know.
func (d *delivery) settleReleased(step dialects.Step, refused error) Result {
	cfg := &d.sub.cfg
	row := d.claim.Row
	r := d.release(d.outcome)
	if step.Kind == dialects.StepRelease {
		if refused != nil {
			r.Tag = d.tag
			r.Err = errors.Join(refused, r.Err)
		}
		return r
	}
	r.Tag = d.tag
	r.Err = errors.Join(fmt.Errorf("rowactor: the handler settled row %d with Event(%q), and the subscription to %s has no such event; "+
		"register it with rowactor.OnEvent; the row was released: %w", row.ID, step.Event, cfg.Table, settler.ErrUnknownEvent), r.Err)
	cfg.Log.Warn("rowactor: unknown event; the row is released", slog.String("table", cfg.Table),
		slog.Int64("id", row.ID), slog.String("event", step.Event))
	return r
}

// runStep runs a planned step of outcome o where the form says; tag is the handler's.
func (d *delivery) runStep(step dialects.Step, o settler.Outcome, tag any) (r Result) {
	cfg := &d.sub.cfg
	row := d.claim.Row
	r = Result{Row: row, Outcome: o, Step: step.Kind, Event: step.Event, Tag: tag}
	if b := d.sub.batcher; b != nil && d.leaseTx == nil && settler.Batchable(step) {
		// The batch bounds its own statement, and the batcher ends a wait for a row
		// another session holds when the subscription's waits end.
		r.Err = b.Settle(cfg.ctx, &d.batchReq, step, d.claim.Lease)
		return r
	}
	d.arrive() // a leader waits for this row no longer
	// A single-row statement may wait for a row another session holds: it ends soon
	// after the subscription's waits do (StatementCtx), and is reported ErrClosed. The
	// row lock form's claim holds its row, so its settlement waits for no other session:
	// its COMMIT is left to finish, as a cut one's outcome would be unknown.
	waits := d.sub.waits
	if cfg.Form == dialects.FormRowLock {
		waits = context.Background()
	}
	ctx, cancel := settler.StatementCtx(cfg.ctx, waits, cfg.settleTimeout)
	defer cancel()
	defer func() { r.Err = waitEnded(waits, r.Err) }()
	switch cfg.Form {
	case dialects.FormLease:
		if d.leaseTx != nil && o.KeepsWrites() {
			held, err := pinLease(d.claim.Lease, step)
			if err != nil {
				d.rollbackLeaseTx(ctx)
				r.Err = err
				break
			}
			r.Err = settler.LeaseTx(ctx, d.leaseTx, step, held)
			d.claim.Lease.Done()
			break
		}
		d.rollbackLeaseTx(ctx) // any other outcome discards the handler's writes first
		r.Err = d.settleLease(ctx, step)
	case dialects.FormAdvisory:
		if cfg.Transactional {
			var unlockErr error
			r.closed, r.Err, unlockErr = settler.AdvisoryTx(ctx, d.claim.Session.(dialects.TxSession), step, row.ID, o.KeepsWrites())
			d.warnUnlock(unlockErr)
			break
		}
		var unlockErr error
		r.closed, r.Err, unlockErr = settler.Advisory(ctx, d.claim.Session, step, row.ID)
		d.warnUnlock(unlockErr)
	case dialects.FormRowLock:
		if cfg.Transactional {
			r.Err = settler.RowLockTx(ctx, d.claim.Locked.(dialects.TxLockedClaim), step, row.ID, o.KeepsWrites())
			break
		}
		if ch := d.chain; ch != nil && ch.req != nil {
			if cc, ok := d.claim.Locked.(dialects.ChainingClaim); ok {
				ch.next, r.Err, ch.err = settler.RowLockChained(ctx, cc, step, row.ID, cfg.Now())
				ch.ran = r.Err == nil
				break
			}
		}
		r.Err = settler.RowLock(ctx, d.claim.Locked, step, row.ID)
	}
	return r
}

// waitEnded is a single-row settlement's error err as its caller sees it: one cut short
// because its waits ended (the subscription's: Stop, past Shutdown's context) matches
// ErrClosed. The dialects' statements that wait for a row lock change nothing when cut
// short: the server is told to end the wait (dialects.Session, dialects.LeaseQueue).
func waitEnded(waits context.Context, err error) error {
	if !settler.CutByStop(waits, err) {
		return err
	}
	return fmt.Errorf("%w: %w: %w", settler.ErrClosed, settler.ErrCutByStop, err)
}

// settleLease runs a lease-form step fenced by the delivery's own token: with the next
// batch when the subscription batches and the step can join one (the lease is renewed
// while it waits), else on its own.
func (d *delivery) settleLease(ctx context.Context, step dialects.Step) error {
	lease := d.claim.Lease
	if b := d.sub.batcher; b != nil && settler.Batchable(step) {
		req := &d.batchReq
		if d.stopTook {
			req = nil // the handler's goroutine may be filling it (onStopping)
		}
		return b.Settle(ctx, req, step, lease)
	}
	held, err := pinLease(lease, step)
	if err != nil {
		return err
	}
	defer lease.Done()
	return settler.Lease(ctx, d.sub.cfg.Queue.(dialects.LeaseQueue), step, held)
}

// pinLease reads the token a delivery settles with, stopping its renewal: ErrClosed when
// the lease was settled or released already, ErrLeaseLost (and the lease out of the book)
// when it is gone for good, so no statement runs.
func pinLease(lease *leaserenewer.Held, step dialects.Step) (dialects.Lease, error) {
	held, lost, ok := lease.Pin()
	switch {
	case !ok:
		return held, fmt.Errorf("settle %s of row %d: %w", step.Kind, lease.ID(), settler.ErrClosed)
	case lost:
		lease.Done()
		return held, fmt.Errorf("settle %s of row %d: %w", step.Kind, lease.ID(), settler.ErrLeaseLost)
	}
	return held, nil
}

// warnUnlock logs an unlock that failed after the settlement: the settlement stands, and
// the session was closed, which ends its lock.
func (d *delivery) warnUnlock(err error) {
	if err != nil {
		d.sub.cfg.Log.Warn("rowactor: a key's unlock failed after its settlement; its connection was closed",
			slog.String("table", d.sub.cfg.Table), slog.Int64("id", d.claim.Row.ID), slog.Any("error", err))
	}
}

// rollbackLeaseTx discards a transactional lease delivery's transaction, if it has one.
func (d *delivery) rollbackLeaseTx(ctx context.Context) {
	if d.leaseTx == nil {
		return
	}
	if err := d.leaseTx.Rollback(ctx); err != nil {
		d.sub.cfg.Log.Warn("rowactor: could not roll back a delivery's transaction", slog.String("table", d.sub.cfg.Table),
			slog.Int64("id", d.claim.Row.ID), slog.Any("error", err))
	}
}

// release gives the row back unsettled: the lease is cleared at once, or the key is
// unlocked and its connection closed.
func (d *delivery) release(o settler.Outcome) Result { return d.releaseOn(d.sub.cfg.ctx, o, d.tag) }

// releaseOn is release with the statements' base context and the handler's tag given:
// while a handler still runs, the delivery may read neither its tag nor its transaction.
func (d *delivery) releaseOn(base context.Context, o settler.Outcome, tag any) Result {
	cfg := &d.sub.cfg
	row := d.claim.Row
	r := Result{Row: row, Outcome: o, Step: dialects.StepRelease, Released: true, Tag: tag}
	ctx, cancel := context.WithTimeout(base, cfg.settleTimeout)
	defer cancel()
	switch cfg.Form {
	case dialects.FormLease:
		d.rollbackLeaseTx(ctx)
		if err := d.settleLease(ctx, dialects.Step{Kind: dialects.StepRelease, Now: cfg.Now()}); err != nil {
			r.Released = false
			if errors.Is(err, settler.ErrClosed) && !errors.Is(err, settler.ErrCutByStop) {
				return r // released or settled already
			}
			r.Err = err
			cfg.Log.Warn("rowactor: could not release a lease; the row returns when it expires",
				slog.String("table", cfg.Table), slog.Int64("id", row.ID), slog.Any("error", err))
		}
	case dialects.FormRowLock:
		r.Err = d.rollbackClaim(ctx)
	case dialects.FormAdvisory:
		r.closed = cfg.Limits.SessionConnections
		if err := d.claim.Session.Abort(ctx); err != nil {
			r.Err = err
			cfg.Log.Warn("rowactor: could not unlock a key cleanly; its connection was dropped",
				slog.String("table", cfg.Table), slog.Int64("id", row.ID), slog.Any("error", err))
		}
	}
	return r
}

// rollbackClaim rolls a row lock claim back, which returns its row (the claim counted no
// attempt); a rollback that fails has its connection closed, which returns the row too.
func (d *delivery) rollbackClaim(ctx context.Context) error {
	err := d.claim.Locked.Rollback(ctx)
	if err != nil {
		d.sub.cfg.Log.Warn("rowactor: could not roll a claim back cleanly; its connection was closed",
			slog.String("table", d.sub.cfg.Table), slog.Int64("id", d.claim.Row.ID), slog.Any("error", err))
	}
	return err
}

// giveBack gives back a row whose handler never started (it waited for a worker, and a
// Pause, a drain or a stop gave it back): as release does, and the lease and advisory
// forms also give back the attempt their claim counted, so the row reads as it did
// before the claim (SPEC: given back before its handler started). The lease form's
// statement is fenced by the token, as every settlement; the advisory form's runs on the
// session holding the key, which it then unlocks; the row lock form's claim counted
// nothing and its rollback returns the row. A row whose handler did start is released
// by release, its attempt spent.
func (d *delivery) giveBack(base context.Context) Result {
	cfg := &d.sub.cfg
	row := d.claim.Row
	r := Result{Row: row, Step: dialects.StepRelease, Released: true}
	step := dialects.Step{Kind: dialects.StepRelease, Now: cfg.Now(), Unstarted: true}
	ctx, cancel := context.WithTimeout(base, cfg.settleTimeout)
	defer cancel()
	switch cfg.Form {
	case dialects.FormLease:
		var err error
		if d.claim.Lease != nil {
			err = d.settleLease(ctx, step)
		} else {
			// Never in the book: claimed as the subscription stopped (handoff.go).
			err = settler.Lease(ctx, cfg.Queue.(dialects.LeaseQueue), step, dialects.Lease{ID: row.ID, Token: row.Token})
		}
		if err != nil {
			r.Released = false
			if errors.Is(err, settler.ErrClosed) && !errors.Is(err, settler.ErrCutByStop) {
				return r // released or settled already
			}
			r.Err = err
			cfg.Log.Warn("rowactor: could not give back a lease whose handler never started; the row returns when it expires",
				slog.String("table", cfg.Table), slog.Int64("id", row.ID), slog.Any("error", err))
		}
	case dialects.FormRowLock:
		r.Err = d.rollbackClaim(ctx)
	case dialects.FormAdvisory:
		var err, unlockErr error
		if ts, ok := d.claim.Session.(dialects.TxSession); ok && cfg.Transactional {
			// The claim opened the session's transaction: it is rolled back first.
			r.closed, err, unlockErr = settler.AdvisoryTx(ctx, ts, step, row.ID, false)
		} else {
			r.closed, err, unlockErr = settler.Advisory(ctx, d.claim.Session, step, row.ID)
		}
		if err != nil {
			r.Err = err
			cfg.Log.Warn("rowactor: could not give back the attempt of a row whose handler never started; its key was unlocked and the row returns with the attempt spent",
				slog.String("table", cfg.Table), slog.Int64("id", row.ID), slog.Any("error", err))
		}
		d.warnUnlock(unlockErr) // the row returned: the settlement's error is its own
	}
	return r
}

// callHandler runs h and turns a panic into an unsettled delivery.
func callHandler(ctx context.Context, h Handler, row dialects.Row, tx dialects.DeliveryTx, log *slog.Logger, table string) (o settler.Outcome, tag any, p any) {
	defer func() {
		if v := recover(); v != nil {
			p = v
			o = settler.Outcome{}
			log.Warn("rowactor: handler panicked; the delivery is released unsettled",
				slog.String("table", table), slog.Int64("id", row.ID), slog.Any("panic", v),
				slog.String("stack", string(debug.Stack())))
		}
	}()
	o, tag = h(ctx, row, tx)
	return o, tag, nil
}

// statementTimeout bounds a settlement or release statement.
const statementTimeout = 30 * time.Second
