package postgres

import (
	"context"
	"strconv"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
)

var _ dialects.JobController = (*Dialect)(nil)

// RetryNow clears a queued row's retry_after, in one statement (dialects.JobController).
func (d *Dialect) RetryNow(ctx context.Context, t dialects.Table, id int64, now time.Time) error {
	return d.changeJob(ctx, t, id, now, "RetryNow", adminsql.RetryNowChange(t))
}

// Cancel ends a queued row as Drop would, in one statement (dialects.JobController).
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

// changeJob runs c on row id if it is queued: not processed, and not in work (a lease not
// run out; in the row lock form, a row a claim holds, which the change skips as claims do;
// in the advisory form, a row whose key a session holds).
func (d *Dialect) changeJob(ctx context.Context, t dialects.Table, id int64, now time.Time, op string, c adminsql.JobChange) error {
	if err := dialects.CheckJobControl(t, op); err != nil {
		return err
	}
	if err := d.checkTable(ctx, t); err != nil {
		return err
	}
	tq, idq := quote(t.Name), quote(t.ID)
	args := []any{id}
	bind := func(v any) string { args = append(args, v); return "$" + strconv.Itoa(len(args)) }
	where := idq + " = $1"
	switch t.Form() {
	case dialects.FormRowLock:
		where = idq + " = (SELECT " + idq + " FROM " + tq + " WHERE " + idq + " = $1 FOR UPDATE SKIP LOCKED)"
	case dialects.FormAdvisory:
		// The row's key, taken without waiting for the statement's transaction: a
		// consumer's session holding it makes the change skip the row, and a consumer
		// trying it meanwhile passes the row over. MATERIALIZED reads the one row first,
		// so no other row's key is tried.
		key, err := keyExpr(t.AdvisoryKey)
		if err != nil {
			return err
		}
		where = idq + " IN (SELECT r." + idq + " FROM (SELECT " + idq + ", " + key + " AS k FROM " + tq + " WHERE " + idq +
			" = $1 OFFSET 0) AS r WHERE pg_try_advisory_xact_lock(hashtextextended(r.k, 0)))"
	}
	if t.ProcessedAt != "" {
		where += " AND " + quote(t.ProcessedAt) + " IS NULL"
	}
	if t.Form() == dialects.FormLease {
		lu := quote(t.LockedUntil)
		where += " AND (" + lu + " IS NULL OR " + lu + " <= " + bind(now) + ")"
	}
	where += c.FenceClause(t, quote, bind)
	text := "DELETE FROM " + tq + " WHERE " + where
	if !c.Delete {
		text = "UPDATE " + tq + " SET " + c.SetClause(quote, bind, now) + " WHERE " + where
	}
	tag, err := d.pool.Exec(ctx, text, args...)
	if err != nil {
		return adminErr(op, t.Name, err)
	}
	if tag.RowsAffected() == 0 {
		err := adminsql.Unchanged(ctx, d, t, id, now, op)
		if adminsql.Refused(err) {
			err = adminErr(op, t.Name, err)
		}
		return err
	}
	return nil
}
