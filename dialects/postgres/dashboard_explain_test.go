package postgres

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/dialects"
)

// fillMillion fills tbl (its Schema, lease form, groups g0..g9) with 1,000,000 rows as a
// table that keeps its finished rows looks after a while: 990,000 finished over the last
// two hours (every 13th with an error) and 10,000 queued, some delayed, some leased.
func fillMillion(t *testing.T, d *Dialect, tbl dialects.Table, now time.Time) {
	t.Helper()
	mustExec(t, d, "INSERT INTO "+quote(tbl.Name)+" (payload, grp, attempt, retry_after, processed_at, locked_until, error)"+
		" SELECT '\\x7b7d'::bytea, 'g' || (i % 10), 1 + i % 3,"+
		" CASE WHEN i > 990000 AND i % 10 = 1 THEN $1::timestamptz + interval '1 hour' END,"+
		" CASE WHEN i <= 990000 THEN $1::timestamptz - (i % 7200) * interval '1 second' END,"+
		" CASE WHEN i > 990000 AND i % 10 = 2 THEN $1::timestamptz + interval '1 minute' END,"+
		" CASE WHEN i % 13 = 0 THEN 'boom ' || (i % 3) END"+
		" FROM generate_series(1, 1000000) AS i", now)
	mustExec(t, d, "ANALYZE "+quote(tbl.Name))
}

// explain returns the plan of query with args, one line per node.
func explain(t *testing.T, d *Dialect, query string, args ...any) string {
	t.Helper()
	rows, err := d.Pool().Query(ctx, "EXPLAIN "+query, args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", query, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// The dashboard's overview statements on a 1,000,000-row table read its queued rows
// through the claim index, never the whole table: QueueStats' counts and its errors, and
// (given an index on the group and processed_at, which the chart needs and Schema does
// not render) the finished rows per minute. The job list's page reads the primary key.
func TestDashboardStatementsUseIndexes(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a 1,000,000-row table")
	}
	d := newDialect(t)
	tbl := dialects.Table{Name: tableName(t, d), ID: "id", Payload: "payload", Group: "grp", Attempt: "attempt",
		RetryAfter: "retry_after", ProcessedAt: "processed_at", LockedUntil: "locked_until", Headers: "headers", Error: "error"}
	createTable(t, d, tbl)
	now := time.Now()
	fillMillion(t, d, tbl, now)

	stats, _, err := statsText(tbl, true)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, d, "CREATE INDEX "+quote(tbl.Name+"_finished")+" ON "+quote(tbl.Name)+" (grp, processed_at)")
	mustExec(t, d, "ANALYZE "+quote(tbl.Name))
	var args []any
	bind := func(v any) string { args = append(args, v); return "$" + strconv.Itoa(len(args)) }
	finished := dialects.FinishedText(tbl, quote, func(c string) string { return "date_trunc('minute', " + c + ")" }, bind, "g3", true, now.Add(-time.Hour))
	state, _, _ := statsState(tbl)
	var listArgs []any
	listBind := func(v any) string { listArgs = append(listArgs, v); return "$" + strconv.Itoa(len(listArgs)) }
	listArgs = append(listArgs, now)
	list := dialects.ListJobsText(tbl, quote, state, listBind, func(c, p string) string { return "strpos(" + c + ", " + p + ") > 0" },
		dialects.JobFilter{Group: "g3", HasGroup: true, AfterID: 500000})
	for _, c := range []struct {
		name, query string
		args        []any
	}{
		{"QueueStats", stats, []any{now}},
		{"QueueStats' errors", dialects.TopUnfinishedErrorsText(tbl, quote), nil},
		{"FinishedPerMinute", finished, args},
		{"ListJobs", list, listArgs},
	} {
		plan := explain(t, d, c.query, c.args...)
		if strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s scans the table:\n%s\n%s", c.name, c.query, plan)
		} else {
			t.Logf("%s:\n%s", c.name, plan)
		}
	}
}
