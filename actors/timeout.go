package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/deadline"
	"github.com/rowactor/rowactor/settler"
)

// Timeouts. A delivery's handler runs with a deadline.Context: its deadline is set to
// Config.Timeout when the handler starts, and the handler may move it (SetTimeout). A
// handler that returns after the deadline is failed whatever it returned (lateOutcome). A
// handler still running a grace after the deadline is abandoned: the delivery actor gives
// its row back by the form's rule and frees its worker (abandon), and the handler's outcome,
// when it comes, changes nothing.

// grace is how long past its deadline a handler may run before it is abandoned: a tenth of
// its timeout, at least a second. A handler that honours its context returns well within
// it; the grace is for one that notices late, between two steps of its own.
func grace(timeout time.Duration) time.Duration { return max(time.Second, timeout/10) }

// overrunMsg tells a delivery (or batch) actor its handler is still running a grace past
// its deadline.
type overrunMsg struct{}

func (overrunMsg) IgnoreDeadLetterLogging() {}

// initDeadline makes dc, a zero context, a delivery's handler context, ending with the
// subscription's handlers and watched: w is told a grace past its deadline.
func (s *Subscription) initDeadline(dc *deadline.Context, w deadline.Overrunner) {
	s.handlers.Init(dc)
	dc.Watch(grace, w)
}

// Overran sends the delivery actor overrunMsg (its handler context's watch).
func (d *delivery) Overran() { d.sys.Root.Send(d.self, overrunMsg{}) }

// overrunTo sends an actor overrunMsg (a batch's handler context's watch).
type overrunTo struct {
	sys  *actor.ActorSystem
	self *actor.PID
}

func (o *overrunTo) Overran() { o.sys.Root.Send(o.self, overrunMsg{}) }

// lateOutcome is the outcome of a handler that returned after its deadline: a Fail with
// an error wrapping context.DeadlineExceeded, whatever it returned, so the retry policy's
// delay, the attempt count, the error column and the dead letter at the cap apply as to
// any failure (in transactional mode an Ack's writes are rolled back with it: the deadline
// bounds the delivery, commit included). A Fail whose error already wraps
// context.DeadlineExceeded is the handler's own account of it, and is kept.
func lateOutcome(o settler.Outcome, timeout time.Duration) settler.Outcome {
	if o.Verdict == settler.Fail && errors.Is(o.Err, context.DeadlineExceeded) {
		return o
	}
	err := fmt.Errorf("rowactor: the handler returned %s after its deadline (timeout %v): %w", o.Verdict, timeout, context.DeadlineExceeded)
	return settler.Outcome{Verdict: settler.Fail, Err: err, Error: err.Error()}
}

// abandonedErr is the error a delivery given up on reports.
func abandonedErr(timeout time.Duration) error {
	return fmt.Errorf("rowactor: the handler did not return within its timeout (%v) and the grace after it (%v); "+
		"its row was released: %w", timeout, grace(timeout), errors.Join(settler.ErrAbandoned, context.DeadlineExceeded))
}

// warnAbandoned logs a delivery given up on, once.
func (s *Subscription) warnAbandoned(row dialects.Row, rows int, timeout time.Duration) {
	cfg := &s.cfg
	attrs := []any{slog.String("table", cfg.Table), slog.String("queue", cfg.QueueName), slog.Int64("id", row.ID),
		slog.Int("attempt", row.Attempt), slog.String("form", cfg.Form.String()), slog.Duration("timeout", timeout),
		slog.Duration("grace", grace(timeout))}
	if rows > 1 {
		attrs = append(attrs, slog.Int("rows", rows))
	}
	cfg.Log.Warn("rowactor: the handler ran past its deadline and ignored its context; the delivery is abandoned, "+
		"its row released and its worker freed", attrs...)
}

// noteLateReturn logs an abandoned handler's return: its outcome changed nothing.
func (s *Subscription) noteLateReturn(row dialects.Row, outcome string, took time.Duration) {
	s.cfg.Log.Info("rowactor: an abandoned handler returned; its outcome changed nothing",
		slog.String("table", s.cfg.Table), slog.String("queue", s.cfg.QueueName), slog.Int64("id", row.ID),
		slog.String("outcome", outcome), slog.Duration("took", took))
}

// abandon gives up on the delivery's handler, still running a grace past its deadline: the
// row goes back by the form's rule, as Shutdown gives back a row whose handler still runs,
// and the worker is freed. The hook and the span are told now, once; run only logs the
// handler's return.
func (d *delivery) abandon(c actor.Context) {
	cfg := &d.sub.cfg
	timeout := d.dctx.Timeout()
	d.sub.warnAbandoned(d.claim.Row, 1, timeout)
	cfg.Telemetry.Abandoned(d.spanCtx, 1)
	// A Cancel that asked first is carried out here, where the form allows it while the
	// handler may still run: the row ends as cancelled rather than going back.
	req := d.takeCancel()
	var r Result
	switch {
	case cfg.Transactional:
		r = d.interrupt(req)
	case req != nil:
		// Outside transactional mode the handler holds nothing of the row, and its
		// outcome and tag are its goroutine's: neither is read.
		step, o := d.cancelStep(req)
		r = d.runStep(step, o, nil)
	default:
		r = d.releaseOn(cfg.ctx, settler.Outcome{}, nil)
	}
	if r.Step == dialects.StepRelease || r.Err != nil {
		r.Err = errors.Join(abandonedErr(timeout), r.Err)
	}
	d.settled = true
	d.finishSpan(r, time.Since(d.spawned)) // its handler started as it was spawned
	d.sub.report(r)
	d.end(c, r)
	d.stopSelf(c)
}

// interrupt gives a transactional delivery's row back while its handler may still be
// using the lent transaction: the dialect ends the transaction safely from this goroutine
// (dialects.DeliveryTx.Interrupt: on PostgreSQL by closing the connection's socket, which
// no pgx call makes while another goroutine may be in one; through database/sql, by a
// rollback it serialises behind a statement in flight), giving up the row's lock or key
// and its connection; a lease is then released through the pool.
func (d *delivery) interrupt(req *cancelRequest) Result {
	cfg := &d.sub.cfg
	row := d.claim.Row
	r := Result{Row: row, Step: dialects.StepRelease, Released: true}
	ctx, cancel := context.WithTimeout(cfg.ctx, cfg.settleTimeout)
	defer cancel()
	var held dialects.DeliveryTx
	// unstarted: a lease delivery whose transaction was never lent, so its handler never
	// started (lentLeaseTx keeps begin from starting it now): the row goes back with the
	// attempt its claim counted, as any row given back before its handler started.
	unstarted := false
	switch cfg.Form {
	case dialects.FormRowLock:
		held = d.claim.Locked.(dialects.DeliveryTx)
	case dialects.FormAdvisory:
		held = d.claim.Session.(dialects.DeliveryTx)
		r.closed = cfg.Limits.SessionConnections
	case dialects.FormLease:
		if ltx := d.lentLeaseTx(); ltx != nil {
			held = ltx
		} else {
			unstarted = true
		}
	}
	if held != nil {
		if err := held.Interrupt(ctx); err != nil {
			r.Err = err
			cfg.Log.Warn("rowactor: could not end an abandoned delivery's transaction cleanly; its connection was closed",
				slog.String("table", cfg.Table), slog.Int64("id", row.ID), slog.Any("error", err))
		}
	}
	if cfg.Form == dialects.FormLease && req != nil {
		// The lease outlives the transaction: a Cancel that asked first ends the row.
		step, o := d.cancelStep(req)
		r.Outcome, r.Step, r.Released = o, step.Kind, false
		r.Err = errors.Join(r.Err, d.settleLease(ctx, step))
		return r
	}
	if cfg.Form == dialects.FormLease {
		if err := d.settleLease(ctx, dialects.Step{Kind: dialects.StepRelease, Now: cfg.Now(), Unstarted: unstarted}); err != nil {
			r.Released = false
			if !errors.Is(err, settler.ErrClosed) || errors.Is(err, settler.ErrCutByStop) {
				r.Err = errors.Join(r.Err, err)
				cfg.Log.Warn("rowactor: could not release a lease; the row returns when it expires",
					slog.String("table", cfg.Table), slog.Int64("id", row.ID), slog.Any("error", err))
			}
		}
	}
	return r
}

// abandon gives up on a batch handler still running a grace past its deadline: the claim
// transaction ends (the handler holds nothing of it: batches are never transactional),
// every row returns but those a Cancel asked for first, which end as cancelled, and the
// worker is freed.
func (d *batchDelivery) abandon(c actor.Context) {
	timeout := d.dctx.Timeout()
	d.sub.warnAbandoned(d.rows[0], len(d.rows), timeout)
	d.sub.cfg.Telemetry.Abandoned(d.sub.cfg.ctx, len(d.rows))
	d.finish(c, d.release(abandonedErr(timeout), d.takeCancels()), true, true)
}
