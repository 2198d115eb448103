package dialects

import (
	"errors"
	"fmt"
	"time"
)

// Poison rows: one row's data must never stop its queue.
//
// The attempt counter saturates at the largest value its column holds, read from the
// catalog when a queue opens. Every statement that counts an attempt stops at that cap,
// so a row at the cap keeps its count instead of failing the statement. A failed count
// in a claim would fail the claim of every row beside it.
//
// A row the claim took but whose data cannot be read is returned beside the rows the
// same claim read, flagged with Row.Fault. That happens for a value that does not scan;
// SQLite keeps whatever type it is given. The row holds what its form holds: its lease
// token, its row lock, or its key.
//
// The runtime sets such a row aside rather than delivering it, and logs an error naming
// the table, the row and the fix. It sets it aside in the first of these that the
// subscription has:
//
//   - its dead letter: the row moves there;
//   - a retry_after column: the row is parked there at SetAsideUntil;
//   - a locked_until column: the row is parked there, as its lease, at SetAsideUntil;
//   - otherwise later claims skip it: SkipQueue, or the advisory claimer's own list.

// SetAsideUntil is the time a set-aside row is parked at, in retry_after or as its lease
// in locked_until. No claim takes it before an operator clears it.
var SetAsideUntil = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// ErrRowData is matched by errors.Is for the error of a row whose data cannot be read.
var ErrRowData = errors.New("rowactor: the row's data cannot be read")

// RowDataError is a claimed row whose columns do not scan into a delivery: a payload,
// attempt, headers or key value of a type rowactor cannot read.
type RowDataError struct {
	Table string
	ID    int64
	Err   error
}

func (e *RowDataError) Error() string {
	return fmt.Sprintf("rowactor: table %q, row %d: the row's data cannot be read: %v", e.Table, e.ID, e.Err)
}

// Unwrap lets errors.Is match ErrRowData and the scan's error.
func (e *RowDataError) Unwrap() []error { return []error{ErrRowData, e.Err} }

// SkipQueue is a row lock queue whose claims can pass over rows set aside in memory, for
// a table with no retry_after column to park them in and no dead letter.
//
// Skip adds a row's id to the ids its later claims never take, for the life of the
// queue: single claims, batches and FIFO heads alike.
type SkipQueue interface {
	Skip(id int64)
}
