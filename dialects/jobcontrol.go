package dialects

import (
	"context"
	"errors"
	"time"
)

// ErrRowInWork reports a row a delivery holds, by a lease not yet run out or a row lock.
// RetryNow and Cancel leave it to its holder's settlement.
var ErrRowInWork = errors.New("rowactor: the row is in work")

// ErrRowFinished reports a row already processed: its processed_at is set. RetryNow and
// Cancel change nothing; requeue it to run it again.
var ErrRowFinished = errors.New("rowactor: the row is finished")

// JobController is a dialect that changes one queued row at a service's or an
// operator's request: Broker.RetryNow, Broker.Cancel, rowactor retry and rowactor cancel.
//
// Each change is one statement fenced by "not processed and not in work"; in the
// advisory form it runs under the row's key, taken without waiting. So it never races
// the row's holder:
//
//   - a row in work is refused with ErrRowInWork;
//   - a finished row with ErrRowFinished;
//   - a missing row with ErrRowNotFound.
//
// The description is checked against the live table first, as Open does.
type JobController interface {
	// RetryNow makes a delayed row due now by clearing its retry_after; its attempt
	// stays.
	RetryNow(ctx context.Context, t Table, id int64, now time.Time) error
	// Cancel takes a queued row out of its queue as Drop would. It deletes the row, or,
	// where the table keeps finished rows, sets processed_at to now and writes reason in
	// the error column.
	Cancel(ctx context.Context, t Table, id int64, now time.Time, reason string) error
}

// CheckJobControl refuses a change no database can make of t: a retry without a
// retry_after column. Such a row has nothing to clear: it is due unless in work, or
// parked in its lease, which no longer tells it from a row in work.
func CheckJobControl(t Table, op string) error {
	if err := CheckDescription(t); err != nil {
		return err
	}
	if op == "RetryNow" && t.RetryAfter == "" {
		return &ConfigError{Table: t.Name, Option: "Table.RetryAfter",
			Reason: "RetryNow clears a row's retry_after, and the description names no such column",
			Fix:    "add a retry_after column (rowactor.Schema renders it) and name it in Table.RetryAfter"}
	}
	return nil
}

// FencedCanceller is a JobController that cancels a queued row only while it is still in
// group (NULL when nullGroup) and not dead: the cancel of a row that left work in another
// process, whose delivery may have moved it to its dead letter meanwhile. A row fenced
// off is reported as Cancel reports a row it cannot change.
type FencedCanceller interface {
	CancelInGroup(ctx context.Context, t Table, id int64, now time.Time, reason, group string, nullGroup bool) error
}
