package dialects

import (
	"context"
	"slices"
	"strings"
	"time"
)

// JobLister is a dialect that lists a table's rows a page at a time, with filters (the
// dashboard's job list). Like Inspect it first checks the description against the live
// table. Pages are keyset pages by id, never OFFSET scans: a page costs the rows it reads
// from the primary key's index up to its limit, however deep it is.
type JobLister interface {
	// ListJobs reads up to f.Limit rows of t that pass f, in id order, each as Inspect
	// would read it at now, in one statement that writes nothing.
	ListJobs(ctx context.Context, t Table, f JobFilter, now time.Time) ([]Job, error)
}

// JobFilter narrows and pages a job list. The zero filter lists the first rows of every
// group.
type JobFilter struct {
	// Group, with HasGroup, keeps the rows of one group (ignored for a table without
	// groups). Rows whose group is NULL are never listed by group.
	Group    string
	HasGroup bool
	// States keeps the rows in one of these states (as Stats counts them); empty keeps
	// every state.
	States []JobState
	// MinAttempt keeps the rows whose attempt is at least this (0 or 1 keeps every row;
	// ignored without an attempt column).
	MinAttempt int64
	// ErrorContains keeps the rows whose error column contains this text ("" keeps every
	// row; ignored without an error column). How letter case compares is the column's
	// collation's (MySQL's usual collations ignore it; PostgreSQL and SQLite do not).
	ErrorContains string
	// AfterID lists the rows after this id in id order (the next page); BeforeID the rows
	// before it, read backwards from it and returned in id order (the previous page). At
	// most one is set; neither lists from the first row.
	AfterID, BeforeID int64
	// Limit is the page's size; 0 means DefaultJobPage.
	Limit int
}

// DefaultJobPage is a job list's page size unless told otherwise.
const DefaultJobPage = 50

// ListJobsText is the statement ListJobs runs: the id, the state (the dialect's Stats
// CASE, whose own parameters the caller binds first) and InspectText's columns of the
// rows passing f, read through a derived table so the state is computed once and filtered
// on by name. bind binds a value and returns its placeholder, called in the text's order
// after state's; contains renders "column contains the bound text" (strpos, INSTR).
func ListJobsText(t Table, quote func(string) string, state string, bind func(v any) string,
	contains func(column, param string) string, f JobFilter) string {
	id := quote(t.ID)
	var b strings.Builder
	b.WriteString("SELECT * FROM (SELECT " + id + " AS rowactor_id, " + state + " AS rowactor_state")
	for _, c := range inspectColumns(t) {
		b.WriteString(", " + quote(c))
	}
	b.WriteString(" FROM " + quote(t.Name))
	var where []string
	if t.Group != "" && f.HasGroup {
		where = append(where, quote(t.Group)+" = "+bind(f.Group))
	}
	if t.Attempt != "" && f.MinAttempt > 1 {
		where = append(where, quote(t.Attempt)+" >= "+bind(f.MinAttempt))
	}
	if t.Error != "" && f.ErrorContains != "" {
		where = append(where, contains(quote(t.Error), bind(f.ErrorContains)))
	}
	// A filter on unfinished states only (or on the finished one only) says so on
	// processed_at too: the claim index's own condition, so the page is read from that
	// index in id order instead of from the primary key past every finished row.
	if t.ProcessedAt != "" && len(f.States) > 0 {
		finished := slices.Contains(f.States, JobProcessed)
		switch {
		case !finished:
			where = append(where, quote(t.ProcessedAt)+" IS NULL")
		case len(f.States) == 1:
			where = append(where, quote(t.ProcessedAt)+" IS NOT NULL")
		}
	}
	order := " ORDER BY rowactor_id"
	switch {
	case f.AfterID > 0:
		where = append(where, id+" > "+bind(f.AfterID))
	case f.BeforeID > 0:
		where = append(where, id+" < "+bind(f.BeforeID))
		order += " DESC"
	}
	if len(where) > 0 {
		b.WriteString(" WHERE " + strings.Join(where, " AND "))
	}
	b.WriteString(") AS r")
	if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, s := range f.States {
			states[i] = bind(int64(s))
		}
		b.WriteString(" WHERE rowactor_state IN (" + strings.Join(states, ", ") + ")")
	}
	b.WriteString(order + " LIMIT " + bind(int64(f.limit())))
	return b.String()
}

func (f JobFilter) limit() int {
	if f.Limit <= 0 {
		return DefaultJobPage
	}
	return f.Limit
}

// ScanJobs reads ListJobsText's rows, in id order whichever way the page was read.
func ScanJobs(rows Rows, t Table, f JobFilter, inWorkCounted bool, scanTime TimeScan) ([]Job, error) {
	var jobs []Job
	for rows.Next() {
		j := Job{InWorkCounted: inWorkCounted}
		if err := scanJob(rows, t, &j, []any{&j.ID}, scanTime); err != nil {
			return nil, err
		}
		jobs = append(jobs, j)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if f.BeforeID > 0 && f.AfterID <= 0 {
		slices.Reverse(jobs)
	}
	return jobs, nil
}

// FinishedCounter is a dialect that counts a table's finished rows per group and minute,
// by their processed_at (the dashboard's throughput chart when no broker of the process
// counts its settlements), and tells whether that count is cheap: FinishedPerMinute reads
// the rows finished since its since through an index that leads with processed_at, and
// the whole table without one. Schema renders none (claims never need it), so a caller
// that repeats the count (the dashboard, on every refresh) asks HasFinishedIndex first
// and, without the index, shows FinishedIndexStatement instead of reading the table.
type FinishedCounter interface {
	// FinishedPerMinute counts the rows of t whose processed_at is at or after since, per
	// group (one group "" for a table without groups) and minute of processed_at, in
	// group and minute order, in one statement that writes nothing; minutes without a row
	// are left out. A table without a processed_at column refuses with a *ConfigError.
	// The statement reads the table's rows finished since since through an index that
	// leads with processed_at, and the whole table without one (Schema renders none).
	FinishedPerMinute(ctx context.Context, t Table, since time.Time) ([]MinuteCount, error)

	// HasFinishedIndex reports whether an index of t, as the database holds it, has the
	// processed_at column (not an expression of it) as its first key column, so that
	// FinishedPerMinute reads only the rows it counts: a B-tree index, whole or partial
	// on processed_at IS NOT NULL (PostgreSQL, SQLite). An index where processed_at comes
	// second (the claim index of a table with groups, on MySQL) does not count; neither
	// does a table that does not exist. One catalog read, writing nothing. A table
	// without a processed_at column refuses with a *ConfigError.
	HasFinishedIndex(ctx context.Context, t Table) (bool, error)

	// FinishedIndexStatement is the statement that creates the index HasFinishedIndex
	// looks for (on PostgreSQL without blocking writes: CREATE INDEX CONCURRENTLY), for an
	// operator to run; t must have a processed_at column. It needs no database.
	FinishedIndexStatement(t Table) string
}

// MinuteCount is one group's finished rows of one minute: Failed of them hold an error
// text (a Drop or a Cancel with a reason; rows acknowledged with an error too), Handled
// the others.
type MinuteCount struct {
	// Group is the rows' group; NullGroup says it is NULL.
	Group           string
	NullGroup       bool
	Minute          time.Time
	Handled, Failed int64
}

// CheckFinished refuses FinishedPerMinute and HasFinishedIndex on a table without
// processed_at.
func CheckFinished(t Table) error {
	if err := CheckDescription(t); err != nil {
		return err
	}
	if t.ProcessedAt == "" {
		return &ConfigError{Table: t.Name, Option: "Table.ProcessedAt",
			Reason: "finished rows are counted by processed_at, and the description names no such column",
			Fix:    "name the processed_at column, or count settlements in the process (a broker's Throughput)"}
	}
	return nil
}

// FinishedText is FinishedPerMinute's statement: minute renders a time column's minute as
// a value the dialect scans back (date_trunc, a formatted text), since is bound by the
// dialect's placeholder. Its columns are the group (with a group column), the minute, the
// rows, the rows holding an error.
func FinishedText(t Table, quote func(string) string, minute func(column string) string, since string) string {
	p := quote(t.ProcessedAt)
	failed := "0"
	if t.Error != "" {
		failed = "count(" + quote(t.Error) + ")"
	}
	g := ""
	if t.Group != "" {
		g = quote(t.Group) + " AS g, "
	}
	text := "SELECT " + g + minute(p) + " AS m, count(*), " + failed + " FROM " + quote(t.Name) + " WHERE " + p + " >= " + since
	if t.Group != "" {
		return text + " GROUP BY g, m ORDER BY g, m"
	}
	return text + " GROUP BY m ORDER BY m"
}

// ScanFinished reads FinishedText's rows; minute reads the minute column's value scanned
// into the dest it returns.
func ScanFinished(rows Rows, t Table, minute func() (dest any, get func() (time.Time, error))) ([]MinuteCount, error) {
	var out []MinuteCount
	for rows.Next() {
		var (
			m     MinuteCount
			group *string
		)
		d, get := minute()
		dest := []any{d, &m.Handled, &m.Failed}
		if t.Group != "" {
			dest = append([]any{&group}, dest...)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		at, err := get()
		if err != nil {
			return nil, err
		}
		m.Minute, m.Handled = at, m.Handled-m.Failed
		if t.Group != "" {
			if group == nil {
				m.NullGroup = true
			} else {
				m.Group = *group
			}
		}
		out = append(out, m)
	}
	return out, rows.Err()
}
