package settler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var (
	// ErrLeaseLost reports a lease-form settlement that found another token on its row:
	// the row belongs to a later claim, and the settlement changed nothing.
	ErrLeaseLost = errors.New("rowactor: lease lost")
	// ErrClosed reports work refused because the broker was shut down (and, for a
	// delivery, that its row was released without its outcome).
	ErrClosed = errors.New("rowactor: broker closed")
	// ErrCutByStop is wrapped, with ErrClosed, by a settlement that its subscription's
	// stop cut short before it took effect (its statement ran past the stop's grace, or
	// it waited for a row another session held). In the lease form the row keeps its
	// lease until it runs out; in the others the cut statement's connection is closed,
	// which frees the row. On PostgreSQL a cut lease release may still take effect once
	// the row's lock is free (the server learns of the cut from a best-effort cancel
	// request): the row then returns before its lease runs out. A settlement refused
	// because its row was settled or released already is ErrClosed without it.
	ErrCutByStop = errors.New("its subscription stopped before the settlement took effect")
	// ErrUnknownEvent reports an Event outcome naming an event the subscription does not
	// have; the row was released unsettled.
	ErrUnknownEvent = errors.New("rowactor: unknown event")
	// ErrAbandoned reports a delivery whose handler ran past its deadline and its grace:
	// the runtime gave its row back without its outcome, which changes nothing when it
	// comes.
	ErrAbandoned = errors.New("rowactor: delivery abandoned past its deadline")
)

// Verdict is what a handler decided.
type Verdict uint8

const (
	// unsettled is a delivery that ended without an outcome: a handler panic, a shutdown,
	// a lost context. Its row is released at once.
	unsettled Verdict = iota
	Ack
	Drop
	Retry
	RetryAfter
	// Custom runs an event of the service's own, named by Outcome.Event.
	Custom
	// Fail is a failed delivery: the row returns after the subscription's backoff
	// (Rules.Backoff), with its error recorded, or moves to its dead letter once its
	// attempts are spent.
	Fail
	// Snooze returns the row after Outcome.Delay without spending an attempt.
	Snooze
	// Cancel ends a row as Broker.Cancel does: the ack step (deleted, or processed), its
	// reason written as dialects.CancelledError. No event of the subscription's replaces it.
	Cancel
	// DeadLetter moves the row to its dead letter at once, whatever its attempts, when the
	// subscription has one (MaxAttempts above zero); else it is dropped, with its error.
	DeadLetter
)

func (v Verdict) String() string {
	switch v {
	case Ack:
		return "ack"
	case Drop:
		return "drop"
	case Retry:
		return "retry"
	case RetryAfter:
		return "retry_after"
	case Custom:
		return "event"
	case Fail:
		return "fail"
	case Snooze:
		return "snooze"
	case Cancel:
		return "cancel"
	case DeadLetter:
		return "dead_letter"
	}
	return "unsettled"
}

// Outcome is a verdict and, for RetryAfter and Snooze, its delay.
type Outcome struct {
	Verdict Verdict
	Delay   time.Duration
	// Event names an Event outcome's event; Args are its {arg1}, {arg2}, ... values.
	Event string
	Args  []any
	// Error is the handler's reason, for an event's {error} and the error column.
	Error string
	// Err is the handler's error itself (Fail's, or WithError's), for the backoff policy,
	// the log, the span and the OnSettled hook.
	Err error
}

// Rules are a subscription's settlement rules.
type Rules struct {
	// MaxAttempts, when above zero, turns a Retry, RetryAfter or Fail of a row whose
	// attempt reached it into a dead-letter move.
	MaxAttempts int
	// HasRetryAfter says the table can store a delay; without it RetryAfter is a Retry.
	HasRetryAfter bool
	// LeaseDelays says a delay without retry_after can be kept in the row's lease
	// (locked_until = the due time): the lease form. Fail and Snooze then delay; RetryAfter
	// keeps its rule (a Retry, with a warning).
	LeaseDelays bool
	// Backoff is a failed delivery's delay from the attempt it reported and its error.
	// nil returns the row at once.
	Backoff func(attempt int, err error) time.Duration
	// Events are the names of the subscription's own events (QueueSpec.Events): a step
	// whose built-in name (ack, drop, retry, retry_after, dead_letter) is among them runs
	// the event instead.
	Events map[string]bool
}

// Note is a warning the plan wants logged.
type Note uint8

const (
	// NoteNone: nothing to log.
	NoteNone Note = iota
	// NoteAttemptsSpent: a retry became a dead-letter move.
	NoteAttemptsSpent
	// NoteNoRetryAfter: RetryAfter ran as Retry because the table has no retry_after column.
	NoteNoRetryAfter
	// NoteFailNoRetryAfter: a Fail ran as Retry (no delay) because the table has no
	// retry_after column and is not in the lease form.
	NoteFailNoRetryAfter
	// NoteSnoozeNoRetryAfter: a Snooze was refused (the step releases the row unsettled)
	// because the table has no retry_after column and is not in the lease form.
	NoteSnoozeNoRetryAfter
	// NoteCancelled: a Cancel ends the row as cancelled.
	NoteCancelled
	// NoteDeadLettered: a DeadLetter outcome moves the row to its dead letter, or drops it
	// without one (the step tells which).
	NoteDeadLettered
)

// Plan returns the step for an outcome of a delivery that reported attempt, as of now.
// A step the subscription replaced with an event of its own names that event.
func (r Rules) Plan(o Outcome, attempt int, now time.Time) (dialects.Step, Note) {
	step, note := r.plan(o, attempt, now)
	step.Error, step.Attempt = o.Error, attempt
	if o.Verdict == Cancel {
		step.Error = dialects.CancelledError(o.Error)
	}
	if name := builtinEvent(o.Verdict, step.Kind); name != "" && r.Events[name] {
		step.Event = name
	}
	return step, note
}

func (r Rules) plan(o Outcome, attempt int, now time.Time) (dialects.Step, Note) {
	step := dialects.Step{Now: now}
	switch o.Verdict {
	case Ack, Drop:
		step.Kind = dialects.StepAck
		return step, NoteNone
	case Cancel:
		step.Kind = dialects.StepAck
		return step, NoteCancelled
	case DeadLetter:
		if r.MaxAttempts > 0 { // a dead letter is configured (it caps the attempts)
			step.Kind = dialects.StepDeadLetter
			return step, NoteDeadLettered
		}
		step.Kind = dialects.StepAck
		return step, NoteDeadLettered
	case Retry, RetryAfter, Fail:
		if r.MaxAttempts > 0 && attempt >= r.MaxAttempts {
			step.Kind = dialects.StepDeadLetter
			return step, NoteAttemptsSpent
		}
		switch o.Verdict {
		case Retry:
			step.Kind = dialects.StepRetry
			return step, NoteNone
		case Fail:
			step.At = now.Add(r.backoff(attempt, o.Err))
			if !r.HasRetryAfter && !r.LeaseDelays && !r.Events[dialects.EventRetryAfter] {
				step.Kind = dialects.StepRetry
				return step, NoteFailNoRetryAfter
			}
			step.Kind = dialects.StepRetryAfter
			return step, NoteNone
		}
		step.At = now.Add(max(o.Delay, 0))
		if !r.HasRetryAfter && !r.Events[dialects.EventRetryAfter] {
			step.Kind = dialects.StepRetry
			return step, NoteNoRetryAfter
		}
		step.Kind = dialects.StepRetryAfter
		return step, NoteNone
	case Snooze:
		// Never a dead letter: a snooze spends no attempt.
		step.At = now.Add(max(o.Delay, 0))
		if !r.HasRetryAfter && !r.LeaseDelays {
			step.Kind = dialects.StepRelease
			return step, NoteSnoozeNoRetryAfter
		}
		step.Kind = dialects.StepSnooze
		return step, NoteNone
	case Custom:
		step.Kind, step.Event, step.Args = dialects.StepCustom, o.Event, o.Args
		return step, NoteNone
	default:
		step.Kind = dialects.StepRelease
		return step, NoteNone
	}
}

// backoff is a failed delivery's delay by the policy, never negative.
func (r Rules) backoff(attempt int, err error) time.Duration {
	if r.Backoff == nil {
		return 0
	}
	return max(r.Backoff(attempt, err), 0)
}

// builtinEvent names the built-in settlement a step runs, as events replace them. A
// snooze has no event of its own: it always runs its built-in statement. Nor has a
// Cancel: it ends the row as Broker.Cancel does, which runs no event.
func builtinEvent(v Verdict, k dialects.StepKind) string {
	if v == Cancel {
		return ""
	}
	switch k {
	case dialects.StepAck:
		if v == Drop || v == DeadLetter {
			return dialects.EventDrop
		}
		return dialects.EventAck
	case dialects.StepRetry:
		return dialects.EventRetry
	case dialects.StepRetryAfter:
		return dialects.EventRetryAfter
	case dialects.StepDeadLetter:
		return dialects.EventDeadLetter
	}
	return ""
}

// HeldLease is a lease in work whose token its renewer may still move (a
// leaserenewer.Held). A settlement pins it to read the token it runs with, and marks it
// done once the statement ran.
type HeldLease interface {
	// ID is the lease's row.
	ID() int64
	// Pin stops the lease's renewal and returns its current token. lost reports a lease
	// that is gone for good; ok is false for a lease pinned already (settled or released).
	Pin() (held dialects.Lease, lost, ok bool)
	// Unpin gives a pinned lease back to its renewer while its settlement waits (a row
	// another session holds): Pin reads its token again when the settlement runs.
	Unpin()
	// Done takes the lease out of its book.
	Done()
}

// stopGrace is how long a settlement statement may still run once its subscription's
// waits ended (Stop: Shutdown's context is over): enough for one that waits for nothing
// (a release at the stop, a settlement whose handler returned as the stop came) to
// finish, while one that waits for a lock another session holds gives up soon: cutting
// a statement short takes its own time (on MariaDB a KILL from another connection), and
// Shutdown returns within 1.5 s of its context's end. Under load a release may take
// longer: the lease form's is then reported cut (ErrCutByStop), its row leased until
// the lease runs out (a second grace pushed Shutdown past 4 s behind a locked row on a
// loaded MariaDB).
const stopGrace = 500 * time.Millisecond

// StatementCtx is a settlement statement's context: base's, bounded by timeout, and, once
// waits ended, by stopGrace from then or from its start, whichever is later. The dialects
// make a statement cut short while it waits for a lock change nothing, then or later: the
// server ends it (PostgreSQL's cancel request, MariaDB's KILL, SQLite's busy handler).
func StatementCtx(base, waits context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(base, timeout)
	if waits.Done() == nil {
		return ctx, cancel // waits that never end (a row lock settlement's): nothing to watch
	}
	stop := context.AfterFunc(waits, func() { time.AfterFunc(stopGrace, cancel) })
	return ctx, func() {
		stop()
		cancel()
	}
}

// CutByStop says whether err, a statement's failure, is its context's end after waits
// ended (StatementCtx): the caller reports it as ErrClosed, with err.
func CutByStop(waits context.Context, err error) bool {
	return err != nil && waits.Err() != nil && !errors.Is(err, ErrClosed) &&
		(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// Lease runs a lease-form step fenced by the delivery's token. It returns ErrLeaseLost,
// having changed nothing, when the row holds another token.
func Lease(ctx context.Context, q dialects.LeaseQueue, step dialects.Step, held dialects.Lease) error {
	ok, err := q.SettleLease(ctx, step, held)
	if err != nil {
		return fmt.Errorf("settle %s of row %d: %w", step.Kind, held.ID, err)
	}
	if !ok {
		return fmt.Errorf("settle %s of row %d: %w", step.Kind, held.ID, ErrLeaseLost)
	}
	return nil
}

// Advisory runs an advisory-form step on the session that holds the row's key, then
// unlocks the key, never before the statement returned. A failed statement still
// unlocks: the row returns as it was. A release runs no statement (the unlock returns
// the row), unless its handler never started: it then gives back the attempt the take
// counted (Step.Unstarted). closed reports that the session's connection was
// closed because the database did not confirm the unlock. err is the settlement's own
// error only: an unlock that fails after the statement took effect does not undo it (the
// connection is closed, which ends the lock), so it comes back as unlockErr.
func Advisory(ctx context.Context, s dialects.Session, step dialects.Step, id int64) (closed bool, err, unlockErr error) {
	if step.Kind != dialects.StepRelease || step.Unstarted {
		if serr := s.Settle(ctx, step, id); serr != nil {
			err = fmt.Errorf("settle %s of row %d: %w", step.Kind, id, serr)
		}
	}
	closed, uerr := s.Unlock(ctx)
	if uerr != nil {
		unlockErr = fmt.Errorf("unlock key of row %d: %w", id, uerr)
	}
	return closed, err, unlockErr
}

// RowLock runs a row-lock step in the claim transaction and ends it: the COMMIT is the
// settlement. A failed statement rolls back and the row returns as it was.
func RowLock(ctx context.Context, c dialects.LockedClaim, step dialects.Step, id int64) error {
	if err := c.Settle(ctx, step); err != nil {
		return fmt.Errorf("settle %s of row %d: %w", step.Kind, id, err)
	}
	return nil
}

// RowLockChained settles a row lock delivery as RowLock does and, once settled, claims
// the queue's next row on its connection (dialects.ChainingClaim).
func RowLockChained(ctx context.Context, c dialects.ChainingClaim, step dialects.Step, id int64, now time.Time) (next dialects.LockedClaim, err, claimErr error) {
	next, err, claimErr = c.SettleAndClaim(ctx, step, now)
	if err != nil {
		return nil, fmt.Errorf("settle %s of row %d: %w", step.Kind, id, err), nil
	}
	return next, nil, claimErr
}

// KeepsWrites says whether an outcome commits a transactional handler's writes: Ack and a
// custom event do (the event is the service's own settlement, run in the same
// transaction). Drop ends the row like Ack, but discards the handler's writes first.
func (o Outcome) KeepsWrites() bool { return o.Verdict == Ack || o.Verdict == Custom }

// RowLockTx settles a transactional row-lock delivery: with keep (Ack) the handler's
// writes commit with the settlement; otherwise the transaction first rolls back to the
// savepoint set after the claim, discarding them, then settles in the same transaction.
func RowLockTx(ctx context.Context, c dialects.TxLockedClaim, step dialects.Step, id int64, keep bool) error {
	if !keep {
		if err := c.RollbackToSavepoint(ctx); err != nil {
			_ = c.Rollback(ctx)
			return fmt.Errorf("roll back the handler's writes of row %d: %w", id, err)
		}
	}
	return RowLock(ctx, c, step, id)
}

// LeaseTx settles a transactional lease delivery's Ack inside its transaction, only while
// the row still holds the token: a lost lease rolls back everything, the handler's writes
// included, and returns ErrLeaseLost. Other steps are not run here: the caller rolls the
// transaction back and settles as outside transactional mode.
func LeaseTx(ctx context.Context, tx dialects.LeaseTx, step dialects.Step, held dialects.Lease) error {
	ok, err := tx.SettleLease(ctx, step, held)
	if err != nil {
		return fmt.Errorf("settle %s of row %d: %w", step.Kind, held.ID, err)
	}
	if !ok {
		return fmt.Errorf("settle %s of row %d: %w", step.Kind, held.ID, ErrLeaseLost)
	}
	return nil
}

// AdvisoryTx settles a transactional advisory delivery on the session holding its key:
// with keep (Ack) it settles inside the transaction and commits; otherwise it rolls back
// first, then settles as outside transactional mode. The key is unlocked after the
// transaction ended.
func AdvisoryTx(ctx context.Context, s dialects.TxSession, step dialects.Step, id int64, keep bool) (closed bool, err, unlockErr error) {
	if keep {
		if err = s.Settle(ctx, step, id); err == nil {
			if err = s.Commit(ctx); err != nil {
				err = fmt.Errorf("commit the settlement of row %d: %w", id, err)
			}
		} else {
			err = fmt.Errorf("settle %s of row %d: %w", step.Kind, id, err)
		}
		if err != nil {
			_ = s.Rollback(ctx)
		}
		closed, uerr := s.Unlock(ctx)
		if uerr != nil {
			unlockErr = fmt.Errorf("unlock key of row %d: %w", id, uerr)
		}
		return closed, err, unlockErr
	}
	if rerr := s.Rollback(ctx); rerr != nil {
		err = fmt.Errorf("roll back the handler's writes of row %d: %w", id, rerr)
	}
	closed, aerr, unlockErr := Advisory(ctx, s, step, id)
	return closed, errors.Join(err, aerr), unlockErr
}
