package sqlite

import (
	"context"
	"errors"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/sqlstmt"
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
	db, err := sqlstmt.On(d.db, tx, "sqlite", "NewestUniqueKey")
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
