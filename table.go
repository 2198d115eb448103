package rowactor

import (
	"github.com/rowactor/rowactor/dialects"
)

// Table describes a queue table: which of its columns play which role. See
// dialects.Table for every field; only Name, ID and Payload are required.
//
//	jobs := rowactor.Table{
//		Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
//		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until",
//	}
type Table = dialects.Table

// Form is how a table's rows are claimed: row lock, lease or advisory lock.
type Form = dialects.Form

// The claim forms.
const (
	FormRowLock  = dialects.FormRowLock
	FormLease    = dialects.FormLease
	FormAdvisory = dialects.FormAdvisory
)

// Isolation is the isolation level a table declares for its transactions.
type Isolation = dialects.Isolation

// The isolation levels (PostgreSQL, MySQL/MariaDB).
const (
	ReadUncommitted = dialects.ReadUncommitted
	ReadCommitted   = dialects.ReadCommitted
	RepeatableRead  = dialects.RepeatableRead
	Serializable    = dialects.Serializable
)

// Mode is how SQLite begins a table's transactions.
type Mode = dialects.Mode

// The SQLite modes.
const (
	Deferred  = dialects.Deferred
	Immediate = dialects.Immediate
	Exclusive = dialects.Exclusive
)

// Schema renders the CREATE TABLE statement and the recommended claim index for a
// description in the dialect's column types, so nobody has to guess the types.
func Schema(d dialects.Dialect, t Table) (string, error) {
	return d.Schema(t)
}
