package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var (
	_ dialects.Elector  = (*Dialect)(nil)
	_ dialects.Retainer = (*Dialect)(nil)
)

// leaderLock and leaderUnlock take and free a leadership's GET_LOCK name, computed as the
// advisory form computes its keys' names; the key is bound leaderArgs times.
var (
	leaderLock   = "SELECT GET_LOCK(" + lockNameExpr(utf8mb4("?")) + ", 0)"
	leaderUnlock = "SELECT RELEASE_LOCK(" + lockNameExpr(utf8mb4("?")) + ")"
	leaderArgs   = strings.Count(lockNameExpr(utf8mb4("?")), "?")
)

// leaderKey binds name's key as leaderLock and leaderUnlock take it.
func leaderKey(name string) []any {
	args := make([]any, leaderArgs)
	for i := range args {
		args[i] = dialects.LeaderKey(name)
	}
	return args
}

// Lead takes the name's GET_LOCK without waiting on a connection the leadership keeps
// until it resigns.
func (d *Dialect) Lead(ctx context.Context, name string) (dialects.Leadership, bool, error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("mysql: lead %s: %w", name, err)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, leaderLock, leaderKey(name)...).Scan(&got); err != nil {
		discard(conn)
		return nil, false, fmt.Errorf("mysql: lead %s: %w", name, err)
	}
	if got.Int64 != 1 {
		_ = conn.Close()
		return nil, false, nil
	}
	return &leadership{conn: conn, name: name}, true, nil
}

type leadership struct {
	conn *sql.Conn
	name string
}

func (l *leadership) Alive(ctx context.Context) error {
	if err := l.conn.PingContext(ctx); err != nil {
		return fmt.Errorf("mysql: leadership of %s: %w", l.name, err)
	}
	return nil
}

// Resign releases the lock and gives the connection back; one whose release failed is
// discarded, which ends its session and the lock with it.
func (l *leadership) Resign(ctx context.Context) error {
	var got sql.NullInt64
	err := l.conn.QueryRowContext(ctx, leaderUnlock, leaderKey(l.name)...).Scan(&got)
	if err == nil && got.Int64 != 1 {
		err = fmt.Errorf("the lock was not held")
	}
	if err != nil {
		discard(l.conn)
		return fmt.Errorf("mysql: resign %s: %w", l.name, err)
	}
	return l.conn.Close()
}

// DeleteProcessed deletes the oldest finished rows in a read committed transaction of its
// own: it locks them with SKIP LOCKED first, so a row a claim or a delivery's transaction
// holds is passed by without waiting (InnoDB's semi-consistent read serves UPDATE, not
// DELETE: a DELETE alone waits for every locked row it scans), then deletes what it locked.
func (d *Dialect) DeleteProcessed(ctx context.Context, t dialects.Table, before time.Time, limit int) (int64, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return 0, err
	}
	if t.ProcessedAt == "" {
		return 0, fmt.Errorf("mysql: retention on table %s: the description names no processed_at column", t.Name)
	}
	if limit <= 0 {
		return 0, nil
	}
	x, err := d.begin(ctx, sql.LevelReadCommitted)
	if err != nil {
		return 0, adminErr("retention", t.Name, err)
	}
	n, err := deleteLocked(ctx, x.tx, t, before, limit)
	if err != nil {
		_ = x.rollback()
		return 0, adminErr("retention", t.Name, err)
	}
	if err := x.commit(); err != nil {
		return 0, adminErr("retention", t.Name, err)
	}
	return n, nil
}

// deleteLocked locks up to limit finished rows older than before, skipping rows others
// hold, and deletes them.
func deleteLocked(ctx context.Context, tx *sql.Tx, t dialects.Table, before time.Time, limit int) (int64, error) {
	rows, err := tx.QueryContext(ctx, "SELECT "+quote(t.ID)+" FROM "+quote(t.Name)+" WHERE "+quote(t.ProcessedAt)+" < ? ORDER BY "+
		quote(t.ID)+" LIMIT "+strconv.Itoa(limit)+" FOR UPDATE SKIP LOCKED", dbTime(before))
	if err != nil {
		return 0, err
	}
	var ids []any
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
	return affected(tx.ExecContext(ctx, "DELETE FROM "+quote(t.Name)+" WHERE "+quote(t.ID)+" IN (?"+
		strings.Repeat(", ?", len(ids)-1)+")", ids...))
}
