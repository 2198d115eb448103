package dialects

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Poison rows: one row's data must never stop its queue.
//
// The attempt counter saturates at the largest value its column holds (AttemptMax, read
// from the catalog when a queue opens): every statement that counts an attempt renders
// CountAttempt, so a row at the cap keeps it instead of failing the statement, which in a
// claim would fail the claim of every row beside it.
//
// A row the claim took but whose data cannot be read (a value that does not scan: SQLite
// keeps whatever type it is given) is returned flagged with Row.Fault, holding what its
// form holds (its lease token, its row lock, its key), beside the rows the same claim
// read. The runtime sets such a row aside rather than delivering it: it moves it to the
// dead letter when the subscription has one, or parks it where later claims skip it
// (SetAsideUntil in retry_after, or in locked_until when the table has no retry_after; a
// table with neither has its claims skip it: SkipQueue, or the advisory claimer's own
// list), and logs an error naming the table, the row and the fix.

// Maxima of the integer column types an attempt column may have.
const (
	MaxSmallint int64 = 32767
	MaxInteger  int64 = 2147483647
	MaxBigint   int64 = 9223372036854775807
)

// CountAttempt renders the saturating count of an attempt column (col, qualified as the
// statement needs): col + 1 below max, col unchanged at max and above (and NULL stays
// NULL). The sum is computed only below max, so it never overflows the column's type.
// A statement that reads the counted value back less one (an UPDATE … RETURNING) cannot
// tell a row it moved to max from one that was there: at the cap such a delivery reads
// max - 1.
func CountAttempt(col string, max int64) string {
	return "CASE WHEN " + col + " < " + strconv.FormatInt(max, 10) + " THEN " + col + " + 1 ELSE " + col + " END"
}

// SetAsideUntil is the time a set-aside row is parked at (in retry_after, or as its lease
// in locked_until): no claim takes it before an operator clears it.
var SetAsideUntil = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// ErrRowData is matched (errors.Is) by the error of a row whose data cannot be read.
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

// SkipQueue is a row lock queue whose claims can pass over rows set aside in memory (a
// table with no retry_after column to park them in and no dead letter): Skip adds a row's
// id to the ids its later claims (single, batch, FIFO head) never take, for the life of
// the queue.
type SkipQueue interface {
	Skip(id int64)
}
