package dialects

import (
	"context"
	"time"
)

// Retainer is a dialect that deletes a table's finished rows, one process at a time.
type Retainer interface {
	// RetainRound deletes t's rows whose processed_at is before before, one round at a
	// time across processes. led is false, and nothing is deleted, when another session
	// holds lock.
	//
	// It takes lock without waiting, on a pool connection of its own. The lock is a
	// session lock: PostgreSQL's advisory lock or MySQL's GET_LOCK; SQLite's is the
	// file's registry in this process. On that same connection it deletes the rows,
	// lowest ids first and up to limit a statement, until a statement deletes fewer. Then
	// it releases the lock and gives the connection back.
	//
	// No statement waits for a row lock. The lock and the deletes share the session, so
	// a round whose session ends, killed or with its process dead, deletes no more. A
	// limit of 0 checks the description against the live table and takes no lock.
	//
	// When ctx ends the round ends with its current statement, which runs on for at most
	// RoundGrace, and the lock is released on its healthy connection: a process asking
	// right after finds it free. Cutting the statement would close the connection, and
	// the server frees a session lock only once it notices.
	RetainRound(ctx context.Context, t Table, lock string, before time.Time, limit int) (deleted int64, led bool, err error)
}

// RoundGrace bounds how long a retention round's statement runs on after the round's
// context ends (Retainer).
const RoundGrace = 5 * time.Second

// LockKey is the advisory key a round of lock is held under, apart from the keys of the
// advisory form's rows.
func LockKey(lock string) string { return "rowactor.lock:" + lock }

// CheckRetain refuses a retention of a table without processed_at. Such a table deletes
// its rows at their ack, and keeps none to retain.
func CheckRetain(t Table) error {
	if t.ProcessedAt == "" {
		return &ConfigError{Table: t.Name, Option: "Table.ProcessedAt",
			Reason: "retention deletes finished rows, and a table without processed_at deletes its rows at their ack",
			Fix:    "name the processed_at column (rowactor.Schema renders it), or drop Retain"}
	}
	return nil
}

// DeadLetterRetainer is a Retainer that also deletes a dead-letter group's old rows, one
// process at a time.
type DeadLetterRetainer interface {
	// RetainDeadLetters is RetainRound for the rows of group whose DeadAt is before
	// before, oldest deaths first. Rows whose DeadAt is NULL stay. It also leaves alone:
	//
	//   - in the lease form, the rows whose lease runs past before, which a subscription
	//     of the group holds;
	//   - in the row lock form, the rows another transaction locks;
	//   - in the advisory form, the rows whose key a session holds; on SQLite, a delivery
	//     of this process.
	//
	// A limit of 0 checks the description and the group against the live table, as
	// CheckRetainDeadLetters does, and takes no lock.
	RetainDeadLetters(ctx context.Context, t Table, group, lock string, before time.Time, limit int) (deleted int64, led bool, err error)
}

// CheckRetainDeadLetters refuses a retention of dead-letter group group that no table
// could serve:
//
//   - a table without a DeadAt column, since nothing tells when its rows died;
//   - a table without a group column;
//   - no group named.
func CheckRetainDeadLetters(t Table, group string) error {
	switch {
	case t.DeadAt == "":
		return &ConfigError{Table: t.Name, Option: "Table.DeadAt",
			Reason: "retention of a dead-letter group deletes rows by when they died, and the description names no dead_at column",
			Fix:    "add a nullable time column, name it in Table.DeadAt (rowactor.Schema renders it and its index), and let dead-letter moves set it"}
	case t.Group == "":
		return &ConfigError{Table: t.Name, Option: "Table.Group",
			Reason: "a dead-letter group needs the table's group column, and the description names none",
			Fix:    "name the group column, or drop RetainDeadLetters"}
	case group == "":
		return &ConfigError{Table: t.Name, Option: "RetainDeadLetters",
			Reason: "no dead-letter group named", Fix: "name the group the subscription's DeadLetterGroup moves rows to"}
	}
	return nil
}
