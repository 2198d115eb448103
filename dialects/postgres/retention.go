package postgres

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/deadline"
)

var (
	_ dialects.Retainer           = (*Dialect)(nil)
	_ dialects.DeadLetterRetainer = (*Dialect)(nil)
)

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
	tq, id := quote(t.Name), quote(t.ID)
	text := "DELETE FROM " + tq + " WHERE " + id + " IN (SELECT " + id + " FROM " + tq + " WHERE " + quote(t.ProcessedAt) +
		" < $1 ORDER BY " + id + " LIMIT " + strconv.Itoa(limit) + " FOR UPDATE SKIP LOCKED)"
	return d.round(ctx, t, lock, limit, text, before)
}

// RetainDeadLetters holds lock's advisory key for the round as RetainRound does, and
// deletes group's rows that died before before, in dead_at order: the order of the index
// Schema renders on (group, dead_at) for the dead rows.
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
	text, err := deadLettersText(t, limit)
	if err != nil {
		return 0, false, err
	}
	return d.round(ctx, t, lock, limit, text, before, group)
}

// deadLettersText deletes up to limit rows of group $2 that died before $1, skipping rows
// another session locks, in the lease form rows leased past $1, and in the advisory form
// rows whose key a session holds (a delivery of the group's): each candidate's key is
// tried for the statement's transaction, as a consumer tries it, once the candidates are
// read (so no other row's key is tried).
func deadLettersText(t dialects.Table, limit int) (string, error) {
	tq, id, dead := quote(t.Name), quote(t.ID), quote(t.DeadAt)
	leased := ""
	if t.LockedUntil != "" {
		lu := quote(t.LockedUntil)
		leased = " AND (" + lu + " IS NULL OR " + lu + " < $1)"
	}
	cols := id
	if t.AdvisoryKey != "" {
		key, err := keyExpr(t.AdvisoryKey)
		if err != nil {
			return "", err
		}
		cols += ", " + key + " AS k"
	}
	pick := "SELECT " + cols + " FROM " + tq + " WHERE " + quote(t.Group) + " = $2 AND " +
		dead + " < $1" + leased + " ORDER BY " + dead + " LIMIT " + strconv.Itoa(limit) + " FOR UPDATE SKIP LOCKED"
	if t.AdvisoryKey != "" {
		pick = "SELECT r." + id + " FROM (" + pick + ") AS r WHERE pg_try_advisory_xact_lock(hashtextextended(r.k, 0))"
	}
	return "DELETE FROM " + tq + " WHERE " + id + " IN (" + pick + ")", nil
}

// round takes lock's key without waiting on a pool connection of its own and runs text
// (with args) on it until a statement deletes fewer than limit rows, then lets the key
// and the connection go.
func (d *Dialect) round(ctx context.Context, t dialects.Table, lock string, limit int, text string, args ...any) (int64, bool, error) {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return 0, false, adminErr("retention", t.Name, err)
	}
	// The statements run on a context the caller's end does not cut: pgx ends a cancelled
	// statement by closing its connection, and the server frees the key only when it
	// notices, so a process asking for the key right after Stop could find it held. The
	// loop checks ctx between statements instead; a statement hanging past
	// dialects.RoundGrace after ctx ends is cut all the same.
	sctx, stop := deadline.Outlive(ctx, dialects.RoundGrace)
	defer stop()
	key := dialects.LockKey(lock)
	var ok bool
	if err := conn.QueryRow(sctx, lockText, key).Scan(&ok); err != nil {
		endConn(conn, err)
		return 0, false, adminErr("retention", t.Name, err)
	}
	if !ok {
		conn.Release()
		return 0, false, nil
	}
	var deleted int64
	for ctx.Err() == nil {
		tag, derr := conn.Exec(sctx, text, args...)
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
