package adminsql

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// JobChange is what a change writes: the SET of an UPDATE (column = value, or NULL where
// Value is nil), or a DELETE.
type JobChange struct {
	Delete bool
	Set    []JobSet
	// Fence, when set, limits the change to a row still in a group and not dead.
	Fence *JobFence
}

// JobFence limits a change to a row still in Group (NULL when NullGroup) and not dead:
// the cancel of a row that left work in another process, whose delivery may have moved
// it to its dead letter meanwhile.
type JobFence struct {
	Group     string
	NullGroup bool
}

// FenceClause renders c's fence as " AND ..." conditions, "" without one. bind binds a
// value and returns its placeholder.
func (c JobChange) FenceClause(t dialects.Table, quote func(string) string, bind func(v any) string) string {
	if c.Fence == nil {
		return ""
	}
	var s string
	switch {
	case t.Group == "":
	case c.Fence.NullGroup:
		s += " AND " + quote(t.Group) + " IS NULL"
	default:
		s += " AND " + quote(t.Group) + " = " + bind(c.Fence.Group)
	}
	if t.DeadAt != "" {
		s += " AND " + quote(t.DeadAt) + " IS NULL"
	}
	return s
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
func RetryNowChange(t dialects.Table) JobChange {
	return JobChange{Set: []JobSet{{Column: t.RetryAfter}}}
}

// CancelChange ends the row as Drop does: processed_at = now with the reason in the
// error column, as dialects.CancelledError writes it, (and the unique key cleared with ClearUniqueKeyAtAck), or a delete. In the
// lease form it clears the lease as Drop does: a row whose lease ran out may still have
// its delivery running, and that delivery's settlement (and renewal), fenced by its
// token, must then find the row lost rather than end it a second time.
func CancelChange(t dialects.Table, reason string) JobChange {
	if t.ProcessedAt == "" {
		return JobChange{Delete: true}
	}
	c := JobChange{Set: []JobSet{{Column: t.ProcessedAt, Now: true}}}
	if t.LockedUntil != "" {
		c.Set = append(c.Set, JobSet{Column: t.LockedUntil})
	}
	if t.Error != "" {
		c.Set = append(c.Set, JobSet{Column: t.Error, Value: dialects.ErrorText(dialects.CancelledError(reason))})
	}
	if t.UniqueKey != "" && t.ClearUniqueKeyAtAck {
		c.Set = append(c.Set, JobSet{Column: t.UniqueKey})
	}
	return c
}

// Unchanged tells why op's statement changed no row, reading the row at now: gone
// (ErrRowNotFound), finished (ErrRowFinished), or held by a delivery (ErrRowInWork: the
// change is fenced by everything else). A RetryNow of a row due already, or of a dead row
// without a delay, which a database counting changed rows only (MySQL) reports as no row,
// is no error.
func Unchanged(ctx context.Context, in dialects.Inspector, t dialects.Table, id int64, now time.Time, op string) error {
	j, err := in.Inspect(ctx, t, id, now)
	switch {
	case errors.Is(err, dialects.ErrRowNotFound):
		return fmt.Errorf("row %d: %w", id, dialects.ErrRowNotFound) // the caller names its op
	case err != nil:
		return err
	case j.State == dialects.JobProcessed, j.State == dialects.JobCancelled:
		return fmt.Errorf("row %d: %w", id, dialects.ErrRowFinished)
	case op == "RetryNow" && (j.State == dialects.JobDue || j.State == dialects.JobDead) && j.InWorkCounted:
		return nil // nothing delays it: a dead row stays dead, and waits for a requeue
	}
	return fmt.Errorf("row %d: %w", id, dialects.ErrRowInWork)
}

// Refused reports the errors of Unchanged that name the row but not the operation: the
// dialect wraps them with its op and table.
func Refused(err error) bool {
	return errors.Is(err, dialects.ErrRowInWork) || errors.Is(err, dialects.ErrRowFinished) || errors.Is(err, dialects.ErrRowNotFound)
}
