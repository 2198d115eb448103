package postgres

import (
	"context"
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
	text := adminsql.ListJobsText(t, quote, state, bind, contains, f) // binds args: build it first
	rows, err := d.pool.Query(ctx, text, args...)
	if err != nil {
		return nil, adminErr("list jobs", t.Name, err)
	}
	defer rows.Close()
	jobs, err := adminsql.ScanJobs(rows, t, f, t.Form() != dialects.FormRowLock, func() (any, func() (time.Time, error)) {
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
	if err := tablecheck.CheckFinished(t); err != nil {
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
	out, err := adminsql.ScanFinished(rows, t, func() (any, func() (time.Time, error)) {
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
	return adminsql.FinishedText(t, quote, func(col string) string { return "date_trunc('minute', " + col + ")" }, "$1")
}

// finishedIndexQuery says whether a valid B-tree index of the table ($1, quoted, resolved
// by to_regclass: NULL, so false, when it does not exist) has the column $2 as its first
// key column, with no predicate or only "column IS NOT NULL". An expression key has no
// attribute (indkey 0), so it never joins.
const finishedIndexQuery = `SELECT EXISTS (SELECT 1 FROM pg_index i
	JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
	JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam
	WHERE i.indrelid = to_regclass($1) AND i.indisvalid AND am.amname = 'btree' AND a.attname = $2
	AND (i.indpred IS NULL OR pg_get_expr(i.indpred, i.indrelid) = '(' || quote_ident($2) || ' IS NOT NULL)'))`

// HasFinishedIndex reads pg_index for an index leading with processed_at
// (dialects.FinishedCounter).
func (d *Dialect) HasFinishedIndex(ctx context.Context, t dialects.Table) (bool, error) {
	if err := tablecheck.CheckFinished(t); err != nil {
		return false, err
	}
	var ok bool
	if err := d.pool.QueryRow(ctx, finishedIndexQuery, quote(t.Name), t.ProcessedAt).Scan(&ok); err != nil {
		return false, adminErr("read the processed_at index", t.Name, err)
	}
	return ok, nil
}

// FinishedIndexStatement is a partial index of the finished rows, built without blocking
// writes (dialects.FinishedCounter).
func (d *Dialect) FinishedIndexStatement(t dialects.Table) string {
	p := quote(t.ProcessedAt)
	return "CREATE INDEX CONCURRENTLY IF NOT EXISTS " + quote(indexNameWith(t.Name, "_finished")) + " ON " + quote(t.Name) +
		" (" + p + ") WHERE " + p + " IS NOT NULL"
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
	rows, err := d.pool.Query(ctx, adminsql.FinishedGroupsText(t, quote, quote(t.Group)+"::text", "$1"), limit)
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
