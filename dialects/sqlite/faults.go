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
func (d *Dialect) Classify(err error) dialects.Fault {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return dialects.ClassifyNetwork(err)
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
