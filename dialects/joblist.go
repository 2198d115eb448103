package dialects

import (
	"context"
	"time"
)

// JobLister is a dialect that lists a table's rows a page at a time, with filters: the
// dashboard's job list. Like Inspect, it first checks the description against the live
// table.
//
// Pages are keyset pages by id, never OFFSET scans: a page costs the rows it reads from
// the primary key's index up to its limit, however deep it is.
type JobLister interface {
	// ListJobs reads up to f.Limit rows of t that pass f, in id order, in one statement
	// that writes nothing.
	//
	// Each row reads as Inspect would read it at now, but for what a list does not show.
	// It has no Payload and no Headers, which may be megabytes each, and its Error is cut
	// to its first 200 characters.
	ListJobs(ctx context.Context, t Table, f JobFilter, now time.Time) ([]Job, error)
}

// FormChecker is a dialect that cannot serve every form, and says without the database
// whether it serves a table's. A dialect that is not a FormChecker serves every form.
//
// CheckForm returns the *ConfigError that Open, and so Subscribe, returns for a table
// described in a form the dialect cannot serve, such as the row lock form on SQLite. It
// returns nil otherwise. A dashboard asks it before it shows a table, since every action
// on such a table would fail.
type FormChecker interface {
	CheckForm(t Table) error
}

// JobFilter narrows and pages a job list. The zero filter lists the first rows of every
// group.
type JobFilter struct {
	// Group, with HasGroup, keeps the rows of one group. It is ignored for a table
	// without groups. Rows whose group is NULL are never listed by group.
	Group    string
	HasGroup bool
	// States keeps the rows in one of these states, as Stats counts them. Empty keeps
	// every state.
	States []JobState
	// MinAttempt keeps the rows with at least this many attempts made (Job.Attempt). 0
	// or 1 keeps every row.
	// It is ignored without an attempt column.
	MinAttempt int64
	// ErrorContains keeps the rows whose error column contains this text. "" keeps every
	// row; it is ignored without an error column.
	//
	// Letter case compares as the column's collation says: MySQL's usual collations
	// ignore it, PostgreSQL and SQLite do not.
	ErrorContains string
	// AfterID lists the rows after this id in id order: the next page. BeforeID lists
	// the rows before it, read backwards from it and returned in id order: the previous
	// page. At most one is set; with neither, the list starts at the first row.
	AfterID, BeforeID int64
	// Limit is the page's size; 0 means DefaultJobPage.
	Limit int
}

// DefaultJobPage is a job list's page size unless told otherwise.
const DefaultJobPage = 50

// FinishedCounter is a dialect that counts a table's finished rows per group and
// minute, by their processed_at. The dashboard's throughput chart uses it when no broker
// of the process counts its settlements.
//
// It also tells whether that count is cheap. FinishedPerMinute reads the rows finished
// since its since through an index that leads with processed_at, and the whole table
// without one. Schema renders no such index, since claims never need it. So a caller
// that repeats the count, as the dashboard does on every refresh, asks HasFinishedIndex
// first; without the index it shows FinishedIndexStatement instead of reading the table.
type FinishedCounter interface {
	// FinishedPerMinute counts the rows of t whose processed_at is at or after since, per
	// group and minute of processed_at, in group and minute order. A table without
	// groups has one group "". Minutes without a row are left out.
	//
	// It runs one statement that writes nothing. The statement reads the rows finished
	// since since through an index that leads with processed_at, and the whole table
	// without one; Schema renders none. A table without a processed_at column is refused
	// with a *ConfigError.
	FinishedPerMinute(ctx context.Context, t Table, since time.Time) ([]MinuteCount, error)

	// HasFinishedIndex reports whether an index of t, as the database holds it, has the
	// processed_at column as its first key column, so that FinishedPerMinute reads only
	// the rows it counts. It is one catalog read, writing nothing.
	//
	// A B-tree index counts, whole or partial on processed_at IS NOT NULL (PostgreSQL,
	// SQLite). These do not count:
	//
	//   - an index on an expression of processed_at;
	//   - an index where processed_at comes second, such as the claim index of a table
	//     with groups on MySQL;
	//   - any index of a table that does not exist.
	//
	// A table without a processed_at column is refused with a *ConfigError.
	HasFinishedIndex(ctx context.Context, t Table) (bool, error)

	// FinishedIndexStatement is the statement that creates the index HasFinishedIndex
	// looks for, for an operator to run. On PostgreSQL it does not block writes: CREATE
	// INDEX CONCURRENTLY. t must have a processed_at column. It needs no database.
	FinishedIndexStatement(t Table) string
}

// MinuteCount is one group's finished rows of one minute.
//
// Failed of them hold an error text: a Drop or a Cancel with a reason, or a row
// acknowledged with an error. Handled counts the others.
type MinuteCount struct {
	// Group is the rows' group; NullGroup says it is NULL.
	Group           string
	NullGroup       bool
	Minute          time.Time
	Handled, Failed int64
}
