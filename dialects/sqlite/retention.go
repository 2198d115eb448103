package sqlite

import (
	"context"
	"database/sql"
	"strconv"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var (
	_ dialects.Retainer           = (*Dialect)(nil)
	_ dialects.DeadLetterRetainer = (*Dialect)(nil)
)

// RetainRound holds lock's key in the file's registry of this process for the round:
// brokers of one process on one file take turns; processes sharing the file each delete
// (SQLite has no session locks another process could see), which the batches tolerate.
// Each batch is one statement in this process's writer turn.
func (d *Dialect) RetainRound(ctx context.Context, t dialects.Table, lock string, before time.Time, limit int) (int64, bool, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return 0, false, err
	}
	if err := dialects.CheckRetain(t); err != nil {
		return 0, false, err
	}
	if limit <= 0 {
		return 0, false, nil
	}
	tq, id := quote(t.Name), quote(t.ID)
	text := "DELETE FROM " + tq + " WHERE " + id + " IN (SELECT " + id + " FROM " + tq + " WHERE " +
		quote(t.ProcessedAt) + " < :before ORDER BY " + id + " LIMIT " + strconv.Itoa(limit) + ")"
	return d.round(ctx, t, lock, limit, text, sql.Named("before", formatTime(before)))
}

// RetainDeadLetters takes turns with the process's other rounds of lock as RetainRound
// does, and deletes group's rows that died before before, in dead_at order: the order of
// the index Schema renders on (group, dead_at) for the dead rows.
func (d *Dialect) RetainDeadLetters(ctx context.Context, t dialects.Table, group, lock string, before time.Time, limit int) (int64, bool, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return 0, false, err
	}
	if err := dialects.CheckRetainDeadLetters(t, group); err != nil {
		return 0, false, err
	}
	if limit <= 0 {
		return 0, false, nil
	}
	tq, id, dead := quote(t.Name), quote(t.ID), quote(t.DeadAt)
	leased := ""
	if t.LockedUntil != "" {
		// A subscription of the group holds the rows leased past before.
		lu := quote(t.LockedUntil)
		leased = " AND (" + lu + " IS NULL OR " + lu + " < :before)"
	}
	text := "DELETE FROM " + tq + " WHERE " + id + " IN (SELECT " + id + " FROM " + tq + " WHERE " + quote(t.Group) + " = :group AND " +
		dead + " < :before" + leased + " ORDER BY " + dead + " LIMIT " + strconv.Itoa(limit) + ")"
	return d.round(ctx, t, lock, limit, text, sql.Named("before", formatTime(before)), sql.Named("group", group))
}

// round holds lock's key in the file's registry for the round and runs text (with args),
// one statement in each of this process's writer turns, until one deletes fewer than
// limit rows.
func (d *Dialect) round(ctx context.Context, t dialects.Table, lock string, limit int, text string, args ...any) (int64, bool, error) {
	f, err := d.fileEntry(ctx)
	if err != nil {
		return 0, false, err
	}
	key := dialects.LockKey(lock)
	if !f.tryKey(key) {
		return 0, false, nil
	}
	defer f.releaseKey(key)
	var deleted int64
	for ctx.Err() == nil {
		if err := f.lockWriter(ctx); err != nil {
			return deleted, true, adminErr("retention", t.Name, err)
		}
		n, err := changed(d.db.ExecContext(ctx, text, args...))
		f.unlockWriter()
		if err != nil {
			return deleted, true, adminErr("retention", t.Name, err)
		}
		deleted += n
		if n < int64(limit) {
			break
		}
	}
	return deleted, true, nil
}
