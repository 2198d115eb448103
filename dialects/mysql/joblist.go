package mysql

import (
	"context"
	"database/sql"
	"time"
	"unicode/utf8"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
)

var (
	_ dialects.JobLister       = (*Dialect)(nil)
	_ dialects.FinishedCounter = (*Dialect)(nil)
	_ dialects.GroupLister     = (*Dialect)(nil)
)

// ListJobs reads one keyset page of rows in one statement (dialects.JobLister): the
// primary key's index read from the page's edge, each row's state as Stats counts it.
func (d *Dialect) ListJobs(ctx context.Context, t dialects.Table, f dialects.JobFilter, now time.Time) ([]dialects.Job, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return nil, err
	}
	state, nows, err := statsState(t)
	if err != nil {
		return nil, err
	}
	args := make([]any, nows) // statsState's placeholders come first
	for i := range args {
		args[i] = dbTime(now)
	}
	bind := func(v any) string { args = append(args, v); return "?" }
	contains := func(col, p string) string { return "INSTR(" + col + ", " + p + ") > 0" }
	text := adminsql.ListJobsText(t, quote, state, bind, contains, f) // binds args: build it first
	rows, err := d.db.QueryContext(ctx, text, args...)
	if err != nil {
		return nil, adminErr("list jobs", t.Name, err)
	}
	defer rows.Close()
	jobs, err := adminsql.ScanJobs(rows, t, f, t.Form() != dialects.FormRowLock, func() (any, func() (time.Time, error)) {
		var v sql.NullTime
		return &v, func() (time.Time, error) { return v.Time, nil }
	})
	if err != nil {
		return nil, adminErr("list jobs", t.Name, err)
	}
	return jobs, nil
}

// minuteLayout is how FinishedPerMinute's DATE_FORMAT writes a minute (in UTC, as the
// pool reads DATETIME).
const minuteLayout = "2006-01-02 15:04"

// FinishedPerMinute counts finished rows per group and minute of processed_at, in one
// statement (dialects.FinishedCounter).
func (d *Dialect) FinishedPerMinute(ctx context.Context, t dialects.Table, since time.Time) ([]dialects.MinuteCount, error) {
	if err := tablecheck.CheckFinished(t); err != nil {
		return nil, err
	}
	if err := d.checkTable(ctx, t); err != nil {
		return nil, err
	}
	minute := func(col string) string { return "DATE_FORMAT(" + col + ", '%Y-%m-%d %H:%i')" }
	rows, err := d.db.QueryContext(ctx, adminsql.FinishedText(t, quote, minute, "?"), dbTime(since))
	if err != nil {
		return nil, adminErr("finished per minute", t.Name, err)
	}
	defer rows.Close()
	out, err := adminsql.ScanFinished(rows, t, func() (any, func() (time.Time, error)) {
		var txt string
		return &txt, func() (time.Time, error) { return time.ParseInLocation(minuteLayout, txt, time.UTC) }
	})
	if err != nil {
		return nil, adminErr("finished per minute", t.Name, err)
	}
	return out, nil
}

// HasFinishedIndex reads information_schema.STATISTICS for a B-tree index of the table,
// in the current database, whose first column is processed_at, whole (no prefix)
// (dialects.FinishedCounter).
func (d *Dialect) HasFinishedIndex(ctx context.Context, t dialects.Table) (bool, error) {
	if err := tablecheck.CheckFinished(t); err != nil {
		return false, err
	}
	var n int
	err := d.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?"+
		" AND SEQ_IN_INDEX = 1 AND COLUMN_NAME = ? AND SUB_PART IS NULL AND INDEX_TYPE = 'BTREE'", t.Name, t.ProcessedAt).Scan(&n)
	if err != nil {
		return false, adminErr("read the processed_at index", t.Name, err)
	}
	return n > 0, nil
}

// FinishedIndexStatement is an index on processed_at (dialects.FinishedCounter). InnoDB
// builds it in place, writes going on; MySQL has no partial index.
func (d *Dialect) FinishedIndexStatement(t dialects.Table) string {
	name := t.Name + "_finished"
	if utf8.RuneCountInString(name) > maxIdentifier {
		name = "rowactor_finished" // index names are per table
	}
	return "CREATE INDEX " + quote(name) + " ON " + quote(t.Name) + " (" + quote(t.ProcessedAt) + ")"
}

// FinishedGroups lists the groups of the finished rows, in one statement
// (dialects.GroupLister) that reads the claim index, which leads with the group.
func (d *Dialect) FinishedGroups(ctx context.Context, t dialects.Table, limit int) ([]dialects.GroupName, error) {
	if err := tablecheck.CheckFinishedGroups(t, limit); err != nil {
		return nil, err
	}
	if err := d.checkTable(ctx, t); err != nil {
		return nil, err
	}
	rows, err := d.db.QueryContext(ctx, adminsql.FinishedGroupsText(t, quote, quote(t.Group), "?"), limit)
	if err != nil {
		return nil, adminErr("finished groups", t.Name, err)
	}
	defer rows.Close()
	out, err := adminsql.ScanGroupNames(rows)
	if err != nil {
		return nil, adminErr("finished groups", t.Name, err)
	}
	return out, nil
}
