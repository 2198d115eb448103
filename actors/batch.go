package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/rowactor/rowactor/claimer"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/deadline"
	"github.com/rowactor/rowactor/settler"
)

// BatchHandler handles the rows of one batch and returns one outcome per row, in order,
// and a tag per row handed back in the Results. cancelled(i) returns the cause of the
// Cancel of rows[i] (nil while none): ctx is the batch's, cancelled only once every row
// is, and a cancelled row ends as cancelled whatever outcome is returned for it.
type BatchHandler func(ctx context.Context, rows []dialects.Row, cancelled func(i int) error) ([]settler.Outcome, []any)

// startBatch spawns the actor of a claimed batch: it takes one worker, and holds its rows
// (and one connection) until its commit.
func (a *subscriptionActor) startBatch(c actor.Context, b dialects.LockedBatch) {
	cfg := &a.s.cfg
	rows := b.Rows()
	a.s.inWork.Add(int64(len(rows)))
	d := &batchDelivery{sub: a.s, batch: b, rows: rows, cancels: make([]batchRowCancel, len(rows))}
	// In the book from here to the batch's end, even when it only gives its rows back: a
	// Cancel of one of them then waits for that and cancels the row it gave back, rather
	// than finding it locked by a holder it does not know.
	for _, r := range rows {
		a.s.batchBook.add(r.ID, d)
	}
	if a.draining != nil || a.paused {
		d.releaseOnly = true
	} else {
		a.busy++
		a.handling++
	}
	c.Spawn(actor.PropsFromProducer(func() actor.Actor { return d }, actor.WithDispatcher(cfg.Dispatcher)))
}

// batchDelivery is one batch in work: its handler runs on a goroutine of its own; its
// settlement runs every row's step in the claim transaction and commits once.
type batchDelivery struct {
	sub   *Subscription
	batch dialects.LockedBatch
	rows  []dialects.Row
	// spans holds a consumer span per row, each on a delivery of its own.
	spans []*delivery

	state       atomic.Uint32 // running, handled, released, abandoned (as delivery's)
	dctx        *deadline.Context
	outcomes    []settler.Outcome
	tags        []any
	panic       any
	took        time.Duration
	settled     bool
	releaseOnly bool // claimed as a drain or a pause began: roll back unhandled

	// cancels is, per row, where a Cancel and the batch's settlement meet (cancel.go);
	// asked counts the rows a Cancel won, and handlerCtx is dctx, published for the Cancel
	// of the batch's last row once the batch started.
	cancels    []batchRowCancel
	asked      atomic.Int32
	handlerCtx atomic.Pointer[deadline.Context]
}

// batchRowCancel is one row's cancel pointer (as delivery.cancel), and the request that
// won it, kept past the row's end for the handler's questions (Delivery.Cancelled).
type batchRowCancel struct {
	p   atomic.Pointer[cancelRequest]
	won atomic.Pointer[cancelRequest]
}

func (d *batchDelivery) Receive(c actor.Context) {
	switch c.Message().(type) {
	case *actor.Started:
		d.spans = make([]*delivery, len(d.rows))
		for i, r := range d.rows {
			d.spans[i] = &delivery{sub: d.sub, claim: claimer.Claim{Row: r}}
			d.spans[i].startSpan(!d.releaseOnly)
		}
		if d.releaseOnly {
			d.finish(c, d.release(settler.ErrClosed, nil), false, true)
			return
		}
		if int(d.asked.Load()) == len(d.rows) {
			// Every row was cancelled between the claim and the start: the handler is not
			// called.
			d.finish(c, d.release(nil, d.takeCancels()), true, true)
			return
		}
		sys, self := c.ActorSystem(), c.Self()
		d.dctx = new(deadline.Context)
		d.sub.initDeadline(d.dctx, &overrunTo{sys: sys, self: self})
		d.handlerCtx.Store(d.dctx)
		if int(d.asked.Load()) == len(d.rows) {
			d.dctx.Cancel(d.lastCause()) // the last row's Cancel saw no context yet
		}
		d.sub.cfg.Dispatcher.Schedule(func() { d.run(sys, self) })
	case overrunMsg:
		if !d.settled && d.state.CompareAndSwap(running, abandoned) {
			d.abandon(c)
		}
	case handledMsg:
		d.finish(c, d.settle(), true, true)
	case *actor.Stopping:
		if d.settled {
			return
		}
		if d.state.CompareAndSwap(running, released) {
			// The handler still runs; batches are never transactional, so the handler holds
			// nothing of the claim transaction: the rows go back now, and run reports them
			// when the handler returns.
			d.finish(c, d.release(settler.ErrClosed, nil), true, false)
			return
		}
		d.finish(c, d.release(settler.ErrClosed, nil), true, true)
	}
}

func (d *batchDelivery) run(sys *actor.ActorSystem, self *actor.PID) {
	start := time.Now()
	d.dctx.SetTimeout(d.sub.cfg.Timeout)
	d.outcomes, d.tags, d.panic = callBatch(d.dctx, d.sub.cfg.BatchHandler, d.rows, d.cancelled, d.sub.cfg.Log, d.sub.cfg.Table)
	d.took = time.Since(start)
	if d.panic == nil && d.dctx.Expired() {
		// Returned after the batch's deadline: every row failed (a wrong number of
		// outcomes still releases the batch).
		for i, o := range d.outcomes {
			d.outcomes[i] = lateOutcome(o, d.dctx.Timeout())
		}
	}
	d.dctx.Finish()
	if d.state.CompareAndSwap(running, handled) {
		sys.Root.Send(self, handledMsg{})
		return
	}
	if d.state.Load() == abandoned {
		// The actor rolled the batch back and told the hook already.
		d.sub.noteLateReturn(d.rows[0], fmt.Sprintf("a batch of %d rows", len(d.rows)), d.took)
		return
	}
	for i, r := range d.rows {
		res := Result{Row: r, Step: dialects.StepRelease, Released: true, Err: settler.ErrClosed, Panic: d.panic, Tag: d.tag(i)}
		if i < len(d.outcomes) {
			res.Outcome = d.outcomes[i]
		}
		d.sub.report(res)
	}
}

// settle plans each row's step and runs them all in the claim transaction. A row a Cancel
// asked for first ends as cancelled, whatever its outcome.
func (d *batchDelivery) settle() []Result {
	cfg := &d.sub.cfg
	reqs := d.takeCancels()
	if d.panic != nil {
		return d.release(fmt.Errorf("batch handler panicked: %v", d.panic), reqs)
	}
	if len(d.outcomes) != len(d.rows) {
		return d.release(fmt.Errorf("rowactor: the batch handler returned %d outcomes for %d rows; the rows were released", len(d.outcomes), len(d.rows)), reqs)
	}
	now := cfg.Now()
	steps := make([]dialects.Step, len(d.rows))
	results := make([]Result, len(d.rows))
	for i, row := range d.rows {
		if reqs != nil && reqs[i] != nil {
			step, o := cancelStep(reqs[i], row, now)
			steps[i], results[i] = step, Result{Row: row, Outcome: o, Step: step.Kind, Tag: d.tag(i)}
			continue
		}
		step, note := cfg.Rules.Plan(d.outcomes[i], row.Attempt, now)
		refused := d.sub.notePlan(row, d.outcomes[i], step, note)
		results[i] = Result{Row: row, Outcome: d.outcomes[i], Step: step.Kind, Event: step.Event, Tag: d.tag(i), Err: refused}
		if step.Kind == dialects.StepCustom && !cfg.Rules.Events[step.Event] {
			step = dialects.Step{Kind: dialects.StepRelease, Now: now} // commits nothing for the row: it returns
			results[i].Step, results[i].Event, results[i].Released = dialects.StepRelease, "", true
			results[i].Err = fmt.Errorf("rowactor: Event(%q) names no event of the subscription: %w", d.outcomes[i].Event, settler.ErrUnknownEvent)
		}
		if step.Kind == dialects.StepRelease {
			results[i].Step, results[i].Released = dialects.StepRelease, true
		}
		steps[i] = step
	}
	if d.sub.guardsSettlements() {
		for _, row := range d.rows {
			d.sub.poison.Settling(row.ID)
		}
		defer func() {
			for _, row := range d.rows {
				d.sub.poison.Settled(row.ID)
			}
		}()
	}
	ctx, cancel := context.WithTimeout(cfg.ctx, cfg.settleTimeout)
	defer cancel()
	if err := d.batch.Settle(ctx, steps); err != nil {
		err = fmt.Errorf("settle a batch of %d rows: %w", len(d.rows), err)
		for i := range results {
			results[i].Err = errors.Join(results[i].Err, err)
			if results[i].Step == dialects.StepDeadLetter {
				// The commit names no row: each row the batch moved to its dead letter is
				// set aside at its next claim rather than failing its move again.
				d.sub.notePoison(results[i])
			}
		}
	}
	return results
}

// release gives the batch's rows back, why says why: the claim transaction rolls back,
// and every row returns at once. Rows a Cancel asked for first (reqs[i], when reqs is
// not nil) end as cancelled instead, in one commit that returns the others unwritten: the
// handler holds nothing of the claim transaction (batches are never transactional), so
// this is safe while it may still run.
func (d *batchDelivery) release(why error, reqs []*cancelRequest) []Result {
	cfg := &d.sub.cfg
	ctx, cancel := context.WithTimeout(cfg.ctx, cfg.settleTimeout)
	defer cancel()
	var steps []dialects.Step
	var err error
	if reqs == nil {
		err = d.batch.Rollback(ctx)
		if err != nil {
			cfg.Log.Warn("rowactor: could not roll a batch back cleanly; its connection was closed",
				slog.String("table", cfg.Table), slog.Any("error", err))
		}
	} else {
		steps = make([]dialects.Step, len(d.rows))
		now := cfg.Now()
		for i, row := range d.rows {
			steps[i] = dialects.Step{Kind: dialects.StepRelease, Now: now} // runs nothing
			if reqs[i] != nil {
				steps[i], _ = cancelStep(reqs[i], row, now)
			}
		}
		if err = d.batch.Settle(ctx, steps); err != nil {
			err = fmt.Errorf("settle the cancelled rows of a batch of %d rows: %w", len(d.rows), err)
		}
	}
	wasHandled := d.state.Load() == handled
	results := make([]Result, len(d.rows))
	for i, row := range d.rows {
		if reqs != nil && reqs[i] != nil {
			_, o := cancelStep(reqs[i], row, steps[i].Now)
			results[i] = Result{Row: row, Outcome: o, Step: dialects.StepAck, Err: err}
			if wasHandled {
				// Only then: a handler still running (abandoned, or cut short) writes these.
				results[i].Tag, results[i].Panic = d.tag(i), d.panic
			}
			continue
		}
		results[i] = Result{Row: row, Step: dialects.StepRelease, Released: true, Err: errors.Join(why, err)}
		if wasHandled && i < len(d.outcomes) {
			results[i].Outcome, results[i].Tag = d.outcomes[i], d.tag(i)
		}
		if wasHandled && d.panic != nil {
			results[i].Panic = d.panic
		}
	}
	return results
}

// takeCancels is called as the batch's settlement begins: it returns, per row, the Cancel
// that asked first (nil when no row has one), and from then on a Cancel of any of its
// rows waits for this settlement.
func (d *batchDelivery) takeCancels() []*cancelRequest {
	var reqs []*cancelRequest
	for i := range d.cancels {
		if req := takeCancel(&d.cancels[i].p); req != nil {
			if reqs == nil {
				reqs = make([]*cancelRequest, len(d.rows))
			}
			reqs[i] = req
		}
	}
	return reqs
}

// cancelRow cancels row id of the batch (Subscription.Cancel): the row is marked, and the
// batch's context left running for its other rows, until the request for its last row.
func (d *batchDelivery) cancelRow(ctx context.Context, id int64, cause error, reason string) (Cancelled, bool, error) {
	i := slices.IndexFunc(d.rows, func(r dialects.Row) bool { return r.ID == id })
	if i < 0 {
		return Cancelled{}, false, nil
	}
	rc := &d.cancels[i]
	if dc := d.handlerCtx.Load(); dc != nil && d.state.Load() == running && deadline.From(ctx) == dc {
		// Called from the batch's own handler, with its context, which this Cancel does not
		// end: waiting would wait for the handler itself. Return at once, as a Cancel from
		// a delivery's handler does, its context ended by the Cancel (the row still ends
		// as cancelled when the handler returns).
		var stop context.CancelFunc
		ctx, stop = context.WithCancel(ctx)
		stop()
	}
	return requestCancel(ctx, &rc.p, cause, reason, func(req *cancelRequest) {
		rc.won.Store(req)
		if int(d.asked.Add(1)) == len(d.rows) {
			if dc := d.handlerCtx.Load(); dc != nil {
				dc.Cancel(cause) // no effect once the handler returned
			} // else the batch sees it as it starts
		}
	})
}

// cancelled is the cause of the Cancel that won row i, nil when none did: the batch
// handler's question (Delivery.Cancelled), safe from any goroutine.
func (d *batchDelivery) cancelled(i int) error {
	if i < 0 || i >= len(d.cancels) {
		return nil
	}
	if req := d.cancels[i].won.Load(); req != nil {
		return req.cause
	}
	return nil
}

// lastCause is the cause of a Cancel that won a row of the batch (the batch's context's,
// once every row was cancelled).
func (d *batchDelivery) lastCause() error {
	for i := len(d.cancels) - 1; i >= 0; i-- {
		if err := d.cancelled(i); err != nil {
			return err
		}
	}
	return nil
}

func (d *batchDelivery) tag(i int) any {
	if i < len(d.tags) {
		return d.tags[i]
	}
	return nil
}

// finish reports every row (unless the handler's goroutine will), ends its span, and
// frees the batch's worker.
func (d *batchDelivery) finish(c actor.Context, results []Result, tookWorker, report bool) {
	d.settled = true
	took := time.Duration(0)
	if d.state.Load() == handled {
		took = d.took
	}
	for i, r := range results {
		if r.Released {
			d.sub.released.Add(1)
		}
		d.spans[i].finishSpan(r, took)
		if report {
			d.sub.report(r)
		}
		d.sub.batchBook.remove(r.Row.ID, d)
		endCancel(&d.cancels[i].p, r)
	}
	c.Send(c.Parent(), &settledMsg{freed: true, rows: len(d.rows), workerFreed: !tookWorker, handled: !d.releaseOnly})
	if _, stopping := c.Message().(*actor.Stopping); !stopping {
		c.Stop(c.Self())
	}
}

// callBatch runs h and turns a panic into an unsettled batch.
func callBatch(ctx context.Context, h BatchHandler, rows []dialects.Row, cancelled func(int) error, log *slog.Logger, table string) (o []settler.Outcome, tags []any, p any) {
	defer func() {
		if v := recover(); v != nil {
			p = v
			o = nil
			log.Warn("rowactor: batch handler panicked; its rows are released unsettled",
				slog.String("table", table), slog.Int("rows", len(rows)), slog.Any("panic", v),
				slog.String("stack", string(debug.Stack())))
		}
	}()
	o, tags = h(ctx, rows, cancelled)
	return o, tags, nil
}
