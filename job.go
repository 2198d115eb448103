package rowactor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/actors"
	"github.com/rowactor/rowactor/dialects"
)

// Job is one row as Inspect read it: its columns and where it stands.
// Columns the table does not describe, and NULLs, read as zero values.
type Job = dialects.Job

// JobState is where a row stands: cancelled, processed, in work, dead, delayed or due.
// A row is in the first of these that holds, as `rowactor stats` counts rows.
type JobState = dialects.JobState

// The states of a row, as Job.State reports them. JobDead is a dead letter of a table
// that describes DeadAt (its dead_at is set, Job.DeadAt tells when it died): it waits
// for a requeue and is never due, whatever its retry_after. JobCancelled is a row a
// cancellation (the outcome Cancel, or Broker.Cancel) ended and the table kept: its
// processed_at is set and its error column starts with dialects.CancelledPrefix. It is
// never JobProcessed too.
const (
	JobCancelled = dialects.JobCancelled
	JobProcessed = dialects.JobProcessed
	JobInWork    = dialects.JobInWork
	JobDead      = dialects.JobDead
	JobDelayed   = dialects.JobDelayed
	JobDue       = dialects.JobDue
)

// Inspect reads row id of table t and tells where it stands. It runs one statement
// that writes nothing, and reads the row's attempt, payload, headers, delay, lease,
// processed time, time of death and last error, as far as the table describes them.
//
// A dead letter reads as JobDead where the table describes DeadAt, which every
// dead-letter move sets; without the column it reads as due or delayed.
//
// In the row lock form, and for SQLite's advisory keys, a row in work reads as due and
// Job.InWorkCounted is false: those locks live in the consuming session or process.
//
// It returns an error wrapping ErrNotFound when the table holds no such row, a
// *ConfigError when the description does not match the live table, and ErrClosed once
// Shutdown began.
func (b *Broker) Inspect(ctx context.Context, t Table, id int64) (Job, error) {
	in, ok := b.d.(dialects.Inspector)
	if !ok {
		return Job{}, fmt.Errorf("rowactor: the %s dialect cannot inspect rows (dialects.Inspector)", b.d.Name())
	}
	if !b.enterPublish() {
		return Job{}, fmt.Errorf("rowactor: inspect row %d of %s: %w", id, t.Name, ErrClosed)
	}
	defer b.leavePublish()
	return in.Inspect(ctx, t, id, b.now())
}

// RetryNow makes a delayed row of t due now. It clears the row's retry_after and keeps
// its attempt, in one statement fenced by the row's state. A row due already is no error.
//
// It refuses, with an error wrapping:
//   - ErrInWork, a row in work, which is left to its delivery: a lease that has not run
//     out, a row a claim holds, or a key a session holds. SQLite sees keys of this process
//     only.
//   - ErrFinished, a processed row.
//   - ErrNotFound, a missing row.
//
// The table needs a retry_after column; without one it returns a *ConfigError.
func (b *Broker) RetryNow(ctx context.Context, t Table, id int64) error {
	jc, err := b.jobController("retry", t, id)
	if err != nil {
		return err
	}
	defer b.leavePublish()
	return jc.RetryNow(ctx, t, id, b.now())
}

// Cancel ends row id of t as Drop would, as the handler outcome Cancel does. The row is
// deleted, or, where the table keeps finished rows, marked processed with reason in its
// error column after dialects.CancelledPrefix: it then reads as JobCancelled, and Stats
// leaves the reason out of its most frequent errors.
//
// A queued row is changed at once. A row in work under a delivery of this broker is
// cancelled in its delivery: the handler's context is cancelled with a cause wrapping
// ErrCancelled, and the row ends as cancelled whatever the handler returns. Cancel waits
// for that settlement until ctx ends, and returns nil once it took effect.
//
// A row in work in another process or broker is cancelled there when t names a
// CancelRequests table: Cancel records the request, the holder reads it within half a
// second and cancels its delivery as above, and Cancel returns nil once the row ended
// cancelled, or an error wrapping ErrFinished when the delivery settled the row first.
// When ctx ends first, or the broker shuts down, Cancel withdraws the request and returns
// an error wrapping ErrInWork, or ErrClosed. Without CancelRequests such a row is refused
// with ErrInWork.
//
// It returns an error wrapping ErrFinished when the row was processed, or its delivery
// settled it first; ErrNotFound when there is no such row.
//
// Called from the row's own handler, pass it the handler's ctx, or return Drop instead:
// Cancel would otherwise wait for itself.
//
// See docs/cancel.md for batches, rows waiting for a worker, and handlers that ignore
// their context.
func (b *Broker) Cancel(ctx context.Context, t Table, id int64, reason string) error {
	jc, err := b.jobController("cancel", t, id)
	if err != nil {
		return err
	}
	defer b.leavePublish()
	if err := dialects.CheckJobControl(t, "Cancel"); err != nil {
		return err // before a delivery is cancelled on a description no statement could run
	}
	err = b.cancelHere(ctx, t, id, reason, jc)
	if t.CancelRequests == "" || !errors.Is(err, ErrInWork) {
		return err
	}
	return b.cancelElsewhere(ctx, t, id, reason, jc)
}

// cancelHere cancels row id where it is queued, or in its delivery when a subscription
// of this broker holds it. It returns an error wrapping ErrInWork when another process
// or broker holds the row.
func (b *Broker) cancelHere(ctx context.Context, t Table, id int64, reason string, jc dialects.JobController) error {
	for tries := 1; ; tries++ {
		_, claimed, _ := b.claimActivity(t)
		held, gaveBack, err := b.cancelInWork(ctx, t, id, reason)
		if held {
			return err
		}
		err = jc.Cancel(ctx, t, id, b.now(), reason)
		if !errors.Is(err, ErrInWork) {
			return err
		}
		// A claim of this broker's may have taken the row since it was looked for, so
		// look again. Look a few times more, a moment apart, while either may be so:
		//   - a delivery of this broker gave the row back just now, its handler given up
		//     on. A claim of its subscription is likely to take it again at once, and to
		//     hold its lock or key while it reads the row.
		//   - a claim is in flight. It holds its rows, by a lease, a row lock or a key,
		//     before its subscription has them where a look finds them.
		// And look for as long as a subscription is giving rows back from its backlog
		// (its workers all stuck): such a row is in no book until its release commits,
		// which the settle timeout bounds, and is then queued, for this Cancel to take.
		if held, _, err := b.cancelInWork(ctx, t, id, reason); held {
			return err
		}
		inFlight, claimedNow, givingBack := b.claimActivity(t)
		moving := gaveBack || inFlight > 0 || givingBack > 0 || claimedNow != claimed
		if !moving || tries >= cancelTries && givingBack == 0 {
			return err
		}
		select {
		case <-time.After(min(time.Duration(tries)*10*time.Millisecond, 100*time.Millisecond)):
		case <-ctx.Done():
			return err
		}
	}
}

// cancelTries bounds the looks for a row that a delivery of this broker gave back and a
// claim of it took again. That is about a second and a half in all.
const cancelTries = 20

// cancelInWork cancels the delivery of this broker that holds row id of t, if one does,
// and waits for its end. held is false when none does. It is false too when the delivery
// gave the row back to the queue before the cancel could take effect; gaveBack then tells
// the caller to cancel the queued row.
func (b *Broker) cancelInWork(ctx context.Context, t Table, id int64, reason string) (held, gaveBack bool, err error) {
	b.mu.Lock()
	var subs []*actors.Subscription
	for _, s := range b.subs {
		if s.table.Name == t.Name {
			subs = append(subs, s.run)
		}
	}
	b.mu.Unlock()
	cause := fmt.Errorf("rowactor: row %d of %s cancelled: %s: %w", id, t.Name, reason, ErrCancelled)
	for _, s := range subs {
		c, held, err := s.Cancel(ctx, id, cause, reason)
		switch {
		case !held:
			continue
		case err != nil:
			return true, false, fmt.Errorf("rowactor: cancel row %d of %s: its delivery has not settled yet (it settles as cancelled once its handler returns): %w", id, t.Name, err)
		case c.Won && c.Result.Err == nil && c.Result.Step == dialects.StepAck:
			return true, false, nil // the cancel's own settlement; a Shutdown's release is none
		case !c.Won && c.Result.Err == nil && (c.Result.Step == dialects.StepAck || c.Result.Step == dialects.StepDeadLetter):
			return true, false, fmt.Errorf("rowactor: cancel row %d of %s: its delivery settled it first (%s, %s): %w",
				id, t.Name, c.Result.Outcome.Verdict, c.Result.Step, ErrFinished)
		case b.closing.Load():
			return true, false, fmt.Errorf("rowactor: cancel row %d of %s: its delivery ended (%s) as Shutdown released it: %w", id, t.Name, c.Result.Step, ErrClosed)
		}
		// The row went back to the queue. Or the cancel's settlement failed, and the
		// statement tells where the row stands now.
		return false, true, nil
	}
	return false, false, nil
}

// claimActivity counts the claims of this broker's subscriptions to t: those in flight,
// how many took their rows in (or gave rows back) so far, and the rows being given back.
// Cancel looks again while these move.
func (b *Broker) claimActivity(t Table) (inFlight int64, done uint64, givingBack int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.subs {
		if s.table.Name == t.Name {
			n, d, g := s.run.Claiming()
			inFlight, done, givingBack = inFlight+n, done+d, givingBack+g
		}
	}
	return inFlight, done, givingBack
}

// jobController finds the dialect's job control and counts the call in flight. The
// caller leaves with leavePublish.
func (b *Broker) jobController(op string, t Table, id int64) (dialects.JobController, error) {
	jc, ok := b.d.(dialects.JobController)
	if !ok {
		return nil, fmt.Errorf("rowactor: the %s dialect cannot %s rows (dialects.JobController)", b.d.Name(), op)
	}
	if !b.enterPublish() {
		return nil, fmt.Errorf("rowactor: %s row %d of %s: %w", op, id, t.Name, ErrClosed)
	}
	return jc, nil
}
