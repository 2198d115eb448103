package sqlite

import (
	"context"
	"database/sql"
	"strconv"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
)

var (
	_ dialects.JobLister       = (*Dialect)(nil)
	_ dialects.FinishedCounter = (*Dialect)(nil)
	_ dialects.GroupLister     = (*Dialect)(nil)
	_ dialects.FormChecker     = (*Dialect)(nil)
)

// CheckForm refuses the row lock form, as Open does (dialects.FormChecker).
func (d *Dialect) CheckForm(t dialects.Table) error { return refuseRowLock(t) }

// ListJobs reads one keyset page of rows in one statement (dialects.JobLister): the
// primary key read from the page's edge, each row's state as Stats counts it. An advisory
// row in work reads as due: the keys live in the consuming process.
func (d *Dialect) ListJobs(ctx context.Context, t dialects.Table, f dialects.JobFilter, now time.Time) ([]dialects.Job, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return nil, err
	}
	state, usesNow := statsState(t)
	var args []any
	if usesNow {
		args = append(args, sql.Named("now", formatTime(now)))
	}
	bind := named(&args)
	contains := func(col, p string) string { return "instr(" + col + ", " + p + ") > 0" }
	text := adminsql.ListJobsText(t, quote, state, bind, contains, f) // binds args: build it first
	rows, err := d.db.QueryContext(ctx, text, args...)
	if err != nil {
		return nil, adminErr("list jobs", t.Name, err)
	}
	defer rows.Close()
	jobs, err := adminsql.ScanJobs(rows, t, f, t.Form() == dialects.FormLease, func() (any, func() (time.Time, error)) {
		var v sql.NullString
		return &v, func() (time.Time, error) { return parseTime(v) }
	})
	if err != nil {
		return nil, adminErr("list jobs", t.Name, err)
	}
	return jobs, nil
}

// named binds values as :p1, :p2, ...: statsState's text binds :now by name, and SQLite
// numbers ? placeholders after named ones in ways best not relied on.
func named(args *[]any) func(v any) string {
	n := 0
	return func(v any) string {
		n++
		name := "p" + strconv.Itoa(n)
		*args = append(*args, sql.Named(name, v))
		return ":" + name
	}
}

// minuteLayout is the minute of a time column as FinishedPerMinute cuts it from the
// stored text (TimeLayout's first 16 characters).
const minuteLayout = "2006-01-02T15:04"

// FinishedPerMinute counts finished rows per group and minute of processed_at, in one
// statement (dialects.FinishedCounter). Times are stored as fixed-width UTC text, so a
// minute is the text's first 16 characters and compares as text does.
func (d *Dialect) FinishedPerMinute(ctx context.Context, t dialects.Table, since time.Time) ([]dialects.MinuteCount, error) {
	if err := tablecheck.CheckFinished(t); err != nil {
		return nil, err
	}
	if err := d.checkTable(ctx, t); err != nil {
		return nil, err
	}
	minute := func(col string) string { return "substr(" + col + ", 1, 16)" }
	rows, err := d.db.QueryContext(ctx, adminsql.FinishedText(t, quote, minute, ":since"), sql.Named("since", formatTime(since)))
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

// finishedIndexQuery counts the indexes of table ?1 whose first column (seqno 0; an
// expression has no name) is ?2, whole or partial on "?2 IS NOT NULL" (the index's own
// text, its quotes and blanks taken out, ends so).
const finishedIndexQuery = `SELECT count(*) FROM pragma_index_list(?1) AS il JOIN pragma_index_info(il.name) AS ii
	WHERE ii.seqno = 0 AND ii.name = ?2 COLLATE NOCASE AND (il.partial = 0 OR
	(SELECT lower(replace(replace(replace(replace(replace(replace(replace(s.sql, ' ', ''), char(9), ''), char(10), ''), '"', ''), '` + "`" + `', ''), '[', ''), ']', ''))
		FROM sqlite_schema AS s WHERE s.type = 'index' AND s.name = il.name) LIKE '%where' || lower(?2) || 'isnotnull')`

// HasFinishedIndex reads pragma index_list and index_info for an index leading with
// processed_at (dialects.FinishedCounter).
func (d *Dialect) HasFinishedIndex(ctx context.Context, t dialects.Table) (bool, error) {
	if err := tablecheck.CheckFinished(t); err != nil {
		return false, err
	}
	var n int
	if err := d.db.QueryRowContext(ctx, finishedIndexQuery, t.Name, t.ProcessedAt).Scan(&n); err != nil {
		return false, adminErr("read the processed_at index", t.Name, err)
	}
	return n > 0, nil
}

// FinishedIndexStatement is a partial index of the finished rows
// (dialects.FinishedCounter).
func (d *Dialect) FinishedIndexStatement(t dialects.Table) string {
	p := quote(t.ProcessedAt)
	return "CREATE INDEX IF NOT EXISTS " + quote(t.Name+"_finished") + " ON " + quote(t.Name) + " (" + p + ") WHERE " + p + " IS NOT NULL"
}

// FinishedGroups lists the groups of the finished rows, in one statement that reads them
// (dialects.GroupLister): the claim index leaves them out, so it reads the whole table.
func (d *Dialect) FinishedGroups(ctx context.Context, t dialects.Table, limit int) ([]dialects.GroupName, error) {
	if err := tablecheck.CheckFinishedGroups(t, limit); err != nil {
		return nil, err
	}
	if err := d.checkTable(ctx, t); err != nil {
		return nil, err
	}
	rows, err := d.db.QueryContext(ctx, adminsql.FinishedGroupsText(t, quote, quote(t.Group), ":limit"), sql.Named("limit", limit))
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
