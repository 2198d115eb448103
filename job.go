package rowactor

import (
	"context"
	"fmt"

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

// Cancel takes a queued row of t out of its queue as Drop would: it is deleted, or, where
// the table keeps finished rows, marked processed with reason in its error column (and
// its unique key cleared with ClearUniqueKeyAtAck). It refuses as RetryNow does: a row in
// work (ErrInWork) is left to its delivery, which settles it as it would have.
func (b *Broker) Cancel(ctx context.Context, t Table, id int64, reason string) error {
	jc, err := b.jobController("cancel", t, id)
	if err != nil {
		return err
	}
	defer b.leavePublish()
	return jc.Cancel(ctx, t, id, b.now(), reason)
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
