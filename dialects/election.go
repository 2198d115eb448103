package dialects

import (
	"context"
	"time"
)

// Elector runs work that one session at a time may do across every process on the
// database, such as a periodic job's round. The work runs while its session holds a
// lock no other session can take.
type Elector interface {
	// Elect takes lock, runs fn while holding it, and lets it go. It waits up to wait for
	// a session that holds the lock. led is false, and fn does not run, when the lock
	// stayed held for the whole wait. err is fn's error, or the lock's.
	//
	// The lock is PostgreSQL's advisory lock in a transaction of its own, or MySQL's
	// GET_LOCK. A session that dies, killed or with its process gone, lets the lock go
	// with it, so a waiter takes over. SQLite's lock is the file's registry in this
	// process, so processes sharing a file are not kept apart.
	//
	// tx is a transaction on the lock's own session, a pgx.Tx or *sql.Tx, for fn's reads
	// and writes. A round then needs one connection, however small the pool, and what fn
	// wrote commits before the lock goes; it is rolled back when fn fails. On SQLite,
	// whose lock holds no connection, tx is nil and fn uses the pool.
	Elect(ctx context.Context, lock string, wait time.Duration, fn func(ctx context.Context, tx any) error) (led bool, err error)
}

// UniqueKeyReader reads the unique keys of a table's rows: Table.UniqueKey.
type UniqueKeyReader interface {
	// NewestUniqueKey returns the greatest unique key of t's rows among the keys in
	// [low, high), compared byte by byte, and whether there is one. Rows of every group
	// and state count, finished ones too.
	//
	// tx is nil for the pool, or a transaction to read in, such as an Elect's, on its
	// connection alone. With a transaction the description is not checked against the
	// live table, so check it once with tx nil.
	NewestUniqueKey(ctx context.Context, tx any, t Table, low, high string) (key string, found bool, err error)
}
