package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
)

var _ dialects.JobController = (*Dialect)(nil)

// RetryNow clears a queued row's retry_after (dialects.JobController).
func (d *Dialect) RetryNow(ctx context.Context, t dialects.Table, id int64, now time.Time) error {
	return d.changeJob(ctx, t, id, now, "RetryNow", adminsql.RetryNowChange(t))
}

// Cancel ends a queued row as Drop would (dialects.JobController).
func (d *Dialect) Cancel(ctx context.Context, t dialects.Table, id int64, now time.Time, reason string) error {
	return d.changeJob(ctx, t, id, now, "Cancel", adminsql.CancelChange(t, reason))
}

// CancelInGroup cancels a queued row as Cancel does while it is still in group and not
// dead (dialects.FencedCanceller).
func (d *Dialect) CancelInGroup(ctx context.Context, t dialects.Table, id int64, now time.Time, reason, group string, nullGroup bool) error {
	c := adminsql.CancelChange(t, reason)
	c.Fence = &adminsql.JobFence{Group: group, NullGroup: nullGroup}
	return d.changeJob(ctx, t, id, now, "Cancel", c)
}

var _ dialects.FencedCanceller = (*Dialect)(nil)

// changeJob runs c on row id, fenced by "not processed and no lease running" (in the
// advisory form, under the row's key), in one statement in this process's writer turn.
func (d *Dialect) changeJob(ctx context.Context, t dialects.Table, id int64, now time.Time, op string, c adminsql.JobChange) error {
	if err := dialects.CheckJobControl(t, op); err != nil {
		return err
	}
	if err := refuseRowLock(t); err != nil {
		return err
	}
	if err := d.checkTable(ctx, t); err != nil {
		return err
	}
	tq := quote(t.Name)
	var args []any
	text := "DELETE FROM " + tq
	if !c.Delete {
		text = "UPDATE " + tq + " SET " + c.SetClause(quote, func(v any) string { args = append(args, v); return "?" }, formatTime(now))
	}
	text += " WHERE " + quote(t.ID) + " = ?"
	args = append(args, id)
	if t.ProcessedAt != "" {
		text += " AND " + quote(t.ProcessedAt) + " IS NULL"
	}
	if t.Form() == dialects.FormLease {
		lu := quote(t.LockedUntil)
		text += " AND (" + lu + " IS NULL OR " + lu + " <= ?)"
		args = append(args, formatTime(now))
	}
	text += c.FenceClause(t, quote, func(v any) string { args = append(args, v); return "?" })
	f, err := d.fileEntry(ctx)
	if err != nil {
		return err
	}
	if t.Form() == dialects.FormAdvisory {
		// The row's key in this process's registry, taken as a consumer takes it: a key
		// a delivery here holds leaves the row unchanged. Keys held in other processes
		// are not seen (as Inspect and stats cannot see them).
		key, err := keyExpr(t.AdvisoryKey)
		if err != nil {
			return err
		}
		var k string
		err = d.db.QueryRowContext(ctx, "SELECT "+key+" FROM "+tq+" WHERE "+quote(t.ID)+" = ?", id).Scan(&k)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return adminErr(op, t.Name, fmt.Errorf("row %d: %w", id, dialects.ErrRowNotFound))
		case err != nil:
			return adminErr(op, t.Name, err)
		case !f.tryKey(k):
			return adminErr(op, t.Name, fmt.Errorf("row %d: %w", id, dialects.ErrRowInWork))
		}
		defer f.releaseKey(k)
	}
	if err := f.lockWriter(ctx); err != nil {
		return adminErr(op, t.Name, err)
	}
	n, err := changed(d.db.ExecContext(ctx, text, args...))
	f.unlockWriter()
	if err != nil {
		return adminErr(op, t.Name, err)
	}
	if n == 0 {
		err := adminsql.Unchanged(ctx, d, t, id, now, op)
		if adminsql.Refused(err) {
			err = adminErr(op, t.Name, err)
		}
		return err
	}
	return nil
}
