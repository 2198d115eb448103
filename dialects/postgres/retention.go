package postgres

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var _ dialects.Retainer = (*Dialect)(nil)

// RetainRound holds lock's advisory key (session level) on one pool connection for the
// round, and deletes on that connection, skipping rows another session holds.
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
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return 0, false, adminErr("retention", t.Name, err)
	}
	key := dialects.LockKey(lock)
	var ok bool
	if err := conn.QueryRow(ctx, lockText, key).Scan(&ok); err != nil {
		endConn(conn, err)
		return 0, false, adminErr("retention", t.Name, err)
	}
	if !ok {
		conn.Release()
		return 0, false, nil
	}
	tq, id := quote(t.Name), quote(t.ID)
	text := "DELETE FROM " + tq + " WHERE " + id + " IN (SELECT " + id + " FROM " + tq + " WHERE " + quote(t.ProcessedAt) +
		" < $1 ORDER BY " + id + " LIMIT " + strconv.Itoa(limit) + " FOR UPDATE SKIP LOCKED)"
	var deleted int64
	for ctx.Err() == nil {
		tag, derr := conn.Exec(ctx, text, before)
		if derr != nil {
			err = derr
			break
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(limit) {
			break
		}
	}
	// The key goes with the round; a connection whose unlock failed is closed, which ends
	// its session and the key with it.
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	var unlocked bool
	uerr := conn.QueryRow(uctx, unlockText, key).Scan(&unlocked)
	cancel()
	if uerr == nil && !unlocked {
		uerr = errors.New("the round's key was not held")
	}
	endConn(conn, errors.Join(err, uerr))
	if err != nil {
		return deleted, true, adminErr("retention", t.Name, err)
	}
	return deleted, true, nil
}
