package dialects

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrRowInWork reports a row a delivery holds (a lease not yet run out, a row lock):
// RetryNow and Cancel leave it to its holder's settlement.
var ErrRowInWork = errors.New("rowactor: the row is in work")

// ErrRowFinished reports a row already processed (processed_at set): RetryNow and Cancel
// change nothing; requeue it to run it again.
var ErrRowFinished = errors.New("rowactor: the row is finished")

// JobController is a dialect that changes one queued row at a service's or an operator's
// request (Broker.RetryNow, Broker.Cancel, rowactor retry / cancel). Each change is one
// statement fenced by "not processed and not in work" (in the advisory form, under the
// row's key, taken without waiting), so it never races the row's holder: a row in work, or finished, is refused (ErrRowInWork, ErrRowFinished), a missing
// one too (ErrRowNotFound). The description is checked against the live table first, as
// Open does.
type JobController interface {
	// RetryNow makes a delayed row due now (retry_after cleared); its attempt stays.
	RetryNow(ctx context.Context, t Table, id int64, now time.Time) error
	// Cancel takes a queued row out of its queue as Drop would: deleted, or, where the
	// table keeps finished rows, processed_at set to now with reason in the error column.
	Cancel(ctx context.Context, t Table, id int64, now time.Time, reason string) error
}

// CheckJobControl refuses a change no database can make of t: retry without a
// retry_after column (nothing to clear: such a row is due unless in work, or parked in its
// lease, which tells it from one in work no more).
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

// JobChange is what a change writes: the SET of an UPDATE (column = value, or NULL where
// Value is nil), or a DELETE.
type JobChange struct {
	Delete bool
	Set    []JobSet
}

// JobSet is one column a change writes.
type JobSet struct {
	Column string
	// Value is bound; nil writes NULL. Now marks the change's time, bound as the
	// dialect binds times.
	Value any
	Now   bool
}

// SetClause renders the SET list of a change that is no delete: "column = value, ...".
// quote quotes an identifier; bind binds a value and returns its placeholder, called in
// the list's order; now is the change's time as the dialect binds it.
func (c JobChange) SetClause(quote func(string) string, bind func(v any) string, now any) string {
	sets := make([]string, len(c.Set))
	for i, s := range c.Set {
		v := "NULL"
		switch {
		case s.Now:
			v = bind(now)
		case s.Value != nil:
			v = bind(s.Value)
		}
		sets[i] = quote(s.Column) + " = " + v
	}
	return strings.Join(sets, ", ")
}

// RetryNowChange clears retry_after.
func RetryNowChange(t Table) JobChange {
	return JobChange{Set: []JobSet{{Column: t.RetryAfter}}}
}

// CancelChange ends the row as Drop does: processed_at = now with the reason in the
// error column (and the unique key cleared with ClearUniqueKeyAtAck), or a delete. In the
// lease form it clears the lease as Drop does: a row whose lease ran out may still have
// its delivery running, and that delivery's settlement (and renewal), fenced by its
// token, must then find the row lost rather than end it a second time.
func CancelChange(t Table, reason string) JobChange {
	if t.ProcessedAt == "" {
		return JobChange{Delete: true}
	}
	c := JobChange{Set: []JobSet{{Column: t.ProcessedAt, Now: true}}}
	if t.LockedUntil != "" {
		c.Set = append(c.Set, JobSet{Column: t.LockedUntil})
	}
	if t.Error != "" {
		c.Set = append(c.Set, JobSet{Column: t.Error, Value: reason})
	}
	if t.UniqueKey != "" && t.ClearUniqueKeyAtAck {
		c.Set = append(c.Set, JobSet{Column: t.UniqueKey})
	}
	return c
}

// Unchanged tells why op's statement changed no row, reading the row at now: gone
// (ErrRowNotFound), finished (ErrRowFinished), or held by a delivery (ErrRowInWork: the
// change is fenced by everything else). A RetryNow of a row due already, which a database
// counting changed rows only (MySQL) reports as no row, is no error.
func Unchanged(ctx context.Context, in Inspector, t Table, id int64, now time.Time, op string) error {
	j, err := in.Inspect(ctx, t, id, now)
	switch {
	case errors.Is(err, ErrRowNotFound):
		return fmt.Errorf("row %d: %w", id, ErrRowNotFound) // the caller names its op
	case err != nil:
		return err
	case j.State == JobProcessed:
		return fmt.Errorf("row %d: %w", id, ErrRowFinished)
	case op == "RetryNow" && j.State == JobDue && j.InWorkCounted:
		return nil
	}
	return fmt.Errorf("row %d: %w", id, ErrRowInWork)
}

// Refused reports the errors of Unchanged that name the row but not the operation: the
// dialect wraps them with its op and table.
func Refused(err error) bool {
	return errors.Is(err, ErrRowInWork) || errors.Is(err, ErrRowFinished) || errors.Is(err, ErrRowNotFound)
}
