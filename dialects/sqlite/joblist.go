package sqlite

import (
	"context"
	"database/sql"
	"strconv"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var (
	_ dialects.JobLister       = (*Dialect)(nil)
	_ dialects.FinishedCounter = (*Dialect)(nil)
)

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
	text := dialects.ListJobsText(t, quote, state, bind, contains, f) // binds args: build it first
	rows, err := d.db.QueryContext(ctx, text, args...)
	if err != nil {
		return nil, adminErr("list jobs", t.Name, err)
	}
	defer rows.Close()
	jobs, err := dialects.ScanJobs(rows, t, f, t.Form() == dialects.FormLease, func() (any, func() (time.Time, error)) {
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
	if err := dialects.CheckFinished(t); err != nil {
		return nil, err
	}
	if err := d.checkTable(ctx, t); err != nil {
		return nil, err
	}
	minute := func(col string) string { return "substr(" + col + ", 1, 16)" }
	rows, err := d.db.QueryContext(ctx, dialects.FinishedText(t, quote, minute, ":since"), sql.Named("since", formatTime(since)))
	if err != nil {
		return nil, adminErr("finished per minute", t.Name, err)
	}
	defer rows.Close()
	out, err := dialects.ScanFinished(rows, t, func() (any, func() (time.Time, error)) {
		var txt string
		return &txt, func() (time.Time, error) { return time.ParseInLocation(minuteLayout, txt, time.UTC) }
	})
	if err != nil {
		return nil, adminErr("finished per minute", t.Name, err)
	}
	return out, nil
}
