package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/sqlstmt"
)

var (
	_ dialects.Elector         = (*Dialect)(nil)
	_ dialects.UniqueKeyReader = (*Dialect)(nil)
)

// lockWaiting takes a lock's GET_LOCK name as lockOf does, waiting up to its last
// argument, in seconds.
var lockWaiting = "SELECT GET_LOCK(" + lockNameExpr(utf8mb4("?")) + ", ?)"

// Elect holds lock's GET_LOCK on a pool connection of its own while fn runs; the server
// ends the wait, and a session that dies takes the lock with it.
func (d *Dialect) Elect(ctx context.Context, lock string, wait time.Duration, fn func(ctx context.Context, tx any) error) (bool, error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return false, fmt.Errorf("mysql: elect %s: %w", lock, err)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, lockWaiting, append(lockKey(lock), max(wait, 0).Seconds())...).Scan(&got); err != nil {
		discard(conn)
		return false, fmt.Errorf("mysql: elect %s: %w", lock, err)
	}
	if got.Int64 != 1 {
		_ = conn.Close()
		return false, nil
	}
	// fn's transaction commits before the lock goes.
	ferr := func() error {
		tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return fmt.Errorf("mysql: elect %s: %w", lock, err)
		}
		if err := fn(ctx, tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("mysql: elect %s: commit: %w", lock, err)
		}
		return nil
	}()
	// A connection whose release failed is discarded, which ends its session and the lock
	// with it.
	uctx, cancel := cleanupCtx(ctx)
	var released sql.NullInt64
	uerr := conn.QueryRowContext(uctx, unlockOf, lockKey(lock)...).Scan(&released)
	cancel()
	if uerr != nil || released.Int64 != 1 {
		discard(conn)
	} else {
		_ = conn.Close()
	}
	if uerr != nil {
		uerr = fmt.Errorf("mysql: elect %s: let the lock go: %w", lock, uerr)
	}
	return true, errors.Join(ferr, uerr)
}

// NewestUniqueKey compares the keys as the column does: Schema renders it VARBINARY, byte
// by byte, so its unique index serves the scan.
func (d *Dialect) NewestUniqueKey(ctx context.Context, tx any, t dialects.Table, low, high string) (string, bool, error) {
	db, err := sqlstmt.On(d.db, tx, "mysql", "NewestUniqueKey")
	if err != nil {
		return "", false, err
	}
	if tx == nil { // in a transaction, the caller checked the table before (its own connection)
		if err := d.checkTable(ctx, t); err != nil {
			return "", false, err
		}
	}
	key, found, err := sqlstmt.NewestUniqueKey(ctx, db, quote, t, low, high)
	if err != nil && !errors.As(err, new(*dialects.ConfigError)) {
		return "", false, adminErr("read unique keys", t.Name, err)
	}
	return key, found, err
}
