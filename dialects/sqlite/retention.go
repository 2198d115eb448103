package sqlite

import (
	"context"
	"strconv"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var _ dialects.Retainer = (*Dialect)(nil)

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
	f, err := d.fileEntry(ctx)
	if err != nil {
		return 0, false, err
	}
	key := dialects.LockKey(lock)
	if !f.tryKey(key) {
		return 0, false, nil
	}
	defer f.releaseKey(key)
	tq, id := quote(t.Name), quote(t.ID)
	text := "DELETE FROM " + tq + " WHERE " + id + " IN (SELECT " + id + " FROM " + tq + " WHERE " +
		quote(t.ProcessedAt) + " < ? ORDER BY " + id + " LIMIT " + strconv.Itoa(limit) + ")"
	var deleted int64
	for ctx.Err() == nil {
		if err := f.lockWriter(ctx); err != nil {
			return deleted, true, adminErr("retention", t.Name, err)
		}
		n, err := changed(d.db.ExecContext(ctx, text, formatTime(before)))
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
