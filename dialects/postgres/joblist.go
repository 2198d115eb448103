package postgres

import (
	"context"
	"strconv"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var (
	_ dialects.JobLister       = (*Dialect)(nil)
	_ dialects.FinishedCounter = (*Dialect)(nil)
)

// ListJobs reads one keyset page of rows in one statement (dialects.JobLister): the
// primary key's index read from the page's edge, each row's state as Stats counts it.
func (d *Dialect) ListJobs(ctx context.Context, t dialects.Table, f dialects.JobFilter, now time.Time) ([]dialects.Job, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return nil, err
	}
	state, usesNow, err := statsState(t)
	if err != nil {
		return nil, err
	}
	var args []any
	if usesNow {
		args = append(args, now) // $1, as statsState writes it
	}
	bind := func(v any) string { args = append(args, v); return "$" + strconv.Itoa(len(args)) }
	contains := func(col, p string) string { return "strpos(" + col + ", " + p + ") > 0" }
	text := dialects.ListJobsText(t, quote, state, bind, contains, f) // binds args: build it first
	rows, err := d.pool.Query(ctx, text, args...)
	if err != nil {
		return nil, adminErr("list jobs", t.Name, err)
	}
	defer rows.Close()
	jobs, err := dialects.ScanJobs(rows, t, f, t.Form() != dialects.FormRowLock, func() (any, func() (time.Time, error)) {
		var v *time.Time
		return &v, func() (time.Time, error) {
			if v == nil {
				return time.Time{}, nil
			}
			return *v, nil
		}
	})
	if err != nil {
		return nil, adminErr("list jobs", t.Name, err)
	}
	return jobs, nil
}

// FinishedPerMinute counts finished rows per group and minute of processed_at, in one
// statement (dialects.FinishedCounter).
func (d *Dialect) FinishedPerMinute(ctx context.Context, t dialects.Table, since time.Time) ([]dialects.MinuteCount, error) {
	if err := dialects.CheckFinished(t); err != nil {
		return nil, err
	}
	if err := d.checkTable(ctx, t); err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, finishedText(t), since)
	if err != nil {
		return nil, adminErr("finished per minute", t.Name, err)
	}
	defer rows.Close()
	out, err := dialects.ScanFinished(rows, t, func() (any, func() (time.Time, error)) {
		var m time.Time
		return &m, func() (time.Time, error) { return m, nil }
	})
	if err != nil {
		return nil, adminErr("finished per minute", t.Name, err)
	}
	return out, nil
}

// finishedText is FinishedPerMinute's statement, since bound as $1.
func finishedText(t dialects.Table) string {
	return dialects.FinishedText(t, quote, func(col string) string { return "date_trunc('minute', " + col + ")" }, "$1")
}
