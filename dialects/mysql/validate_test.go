package mysql

import (
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// MySQL compares column names without case; every isolation level opens; each form is
// served.
func TestOpenAccepts(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_acc", leaseTable)
	folded := tbl
	folded.ID, folded.LockedUntil, folded.Payload = "ID", "Locked_Until", "PAYLOAD"
	dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: folded})

	rowLock := tbl
	rowLock.LockedUntil = ""
	for _, level := range []dialects.Isolation{"", dialects.ReadUncommitted, dialects.ReadCommitted, dialects.RepeatableRead, dialects.Serializable} {
		rl := rowLock
		rl.Isolation = level
		dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: rl, Group: "g"})
	}
	adv := rowLock
	adv.AdvisoryKey = "jobs-{id}-{GRP}"
	dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: adv, Group: "g", DeadLetterGroup: "dead"})

	// A dead-letter table with the queue's columns, any case.
	dead := tableName(t, d, "ra_acc_dead")
	mustExec(t, d.DB(), "CREATE TABLE "+quote(dead)+" (ID BIGINT PRIMARY KEY, PAYLOAD LONGBLOB, GRP VARCHAR(191), ATTEMPT SMALLINT, "+
		"RETRY_AFTER DATETIME(6), LOCKED_UNTIL DATETIME(6), HEADERS JSON)")
	dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, DeadLetterTable: dead})
}

// Odd identifiers are quoted everywhere.
func TestOddIdentifiers(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d, "ra_odd`q")
	tbl := dialects.Table{Name: name, ID: "i`d", Payload: "pay load", Group: "group", Attempt: "select",
		RetryAfter: "retry-after", LockedUntil: "locked`until", Headers: "order"}
	createTable(t, d, tbl)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p"), Headers: []byte(`{}`)})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 || rows[0].ID != id {
		t.Fatalf("claim %v %v", rows, err)
	}
	ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, dialects.Lease{ID: id, Token: rows[0].Token})
	if !ok || err != nil {
		t.Fatalf("dead letter: %v %v", ok, err)
	}
}

// Refusals: MySQL's 64-character names, the SQLite-only mode, and a dead-letter table
// that is the queue table under another letter case (MySQL's names are case-blind).
func (harness) Refusals(t *testing.T, d dialects.Dialect, jobs, dead string) []dialecttest.Refusal {
	long := strings.Repeat("c", 65)
	with := func(edit func(*dialects.Table)) dialects.Table {
		tbl := leaseTable(jobs)
		edit(&tbl)
		return tbl
	}
	return []dialecttest.Refusal{
		{Name: "table name too long", Spec: dialects.QueueSpec{Table: leaseTable(strings.Repeat("t", 65))}, Option: "Table.Name", Reason: "at most 64"},
		{Name: "column name too long", Spec: dialects.QueueSpec{Table: with(func(t *dialects.Table) { t.Headers = long })},
			Column: long, Option: "Table.Headers", Reason: "at most 64"},
		{Name: "dead-letter name too long", Spec: dialects.QueueSpec{Table: leaseTable(jobs), DeadLetterTable: long},
			Option: "DeadLetterTable", Reason: "at most 64"},
		{Name: "sqlite mode", Spec: dialects.QueueSpec{Table: with(func(t *dialects.Table) { t.Mode = dialects.Immediate })},
			Option: "Table.Mode", Reason: "SQLite transaction mode"},
		{Name: "dead-letter table is the queue", Spec: dialects.QueueSpec{Table: leaseTable(jobs), DeadLetterTable: strings.ToUpper(jobs)},
			Option: "DeadLetterTable", Reason: "queue table itself"},
	}
}
