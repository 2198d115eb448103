package mysql

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/deadline"
)

var (
	_ dialects.Retainer           = (*Dialect)(nil)
	_ dialects.DeadLetterRetainer = (*Dialect)(nil)
)

// lockOf and unlockOf take and free a round's GET_LOCK name, computed as the advisory form
// computes its keys' names; the key is bound lockArgs times.
var (
	lockOf   = "SELECT GET_LOCK(" + lockNameExpr(utf8mb4("?")) + ", 0)"
	unlockOf = "SELECT RELEASE_LOCK(" + lockNameExpr(utf8mb4("?")) + ")"
	lockArgs = strings.Count(lockNameExpr(utf8mb4("?")), "?")
)

// lockKey binds lock's key as lockOf and unlockOf take it.
func lockKey(lock string) []any {
	args := make([]any, lockArgs)
	for i := range args {
		args[i] = dialects.LockKey(lock)
	}
	return args
}

// RetainRound holds lock's GET_LOCK on one pool connection for the round, and deletes on
// that connection, a read committed transaction a batch (deleteLocked).
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
	pick := "SELECT " + quote(t.ID) + " FROM " + quote(t.Name) + " WHERE " + quote(t.ProcessedAt) + " < ? ORDER BY " +
		quote(t.ID) + " LIMIT " + strconv.Itoa(limit) + " FOR UPDATE SKIP LOCKED"
	return d.round(ctx, t, lock, limit, pick, dbTime(before))
}

// RetainDeadLetters holds lock's GET_LOCK for the round as RetainRound does, and deletes
// group's rows that died before before, in dead_at order: the order of the index Schema
// renders on (group, dead_at).
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
	pick, args, err := deadLettersPick(t, group, before, limit)
	if err != nil {
		return 0, false, err
	}
	return d.round(ctx, t, lock, limit, pick, args...)
}

// deadLettersPick locks up to limit rows of group that died before before, skipping rows
// others hold, in the lease form rows leased past before, and in the advisory form rows
// whose key a session holds (a delivery of the group's). A consumer that takes the key
// after the pick reads the row only after the delete commits (its take waits for the
// row's lock), and finds it gone.
func deadLettersPick(t dialects.Table, group string, before time.Time, limit int) (string, []any, error) {
	dead := quote(t.DeadAt)
	args := []any{group, dbTime(before)}
	leased := ""
	if t.LockedUntil != "" {
		lu := quote(t.LockedUntil)
		leased = " AND (" + lu + " IS NULL OR " + lu + " < ?)"
		args = append(args, dbTime(before))
	}
	if t.AdvisoryKey != "" {
		key, err := keyText(t.AdvisoryKey)
		if err != nil {
			return "", nil, err
		}
		leased += " AND IS_USED_LOCK(" + lockNameExpr(key) + ") IS NULL"
	}
	return "SELECT " + quote(t.ID) + " FROM " + quote(t.Name) + " WHERE " + quote(t.Group) + " = ? AND " + dead + " < ?" + leased +
		" ORDER BY " + dead + " LIMIT " + strconv.Itoa(limit) + " FOR UPDATE SKIP LOCKED", args, nil
}

// round takes lock's GET_LOCK without waiting on a pool connection of its own and, on
// it, deletes the rows pick (with args) locks, a read committed transaction a batch,
// until a batch deletes fewer than limit rows; then it lets the lock and the connection
// go.
func (d *Dialect) round(ctx context.Context, t dialects.Table, lock string, limit int, pick string, args ...any) (int64, bool, error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return 0, false, adminErr("retention", t.Name, err)
	}
	// The statements run on a context the caller's end does not cut: the driver ends a
	// cancelled statement by closing its socket, and the server frees the lock only when
	// it notices, so a process asking for the lock right after Stop would find it held.
	// The loop checks ctx between statements instead; a statement hanging past
	// dialects.RoundGrace after ctx ends is cut all the same.
	sctx, stop := deadline.Outlive(ctx, dialects.RoundGrace)
	defer stop()
	var got sql.NullInt64
	if err := conn.QueryRowContext(sctx, lockOf, lockKey(lock)...).Scan(&got); err != nil {
		discard(conn)
		return 0, false, adminErr("retention", t.Name, err)
	}
	if got.Int64 != 1 {
		_ = conn.Close()
		return 0, false, nil
	}
	var deleted int64
	for ctx.Err() == nil {
		n, derr := func() (int64, error) {
			tx, err := conn.BeginTx(sctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				return 0, err
			}
			n, err := deleteLocked(ctx, sctx, tx, t, pick, args)
			if err != nil {
				_ = tx.Rollback()
				return 0, err
			}
			return n, tx.Commit()
		}()
		if derr != nil {
			if cerr := ctx.Err(); cerr == nil || !errors.Is(derr, cerr) {
				err = derr // a round its caller stopped between statements ends quietly
			}
			break
		}
		deleted += n
		if n < int64(limit) {
			break
		}
	}
	// The lock goes with the round; a connection whose release failed is discarded, which
	// ends its session and the lock with it.
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	var released sql.NullInt64
	uerr := conn.QueryRowContext(uctx, unlockOf, lockKey(lock)...).Scan(&released)
	cancel()
	if err != nil || uerr != nil || released.Int64 != 1 {
		discard(conn)
	} else {
		_ = conn.Close()
	}
	if err != nil {
		return deleted, true, adminErr("retention", t.Name, err)
	}
	return deleted, true, nil
}

// deleteLocked locks the rows pick selects (their ids), skipping rows others hold, and
// deletes them, one statement a row by its id. A DELETE naming the ids in one IN list
// is planned by cost: over a small table, or most of a large one's rows, the optimizer
// scans the whole table, and a DELETE (unlike an UPDATE, which reads the latest committed
// version of a row it does not match) waits for the lock on every row it reads, a row
// lock form claim's among them, for as long as that row's handler runs. A lookup of one
// primary key reads that row alone.
//
// Statements run on sctx; ctx ending between two of them ends the batch, which the
// caller rolls back.
func deleteLocked(ctx, sctx context.Context, tx *sql.Tx, t dialects.Table, pick string, args []any) (int64, error) {
	rows, err := tx.QueryContext(sctx, pick, args...)
	if err != nil {
		return 0, err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	del, err := tx.PrepareContext(sctx, "DELETE FROM "+quote(t.Name)+" WHERE "+quote(t.ID)+" = ?")
	if err != nil {
		return 0, err
	}
	defer del.Close()
	var deleted int64
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		n, err := affected(del.ExecContext(sctx, id))
		if err != nil {
			return 0, err // the caller rolls the batch back
		}
		deleted += n
	}
	return deleted, nil
}
