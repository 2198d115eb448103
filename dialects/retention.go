package dialects

import (
	"context"
	"time"
)

// Retainer is a dialect that deletes a table's finished rows, one process at a time.
type Retainer interface {
	// RetainRound takes lock without waiting (a session lock: PostgreSQL's advisory
	// lock, MySQL's GET_LOCK; SQLite's is the file's registry in this process) on a pool
	// connection of its own, deletes t's rows whose processed_at is before before on that
	// same connection, lowest ids first and up to limit a statement, until a statement
	// deletes fewer, then releases the lock and gives the connection back. led is false,
	// and nothing is deleted, when another session holds the lock. No statement waits for
	// a row lock, and a round whose session ends (killed, a dead process) deletes no more:
	// the lock and the deletes share the session. A limit of 0 checks the description
	// against the live table and takes no lock.
	RetainRound(ctx context.Context, t Table, lock string, before time.Time, limit int) (deleted int64, led bool, err error)
}

// LockKey is the advisory key a round of lock is held under, apart from the keys of the
// advisory form's rows.
func LockKey(lock string) string { return "rowactor.lock:" + lock }

// CheckRetain refuses a retention of a table without processed_at: such a table deletes
// its rows at their ack, and keeps none to retain.
func CheckRetain(t Table) error {
	if t.ProcessedAt == "" {
		return &ConfigError{Table: t.Name, Option: "Table.ProcessedAt",
			Reason: "retention deletes finished rows, and a table without processed_at deletes its rows at their ack",
			Fix:    "name the processed_at column (rowactor.Schema renders it), or drop Retain"}
	}
	return nil
}
