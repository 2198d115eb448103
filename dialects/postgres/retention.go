package postgres

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor/dialects"
)

var (
	_ dialects.Elector  = (*Dialect)(nil)
	_ dialects.Retainer = (*Dialect)(nil)
)

// Lead takes the name's advisory key (session level, without waiting) on a pool
// connection the leadership keeps until it resigns.
func (d *Dialect) Lead(ctx context.Context, name string) (dialects.Leadership, bool, error) {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("postgres: lead %s: %w", name, err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, lockText, dialects.LeaderKey(name)).Scan(&ok); err != nil {
		endConn(conn, err)
		return nil, false, fmt.Errorf("postgres: lead %s: %w", name, err)
	}
	if !ok {
		conn.Release()
		return nil, false, nil
	}
	return &leadership{conn: conn, name: name}, true, nil
}

type leadership struct {
	conn *pgxpool.Conn
	name string
}

func (l *leadership) Alive(ctx context.Context) error {
	if _, err := l.conn.Exec(ctx, "SELECT 1"); err != nil {
		return fmt.Errorf("postgres: leadership of %s: %w", l.name, err)
	}
	return nil
}

// Resign unlocks the key and gives the connection back; a connection whose unlock failed
// is closed, which ends its session and the key with it.
func (l *leadership) Resign(ctx context.Context) error {
	var ok bool
	err := l.conn.QueryRow(ctx, unlockText, dialects.LeaderKey(l.name)).Scan(&ok)
	if err == nil && !ok {
		err = fmt.Errorf("the key was not held")
	}
	endConn(l.conn, err)
	if err != nil {
		return fmt.Errorf("postgres: resign %s: %w", l.name, err)
	}
	return nil
}

// DeleteProcessed deletes the oldest finished rows, skipping rows another session holds.
func (d *Dialect) DeleteProcessed(ctx context.Context, t dialects.Table, before time.Time, limit int) (int64, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return 0, err
	}
	if t.ProcessedAt == "" {
		return 0, fmt.Errorf("postgres: retention on table %s: the description names no processed_at column", t.Name)
	}
	if limit <= 0 {
		return 0, nil
	}
	tq, id := quote(t.Name), quote(t.ID)
	tag, err := d.pool.Exec(ctx, "DELETE FROM "+tq+" WHERE "+id+" IN (SELECT "+id+" FROM "+tq+" WHERE "+quote(t.ProcessedAt)+
		" < $1 ORDER BY "+id+" LIMIT "+strconv.Itoa(limit)+" FOR UPDATE SKIP LOCKED)", before)
	if err != nil {
		return 0, adminErr("retention", t.Name, err)
	}
	return tag.RowsAffected(), nil
}
