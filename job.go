package rowactor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/actors"
	"github.com/rowactor/rowactor/dialects"
)

// Job is one row as Inspect read it: its columns (those the table describes; the others,
// and NULLs, read as zero values) and where it stands.
type Job = dialects.Job

// JobState is where a row stands: processed, in work, delayed or due, the first that
// holds, as `rowactor stats` counts rows.
type JobState = dialects.JobState

// The states of a row (Job.State).
const (
	JobProcessed = dialects.JobProcessed
	JobInWork    = dialects.JobInWork
	JobDelayed   = dialects.JobDelayed
	JobDue       = dialects.JobDue
)

// Inspect reads row id of table t and tells where it stands, in one statement that writes
// nothing: its attempt, payload, headers, delay, lease, processed time and last error, as
// the table describes them. In the row lock form (and for SQLite's advisory keys, which
// live in the consuming process) a row in work reads as due, and Job.InWorkCounted is
// false. It returns an error wrapping ErrNotFound when the table holds no such row, a
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

// RetryNow makes a delayed row of t due now (its retry_after cleared; its attempt stays),
// in one statement fenced by the row's state: a row in work (a lease that has not run
// out; in the row lock form, a row a claim holds; in the advisory form, a row whose key a
// session holds, which SQLite sees in this process only) is refused with an error
// wrapping ErrInWork and left to its delivery, a processed one with ErrFinished, a missing
// one with ErrNotFound. A row due already is no error. The table needs a retry_after
// column (*ConfigError otherwise).
func (b *Broker) RetryNow(ctx context.Context, t Table, id int64) error {
	jc, err := b.jobController("retry", t, id)
	if err != nil {
		return err
	}
	defer b.leavePublish()
	return jc.RetryNow(ctx, t, id, b.now())
}

// Cancel ends row id of t as Drop would: it is deleted or, where the table keeps finished
// rows, marked processed with reason in its error column (and its unique key cleared with
// ClearUniqueKeyAtAck), its attempt as it was.
//
// A queued row (due or delayed) is changed in one statement fenced by the row's state, as
// RetryNow's: a processed row is refused with ErrFinished, a missing one with ErrNotFound.
//
// A row in work under a delivery of this broker's (any subscription of it on t, in every
// form) is cancelled in its delivery: the handler's context is cancelled, with a cause
// (context.Cause) that wraps ErrCancelled and names reason, and once the handler returns
// the delivery settles the row as above, whatever the handler returned (even Ack: the
// cancel wins, and in transactional mode the handler's writes are rolled back, as for a
// Drop). Cancel waits for that settlement, until ctx ends, and returns nil once it took
// effect. The WithOnSettled hook sees the delivery as a drop whose HandlerErr is the cause.
//
// A cancel that comes after the delivery's own settlement began does not win: it waits for
// that settlement and returns an error wrapping ErrFinished when it ended the row (an Ack,
// a Drop, a dead-letter move); when it gave the row back to the queue (a retry, a
// release), the queued row is cancelled as above. A handler that ignores its cancelled
// context is given up on a grace after its deadline (Timeout), and its row ends as
// cancelled then: by its delivery, or (row lock and advisory forms in transactional mode,
// whose rows go back with the transaction) by Cancel as a queued row, looked for again
// for a moment should a claim of this broker's take it first. Without a deadline Cancel waits for the handler, or returns ctx's error first
// (the row still ends as cancelled when the handler returns). Called from the row's own
// handler, Cancel would wait for itself: pass it the handler's ctx (it then returns that
// context's error at once, and the row ends as cancelled when the handler returns), or
// return Drop instead.
//
// A row in a SubscribeBatch batch of this broker's is cancelled in its batch. The batch
// handler's context is shared by the batch's rows, so it is left running for the others'
// work (it is cancelled, with the cause, only once every row of the batch is); the row is
// marked instead, which the handler can ask about (Delivery.Cancelled returns the cause),
// and the batch's commit ends it as above whatever outcome the handler gave it. When the
// batch gives its rows back unsettled (a panic, a slice of outcomes of another length, a
// handler given up on past its deadline), its cancelled rows still end as cancelled, in
// one commit that returns the others; a batch all of whose rows were cancelled before it
// started does not call its handler. A batch is never transactional: nothing the handler
// wrote for the row is rolled back. Cancel waits for the batch's commit and reports as for
// a delivery; a cancel that comes once the batch's settlement began does not win. Called
// from the batch's own handler with its ctx (or a context made from it), Cancel returns at
// once, as from a delivery's handler, though the batch's ctx runs on.
//
// A row this broker claimed that waits for a worker (Prefetch, WorkersByKey) is settled as
// cancelled at once, without calling the handler. A row in work under another holder
// (another process, another broker) is refused with an error wrapping ErrInWork, and left
// to its holder; while a claim of this broker's on t is in flight (it may hold the row
// before its subscription shows it), Cancel looks for the row again a few times, a moment
// apart, before it says so.
func (b *Broker) Cancel(ctx context.Context, t Table, id int64, reason string) error {
	jc, err := b.jobController("cancel", t, id)
	if err != nil {
		return err
	}
	defer b.leavePublish()
	if err := dialects.CheckJobControl(t, "Cancel"); err != nil {
		return err // before a delivery is cancelled on a description no statement could run
	}
	for tries := 1; ; tries++ {
		_, claimed := b.claimActivity(t)
		held, gaveBack, err := b.cancelInWork(ctx, t, id, reason)
		if held {
			return err
		}
		err = jc.Cancel(ctx, t, id, b.now(), reason)
		if !errors.Is(err, ErrInWork) {
			return err
		}
		// A claim of this broker's may have taken the row since it was looked for: look
		// again. When a delivery of this broker's gave the row back just now (its
		// handler was given up on), a claim of its subscription is likely to take it
		// again at once, and to hold its lock or key while it reads the row; and a claim
		// in flight holds its rows (a lease written, a row locked, a key taken) before
		// its subscription has them where a look finds them: look again a few times, a
		// moment apart, while that may be so.
		if held, _, err := b.cancelInWork(ctx, t, id, reason); held {
			return err
		}
		inFlight, claimedNow := b.claimActivity(t)
		if !gaveBack && inFlight == 0 && claimedNow == claimed || tries == cancelTries {
			return err
		}
		select {
		case <-time.After(min(time.Duration(tries)*10*time.Millisecond, 100*time.Millisecond)):
		case <-ctx.Done():
			return err
		}
	}
}

// cancelTries bounds the looks for a row a delivery of this broker's gave back and a claim
// of its took again (Cancel): about a second and a half in all.
const cancelTries = 20

// cancelInWork cancels the delivery of this broker's that holds row id of t, if one does,
// and waits for its end. held is false when none does, or when the delivery gave the row
// back to the queue before the cancel could take effect (gaveBack: the caller then
// cancels the queued row).
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
			return true, false, nil // the cancel's own settlement (a Shutdown's release is none)
		case !c.Won && c.Result.Err == nil && (c.Result.Step == dialects.StepAck || c.Result.Step == dialects.StepDeadLetter):
			return true, false, fmt.Errorf("rowactor: cancel row %d of %s: its delivery settled it first (%s, %s): %w",
				id, t.Name, c.Result.Outcome.Verdict, c.Result.Step, ErrFinished)
		case b.closing.Load():
			return true, false, fmt.Errorf("rowactor: cancel row %d of %s: its delivery ended (%s) as Shutdown released it: %w", id, t.Name, c.Result.Step, ErrClosed)
		}
		// The row went back to the queue (or the cancel's settlement failed, and the
		// statement tells where the row stands now).
		return false, true, nil
	}
	return false, false, nil
}

// claimActivity is the claims of this broker's subscriptions to t: those in flight, and
// how many they took in so far (Cancel looks again while these move).
func (b *Broker) claimActivity(t Table) (inFlight int64, done uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.subs {
		if s.table.Name == t.Name {
			n, d := s.run.Claiming()
			inFlight, done = inFlight+n, done+d
		}
	}
	return inFlight, done
}

// jobController finds the dialect's job control and counts the call in flight (the
// caller leaves with leavePublish).
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
