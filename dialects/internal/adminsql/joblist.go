package adminsql

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// ListErrorChars is how much of a listed row's error text ListJobs reads.
const ListErrorChars = ErrorSummaryChars

// ListJobsText is the statement ListJobs runs: the id, the state (the dialect's Stats
// CASE, whose own parameters the caller binds first) and listColumns of the rows passing
// f, read through a derived table so the state is computed once and filtered on by name.
// It selects neither the payload nor the headers, and only the first ListErrorChars
// characters of the error (substr, which all three databases know). bind binds a value and returns its placeholder, called in the text's order
// after state's; contains renders "column contains the bound text" (strpos, INSTR).
func ListJobsText(t dialects.Table, quote func(string) string, state string, bind func(v any) string,
	contains func(column, param string) string, f dialects.JobFilter) string {
	id := quote(t.ID)
	var b strings.Builder
	b.WriteString("SELECT * FROM (SELECT " + id + " AS rowactor_id, " + state + " AS rowactor_state")
	for _, c := range listColumns(t) {
		if c == t.Error {
			b.WriteString(", substr(" + quote(c) + ", 1, " + strconv.Itoa(ListErrorChars) + ") AS " + quote(c))
			continue
		}
		b.WriteString(", " + quote(c))
	}
	b.WriteString(" FROM " + quote(t.Name))
	var where []string
	if t.Group != "" && f.HasGroup {
		where = append(where, quote(t.Group)+" = "+bind(f.Group))
	}
	if t.Attempt != "" && f.MinAttempt > 1 {
		where = append(where, minAttempts(t, quote, bind, f.MinAttempt))
	}
	if t.Error != "" && f.ErrorContains != "" {
		where = append(where, contains(quote(t.Error), bind(f.ErrorContains)))
	}
	// A filter on unfinished states only (or on the finished one only) says so on
	// processed_at too: the claim index's own condition, so the page is read from that
	// index in id order instead of from the primary key past every finished row.
	if t.ProcessedAt != "" && len(f.States) > 0 {
		finished := slices.ContainsFunc(f.States, func(s dialects.JobState) bool {
			return s == dialects.JobProcessed || s == dialects.JobCancelled
		})
		switch {
		case !finished:
			where = append(where, quote(t.ProcessedAt)+" IS NULL")
		case !slices.ContainsFunc(f.States, func(s dialects.JobState) bool {
			return s != dialects.JobProcessed && s != dialects.JobCancelled
		}):
			where = append(where, quote(t.ProcessedAt)+" IS NOT NULL")
		}
	}
	// Dead rows only: their own condition too, which the dead-letter index Schema renders
	// (on group and dead_at) serves.
	if t.DeadAt != "" && len(f.States) > 0 && !slices.ContainsFunc(f.States, func(s dialects.JobState) bool { return s != dialects.JobDead }) {
		where = append(where, quote(t.DeadAt)+" IS NOT NULL")
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
	b.WriteString(order + " LIMIT " + bind(int64(pageSize(f))))
	return b.String()
}

// ScanJobs reads ListJobsText's rows, in id order whichever way the page was read.
func ScanJobs(rows dialects.Rows, t dialects.Table, f dialects.JobFilter, inWorkCounted bool, scanTime TimeScan) ([]dialects.Job, error) {
	var jobs []dialects.Job
	for rows.Next() {
		j := dialects.Job{InWorkCounted: inWorkCounted}
		if err := scanJob(rows, t, &j, []any{&j.ID}, scanTime, false); err != nil {
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

// FinishedText is FinishedPerMinute's statement: minute renders a time column's minute as
// a value the dialect scans back (date_trunc, a formatted text), since is bound by the
// dialect's placeholder. Its columns are the group (with a group column), the minute, the
// rows, the rows holding an error.
func FinishedText(t dialects.Table, quote func(string) string, minute func(column string) string, since string) string {
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

// FinishedGroupsText is FinishedGroups' statement: group is the group column as the
// dialect reads it (quoted, maybe cast), limit the limit's placeholder.
func FinishedGroupsText(t dialects.Table, quote func(string) string, group, limit string) string {
	return "SELECT DISTINCT " + group + " AS g FROM " + quote(t.Name) + " WHERE " + quote(t.ProcessedAt) +
		" IS NOT NULL ORDER BY g LIMIT " + limit
}

// ScanGroupNames reads FinishedGroupsText's rows.
func ScanGroupNames(rows dialects.Rows) ([]dialects.GroupName, error) {
	var out []dialects.GroupName
	for rows.Next() {
		var group *string
		if err := rows.Scan(&group); err != nil {
			return nil, err
		}
		if group == nil {
			out = append(out, dialects.GroupName{NullGroup: true})
			continue
		}
		out = append(out, dialects.GroupName{Group: *group})
	}
	return out, rows.Err()
}

// ScanFinished reads FinishedText's rows; minute reads the minute column's value scanned
// into the dest it returns.
func ScanFinished(rows dialects.Rows, t dialects.Table, minute func() (dest any, get func() (time.Time, error))) ([]dialects.MinuteCount, error) {
	var out []dialects.MinuteCount
	for rows.Next() {
		var (
			m     dialects.MinuteCount
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

// pageSize is a filter's page size: its Limit, or DefaultJobPage when it gives none.
func pageSize(f dialects.JobFilter) int {
	if f.Limit <= 0 {
		return dialects.DefaultJobPage
	}
	return f.Limit
}

// minAttempts is the condition "at least n attempts made" (dialects.AttemptsMade) on the
// attempt column: one above n, or n on a row lock form's finished row, whose column reads
// the calls made.
func minAttempts(t dialects.Table, quote func(string) string, bind func(v any) string, n int64) string {
	col := quote(t.Attempt)
	var finished []string
	for _, c := range []string{t.ProcessedAt, t.DeadAt} {
		if c != "" {
			finished = append(finished, quote(c)+" IS NOT NULL")
		}
	}
	if t.Form() != dialects.FormRowLock || len(finished) == 0 {
		return col + " >= " + bind(n+1)
	}
	return "(" + col + " >= " + bind(n+1) + " OR (" + col + " = " + bind(n) + " AND (" + strings.Join(finished, " OR ") + ")))"
}
