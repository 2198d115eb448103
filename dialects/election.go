package dialects

import (
	"context"
	"fmt"
	"time"
)

// Elector runs work that one session at a time may do across every process on the
// database (a periodic job's round): the work runs while its session holds a lock no
// other session can take.
type Elector interface {
	// Elect takes lock, waiting up to wait for a session that holds it (PostgreSQL's
	// advisory lock in a transaction of its own, MySQL's GET_LOCK; SQLite's is the file's
	// registry in this process, so processes sharing a file are not kept apart), runs fn
	// while holding it, and lets it go. led is false, and fn does not run, when the lock
	// stayed held for the whole wait. A session that dies (killed, its process gone) lets
	// the lock go with it, so a waiter takes over. err is fn's error, or the lock's.
	//
	// tx is a transaction on the lock's own session (pgx.Tx, *sql.Tx), for fn's reads and
	// writes: a round needs one connection, however small the pool, and what fn wrote
	// commits before the lock goes (rolled back when fn fails). On SQLite, whose lock
	// holds no connection, tx is nil: fn uses the pool.
	Elect(ctx context.Context, lock string, wait time.Duration, fn func(ctx context.Context, tx any) error) (led bool, err error)
}

// UniqueKeyReader reads the unique keys of a table's rows (Table.UniqueKey).
type UniqueKeyReader interface {
	// NewestUniqueKey returns the greatest unique key of t's rows, compared byte by byte,
	// among the keys in [low, high), and whether there is one. Rows of every
	// group and state count, finished ones too. tx is nil for the pool, or a transaction
	// (an Elect's) to read in, on its connection alone: the description is then not
	// checked against the live table (check it once with tx nil).
	NewestUniqueKey(ctx context.Context, tx any, t Table, low, high string) (key string, found bool, err error)
}

// CheckKeyRange refuses a NewestUniqueKey of a table without a unique key column, or of
// an empty range.
func CheckKeyRange(t Table, low, high string) error {
	if t.UniqueKey == "" {
		return &ConfigError{Table: t.Name, Option: "Table.UniqueKey", Reason: "reading unique keys needs the table's unique key column",
			Fix: "set Table.UniqueKey (rowactor.Schema renders it)"}
	}
	if low >= high {
		return fmt.Errorf("dialects: the unique key range [%q, %q) is empty", low, high)
	}
	return nil
}
