package sqlite

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
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
	args := []any{sql.Named("before", formatTime(before)), sql.Named("group", group)}
	pick := "SELECT " + id + " FROM " + tq + " WHERE " + quote(t.Group) + " = :group AND " +
		dead + " < :before" + leased + " ORDER BY " + dead + " LIMIT " + strconv.Itoa(limit)
	if t.AdvisoryKey != "" {
		// A delivery of the group in this process holds its row's key: the batch passes
		// over those rows. A consumer that takes a key after the batch read it takes its
		// row only in a later writer turn, and finds it gone.
		key, err := keyExpr(t.AdvisoryKey)
		if err != nil {
			return 0, false, err
		}
		pick = "SELECT " + id + ", " + key + " FROM " + tq + " WHERE " + quote(t.Group) + " = :group AND " +
			dead + " < :before ORDER BY " + dead + " LIMIT " + strconv.Itoa(limit)
		return d.roundBy(ctx, t, lock, limit, func(ctx context.Context, f *file) (int64, error) {
			return d.deleteUnkeyed(ctx, f, t, pick, args)
		})
	}
	text := "DELETE FROM " + tq + " WHERE " + id + " IN (" + pick + ")"
	return d.round(ctx, t, lock, limit, text, args...)
}

// deleteUnkeyed deletes the rows pick (with args) reads, id and key, whose key no delivery
// of this process holds; the caller holds the writer turn.
func (d *Dialect) deleteUnkeyed(ctx context.Context, f *file, t dialects.Table, pick string, args []any) (int64, error) {
	rows, err := d.db.QueryContext(ctx, pick, args...)
	if err != nil {
		return 0, err
	}
	var ids []any
	for rows.Next() {
		var (
			id  int64
			key string
		)
		if err := rows.Scan(&id, &key); err != nil {
			rows.Close()
			return 0, err
		}
		if !f.keyHeld(key) {
			ids = append(ids, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(ids) == 0 {
		return 0, err
	}
	return changed(d.db.ExecContext(ctx, "DELETE FROM "+quote(t.Name)+" WHERE "+quote(t.ID)+" IN (?"+
		strings.Repeat(", ?", len(ids)-1)+")", ids...))
}

// round holds lock's key in the file's registry for the round and runs text (with args),
// one statement in each of this process's writer turns, until one deletes fewer than
// limit rows.
func (d *Dialect) round(ctx context.Context, t dialects.Table, lock string, limit int, text string, args ...any) (int64, bool, error) {
	return d.roundBy(ctx, t, lock, limit, func(ctx context.Context, _ *file) (int64, error) {
		return changed(d.db.ExecContext(ctx, text, args...))
	})
}

// roundBy is round with each batch run by batch, in the process's writer turn.
func (d *Dialect) roundBy(ctx context.Context, t dialects.Table, lock string, limit int, batch func(context.Context, *file) (int64, error)) (int64, bool, error) {
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
		n, err := batch(ctx, f)
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
