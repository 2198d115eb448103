package sqlite

import (
	"errors"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/rowactor/rowactor/dialects"
)

// Classify names an error's fault by SQLite's primary result code.
//
// SQLite reports a missing table or column as the generic SQLITE_ERROR. rowactor's
// statements are fixed and were checked against the file at Open, so SQLITE_ERROR from
// one of them means the schema changed under it: FaultSchema. A constraint, a type
// mismatch (STRICT tables) or a value too big is one row's data: FaultData.
//
// SQLite reports a trigger's RAISE(ABORT) or RAISE(FAIL) as a constraint too
// (SQLITE_CONSTRAINT_TRIGGER): that is the database refusing the statement, by a rule the
// row's data does not prove it breaks (PostgreSQL's RAISE EXCEPTION, SQLSTATE P0001, and
// MySQL's SIGNAL, SQLSTATE 45000, are no data errors either). It is FaultUnknown, as are
// the constraint codes of a commit hook, an application function and a virtual table, so
// that a settlement refused so returns its row as any failed settlement does, on every
// database, instead of setting the row aside.
func (d *Dialect) Classify(err error) dialects.Fault {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return dialects.ClassifyNetwork(err)
	}
	switch se.Code() {
	case sqlite3.SQLITE_CONSTRAINT_TRIGGER, sqlite3.SQLITE_CONSTRAINT_COMMITHOOK, sqlite3.SQLITE_CONSTRAINT_FUNCTION,
		sqlite3.SQLITE_CONSTRAINT_VTAB, sqlite3.SQLITE_CONSTRAINT_PINNED:
		return dialects.FaultUnknown
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return dialects.FaultContention
	case sqlite3.SQLITE_ERROR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH:
		return dialects.FaultSchema
	case sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_FULL:
		return dialects.FaultConnection
	case sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_TOOBIG:
		// A value one row holds (or one a statement writes into it) that a constraint, a
		// STRICT column type or the size limit refuses.
		return dialects.FaultData
	}
	return dialects.FaultUnknown
}
