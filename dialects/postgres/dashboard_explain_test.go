package postgres

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
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
// through the claim index, never the whole table: QueueStats' counts and its errors, a
// job list of due rows, and the finished rows per minute, which the dashboard reads only
// given the index FinishedIndexStatement creates (Schema renders none). A job list of every state reads
// the primary key. FinishedGroups is not among them: it reads the finished rows, which the
// claim index leaves out, so the dashboard reads it at most once a minute, in the
// background (dialects.GroupLister).
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
	state, _, _ := statsState(tbl)
	var listArgs []any
	listBind := func(v any) string { listArgs = append(listArgs, v); return "$" + strconv.Itoa(len(listArgs)) }
	listArgs = append(listArgs, now)
	list := adminsql.ListJobsText(tbl, quote, state, listBind, func(c, p string) string { return "strpos(" + c + ", " + p + ") > 0" },
		dialects.JobFilter{Group: "g3", HasGroup: true, AfterID: 500000})
	var dueArgs []any
	dueBind := func(v any) string { dueArgs = append(dueArgs, v); return "$" + strconv.Itoa(len(dueArgs)) }
	dueArgs = append(dueArgs, now)
	due := adminsql.ListJobsText(tbl, quote, state, dueBind, func(c, p string) string { return "strpos(" + c + ", " + p + ") > 0" },
		dialects.JobFilter{Group: "g3", HasGroup: true, States: []dialects.JobState{dialects.JobDue}})
	claim := tbl.Name + "_claim"
	for _, c := range []struct {
		name, query string
		args        []any
		index       string // the index the plan must read, when it matters
	}{
		{"QueueStats", stats, []any{now}, claim},
		{"QueueStats' errors", adminsql.TopUnfinishedErrorsText(tbl, quote), nil, claim},
		{"ListJobs", list, listArgs, tbl.Name + "_pkey"},
		// Due rows only: from the claim index in id order, not from the primary key
		// past 990,000 finished rows.
		{"ListJobs of due rows", due, dueArgs, claim},
	} {
		checkPlan(t, d, c.name, c.index, c.query, c.args...)
	}
	// The chart's statement as the dashboard runs it on every refresh after the first,
	// over the last two minutes. Without an index leading with processed_at (Schema
	// renders none) it would read the whole table, so the dashboard does not run it: it
	// shows FinishedIndexStatement instead. With that index, the statement reads it. The
	// first read, of the whole hour, is here half the table, which PostgreSQL rightly
	// reads whole.
	if ok, err := d.HasFinishedIndex(ctx, tbl); err != nil || ok {
		t.Fatalf("HasFinishedIndex on Schema's table: %v, %v; want false", ok, err)
	}
	mustExec(t, d, d.FinishedIndexStatement(tbl))
	mustExec(t, d, "ANALYZE "+quote(tbl.Name))
	if ok, err := d.HasFinishedIndex(ctx, tbl); err != nil || !ok {
		t.Fatalf("HasFinishedIndex after %s: %v, %v; want true", d.FinishedIndexStatement(tbl), ok, err)
	}
	checkPlan(t, d, "FinishedPerMinute", tbl.Name+"_finished", finishedText(tbl), now.Add(-2*time.Minute))
}

// checkPlan fails unless the plan of query reads no table whole and reads index.
func checkPlan(t *testing.T, d *Dialect, name, index, query string, args ...any) {
	t.Helper()
	plan := explain(t, d, query, args...)
	if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, index) {
		t.Errorf("%s scans the table, or not through %s:\n%s\n%s", name, index, query, plan)
		return
	}
	t.Logf("%s:\n%s", name, plan)
}
