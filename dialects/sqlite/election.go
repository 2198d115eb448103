package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var (
	_ dialects.Elector         = (*Dialect)(nil)
	_ dialects.UniqueKeyReader = (*Dialect)(nil)
)

// electPoll is how often Elect looks again at a lock another broker of this process holds.
const electPoll = 10 * time.Millisecond

// Elect holds lock's key in the file's registry of this process while fn runs: brokers
// of one process on one file take turns; processes sharing the file each run (SQLite has
// no session locks another process could see).
func (d *Dialect) Elect(ctx context.Context, lock string, wait time.Duration, fn func(ctx context.Context, tx any) error) (bool, error) {
	f, err := d.fileEntry(ctx)
	if err != nil {
		return false, err
	}
	key := dialects.LockKey(lock)
	deadline := time.Now().Add(wait)
	for !f.tryKey(key) {
		if !time.Now().Before(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(min(electPoll, time.Until(deadline))):
		}
	}
	defer f.releaseKey(key)
	return true, fn(ctx, nil)
}

// NewestUniqueKey compares the keys in SQLite's default BINARY collation, which the key
// column Schema renders has, so its unique index serves the scan.
func (d *Dialect) NewestUniqueKey(ctx context.Context, tx any, t dialects.Table, low, high string) (string, bool, error) {
	var db interface {
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	}
	switch x := tx.(type) {
	case nil:
		db = d.db
	case *sql.Tx:
		db = x
	default:
		return "", false, fmt.Errorf("sqlite: NewestUniqueKey needs a *sql.Tx, got %T", tx)
	}
	if tx == nil { // in a transaction, the caller checked the table before (its own connection)
		if err := d.checkTable(ctx, t); err != nil {
			return "", false, err
		}
	}
	if err := dialects.CheckKeyRange(t, low, high); err != nil {
		return "", false, err
	}
	k := quote(t.UniqueKey)
	var key string
	err := db.QueryRowContext(ctx, "SELECT "+k+" FROM "+quote(t.Name)+" WHERE "+k+" >= ? AND "+k+" < ? ORDER BY "+k+" DESC LIMIT 1",
		low, high).Scan(&key)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, adminErr("read unique keys", t.Name, err)
	}
	return key, true, nil
}
