package postgres

import (
	"strings"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// A statement the live schema cannot run fails Open, not the first settlement.
func TestOpenPreparesStatements(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d)
	createTable(t, d, leaseTable(name))
	dead := tableName(t, d)
	// Every column is there, but the payload cannot take the queue's bytea.
	mustExec(t, d, "CREATE TABLE "+quote(dead)+" (id bigint, payload int, grp text, attempt int, retry_after timestamptz, locked_until timestamptz, headers jsonb)")
	q, err := d.Open(ctx, dialects.QueueSpec{Table: leaseTable(name), DeadLetterTable: dead})
	if err == nil {
		q.Close()
		t.Fatal("Open accepted a dead-letter table that cannot take the move")
	}
	ce := dialecttest.ConfigError(t, err)
	if ce.Table != name {
		t.Errorf("table %q", ce.Table)
	}
	dialecttest.Contains(t, err.Error(), "does not prepare")
	dialecttest.Contains(t, err.Error(), "payload")
}

func TestOpenAcceptsEveryForm(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d)
	tbl := leaseTable(name)
	tbl.ProcessedAt = "processed_at"
	tbl.AdvisoryKey = name + "-{account}"
	tbl.LockedUntil = ""
	createTable(t, d, tbl)
	mustExec(t, d, "ALTER TABLE "+quote(name)+" ADD COLUMN locked_until timestamptz")
	dead := tableName(t, d)
	deadTbl := tbl
	deadTbl.Name = dead
	createTable(t, d, deadTbl)

	dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
	noGroup := tbl
	noGroup.Group = ""
	dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: noGroup, DeadLetterTable: dead})
	rl := tbl
	rl.AdvisoryKey = ""
	for _, level := range []dialects.Isolation{"", dialects.ReadCommitted, dialects.RepeatableRead, dialects.Serializable} {
		rl.Isolation = level
		dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: rl, Group: "g", DeadLetterGroup: "dead"})
	}
	ls := leaseTable(name)
	ls.ProcessedAt = "processed_at"
	dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: ls, Group: "g", DeadLetterGroup: "dead"})
}

func TestCaseAndQuotesInNames(t *testing.T) {
	d := newDialect(t)
	base := tableName(t, d)
	name := base + `_Mixed "Case"`
	t.Cleanup(func() { mustExec(t, d, "DROP TABLE IF EXISTS "+quote(name)) })
	tbl := dialects.Table{Name: name, ID: "Id", Payload: `Pay"load`, Attempt: "Attempt", LockedUntil: "Locked Until"}
	createTable(t, d, tbl)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("x")})
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(1e9), 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ID != id || string(rows[0].Payload) != "x" || rows[0].Attempt != 1 {
		t.Fatalf("claimed %+v", rows)
	}
	lower := tbl
	lower.Payload = `pay"load`
	if _, err := d.Open(ctx, dialects.QueueSpec{Table: lower}); err == nil {
		t.Fatal("a name differing in case was accepted")
	}
}

func TestLimits(t *testing.T) {
	d := openURL(t, withParams(testURL(), "pool_max_conns=5"))
	if l := d.Limits(); l.Connections != 4 || l.ClaimsInFlight != 0 {
		t.Errorf("limits %+v", l)
	}
	one := openURL(t, withParams(testURL(), "pool_max_conns=1"))
	if l := one.Limits(); l.Connections != 1 {
		t.Errorf("limits of a pool of one %+v", l)
	}
	if d.Name() != "postgres" {
		t.Errorf("name %q", d.Name())
	}
}

func TestOpenUnreachable(t *testing.T) {
	d, err := Open(ctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2")
	if err == nil {
		d.Close()
		t.Fatal("Open succeeded on a closed port")
	}
	dialecttest.Contains(t, err.Error(), "postgres: open")
}

// Refusals: PostgreSQL's 63-byte identifiers, quoted names that keep their case, read
// uncommitted, the SQLite-only mode, and a lease column without a time zone.
func (harness) Refusals(t *testing.T, dd dialects.Dialect, name, dead string) []dialecttest.Refusal {
	d := dd.(*Dialect)
	wrongType := tableName(t, d)
	mustExec(t, d, "CREATE TABLE "+quote(wrongType)+" (id bigint, payload bytea, locked_until timestamp)")
	long := strings.Repeat("x", 64)
	longColumn := leaseTable(name)
	longColumn.Headers = long
	caseCol := leaseTable(name)
	caseCol.RetryAfter = "Retry_After" // quoted names keep their case
	uncommitted := leaseTable(name)
	uncommitted.Isolation = dialects.ReadUncommitted
	mode := leaseTable(name)
	mode.Mode = dialects.Immediate
	return []dialecttest.Refusal{
		{Name: "long table name", Spec: dialects.QueueSpec{Table: leaseTable(long)}, Option: "Table.Name", Reason: "truncates identifiers to 63"},
		{Name: "long column name", Spec: dialects.QueueSpec{Table: longColumn}, Column: long, Option: "Table.Headers", Reason: "truncates identifiers to 63"},
		{Name: "long dead-letter table", Spec: dialects.QueueSpec{Table: leaseTable(name), DeadLetterTable: long}, Option: "DeadLetterTable", Reason: "truncates"},
		{Name: "column case", Spec: dialects.QueueSpec{Table: caseCol}, Column: "Retry_After", Option: "Table.RetryAfter", Reason: "no such column"},
		{Name: "read uncommitted", Spec: dialects.QueueSpec{Table: uncommitted}, Option: "Table.Isolation", Reason: "read uncommitted"},
		{Name: "mode", Spec: dialects.QueueSpec{Table: mode}, Option: "Table.Mode", Reason: "SQLite"},
		{Name: "wrong time type", Spec: dialects.QueueSpec{Table: dialects.Table{Name: wrongType, ID: "id", Payload: "payload", LockedUntil: "locked_until"}},
			Column: "locked_until", Option: "Table.LockedUntil", Reason: "timestamp with time zone"},
	}
}
