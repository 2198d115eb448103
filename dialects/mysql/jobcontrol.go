package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
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

// changeJob runs c on row id if it is queued: not processed, and not in work. The lease
// form fences the statement by the lease; the row lock form first locks the row skipping
// it when a claim holds it (MySQL cannot update a table selecting from it), in one read
// committed transaction; the advisory form runs it under the row's key (underKey).
func (d *Dialect) changeJob(ctx context.Context, t dialects.Table, id int64, now time.Time, op string, c adminsql.JobChange) error {
	if err := dialects.CheckJobControl(t, op); err != nil {
		return err
	}
	if err := d.checkTable(ctx, t); err != nil {
		return err
	}
	tq, idq := quote(t.Name), quote(t.ID)
	var args []any
	text := "DELETE FROM " + tq
	if !c.Delete {
		text = "UPDATE " + tq + " SET " + c.SetClause(quote, func(v any) string { args = append(args, v); return "?" }, dbTime(now))
	}
	queued := idq + " = ?"
	args = append(args, id)
	if t.ProcessedAt != "" {
		queued += " AND " + quote(t.ProcessedAt) + " IS NULL"
	}
	if t.Form() == dialects.FormLease {
		lu := quote(t.LockedUntil)
		queued += " AND (" + lu + " IS NULL OR " + lu + " <= ?)"
		args = append(args, dbTime(now))
	}
	text += " WHERE " + queued
	// The fence goes on the change alone: the row lock form's locking read takes the
	// row as it is, and the change then finds it fenced off.
	text += c.FenceClause(t, quote, func(v any) string { args = append(args, v); return "?" })
	var n int64
	err := func() error {
		if t.Form() == dialects.FormAdvisory {
			var err error
			n, err = d.underKey(ctx, t, id, text, args)
			return err
		}
		if t.Form() != dialects.FormRowLock {
			var err error
			n, err = affected(d.db.ExecContext(ctx, text, args...))
			return err
		}
		x, err := d.begin(ctx, sql.LevelReadCommitted)
		if err != nil {
			return err
		}
		// InnoDB also locks, for a moment, the rows a claim's scan passes over and then
		// releases (read committed): a row found locked is looked at again a few times
		// before it counts as held by a claim, which holds it for its handler's run.
		var got int64
		for try := 0; ; try++ {
			err = x.tx.QueryRowContext(ctx, "SELECT "+idq+" FROM "+tq+" WHERE "+queued+" FOR UPDATE SKIP LOCKED", id).Scan(&got)
			if !errors.Is(err, sql.ErrNoRows) || try == skipRetries {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(skipRetryDelay):
			}
		}
		if err == nil {
			n, err = affected(x.tx.ExecContext(ctx, text, args...))
		}
		switch {
		case errors.Is(err, sql.ErrNoRows):
			n = 0 // processed, gone, or held by a claim: Unchanged tells
			return x.rollback()
		case err == nil && n == 0 && c.Fence == nil:
			n = 1 // locked and queued: a RetryNow of a row due already changes nothing
		}
		if err != nil {
			_ = x.rollback()
			return err
		}
		return x.commit()
	}()
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

// underKey runs text on a connection of its own while it holds row id's key, taken
// without waiting (GET_LOCK, as consumers take it): a key a consumer's session holds
// leaves the row unchanged (0 rows). The key's name is read first, since the change may
// delete the row that names it.
func (d *Dialect) underKey(ctx context.Context, t dialects.Table, id int64, text string, args []any) (int64, error) {
	key, err := keyText(t.AdvisoryKey)
	if err != nil {
		return 0, err
	}
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	var name string
	err = conn.QueryRowContext(ctx, "SELECT "+lockNameExpr(key)+" FROM "+quote(t.Name)+" WHERE "+quote(t.ID)+" = ?", id).Scan(&name)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil // gone: Unchanged tells
	}
	if err != nil {
		return 0, err
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", name).Scan(&got); err != nil {
		return 0, err
	}
	if got.Int64 != 1 {
		return 0, nil // a consumer's session holds it
	}
	n, err := affected(conn.ExecContext(ctx, text, args...))
	var released sql.NullInt64
	if rerr := conn.QueryRowContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(?)", name).Scan(&released); rerr != nil || released.Int64 != 1 {
		// The session must not keep the key: end it, and the server releases it.
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	return n, err
}

// skipRetries and skipRetryDelay bound how long a row lock change looks again at a row it
// found locked (a claim's passing scan), before it counts the row as in work.
const (
	skipRetries    = 5
	skipRetryDelay = 20 * time.Millisecond
)
