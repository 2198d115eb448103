package mysql

import (
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

func TestOpenRefuses(t *testing.T) {
	d := newDialect(t)
	jobs := newTable(t, d, "ra_val", leaseTable).Name
	dead := tableName(t, d, "ra_val_dead")
	mustExec(t, d.DB(), "CREATE TABLE "+quote(dead)+" (id BIGINT PRIMARY KEY, payload LONGBLOB, grp VARCHAR(191), attempt SMALLINT, retry_after DATETIME(6), locked_until DATETIME(6))")

	with := func(edit func(*dialects.Table)) dialects.Table {
		tbl := leaseTable(jobs)
		edit(&tbl)
		return tbl
	}
	long := strings.Repeat("c", 65)
	cases := []struct {
		name   string
		spec   dialects.QueueSpec
		column string
		option string
		reason string
	}{
		{"missing column", dialects.QueueSpec{Table: with(func(t *dialects.Table) { t.ProcessedAt = "done_at" })},
			"done_at", "Table.ProcessedAt", "no such column"},
		{"missing key column", dialects.QueueSpec{Table: with(func(t *dialects.Table) { t.LockedUntil = ""; t.AdvisoryKey = "k-{account}" })},
			"account", "Table.AdvisoryKey", "no such column"},
		{"missing table", dialects.QueueSpec{Table: leaseTable("ra_val_nope")}, "", "", "does not exist"},
		{"table name too long", dialects.QueueSpec{Table: leaseTable(strings.Repeat("t", 65))}, "", "Table.Name", "at most 64"},
		{"column name too long", dialects.QueueSpec{Table: with(func(t *dialects.Table) { t.Headers = long })},
			long, "Table.Headers", "at most 64"},
		{"dead-letter name too long", dialects.QueueSpec{Table: leaseTable(jobs), DeadLetterTable: long},
			"", "DeadLetterTable", "at most 64"},
		{"sqlite mode", dialects.QueueSpec{Table: with(func(t *dialects.Table) { t.Mode = dialects.Immediate })},
			"", "Table.Mode", "SQLite transaction mode"},
		{"database clock", dialects.QueueSpec{Table: with(func(t *dialects.Table) { t.DatabaseClock = true })},
			"", "Table.DatabaseClock", "host"},
		{"dead-letter table missing", dialects.QueueSpec{Table: leaseTable(jobs), DeadLetterTable: "ra_val_graveyard"},
			"", "DeadLetterTable", `"ra_val_graveyard" does not exist`},
		{"dead-letter table lacks a column", dialects.QueueSpec{Table: leaseTable(jobs), DeadLetterTable: dead},
			"headers", "DeadLetterTable", `has no column "headers"`},
		{"dead-letter table is the queue", dialects.QueueSpec{Table: leaseTable(jobs), DeadLetterTable: strings.ToUpper(jobs)},
			"", "DeadLetterTable", "queue table itself"},
		{"dead-letter group without group", dialects.QueueSpec{Table: with(func(t *dialects.Table) { t.Group = "" }), DeadLetterGroup: "dead"},
			"", "DeadLetterGroup", "group column"},
		{"both dead letters", dialects.QueueSpec{Table: leaseTable(jobs), DeadLetterGroup: "dead", DeadLetterTable: dead},
			"", "DeadLetterTable", "not both"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q, err := d.Open(ctx, c.spec)
			if err == nil {
				q.Close()
				t.Fatal("Open accepted the spec")
			}
			ce := configError(t, err)
			if ce.Table != c.spec.Table.Name || ce.Column != c.column || ce.Option != c.option {
				t.Errorf("table %q column %q option %q; want %q %q %q (%v)", ce.Table, ce.Column, ce.Option,
					c.spec.Table.Name, c.column, c.option, err)
			}
			contains(t, err.Error(), c.reason)
		})
	}
}

// MySQL compares column names without case; every isolation level opens; each form is
// served.
func TestOpenAccepts(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_acc", leaseTable)
	folded := tbl
	folded.ID, folded.LockedUntil, folded.Payload = "ID", "Locked_Until", "PAYLOAD"
	openLease(t, d, dialects.QueueSpec{Table: folded})

	rowLock := tbl
	rowLock.LockedUntil = ""
	for _, level := range []dialects.Isolation{"", dialects.ReadUncommitted, dialects.ReadCommitted, dialects.RepeatableRead, dialects.Serializable} {
		rl := rowLock
		rl.Isolation = level
		openRowLock(t, d, dialects.QueueSpec{Table: rl, Group: "g"})
	}
	adv := rowLock
	adv.AdvisoryKey = "jobs-{id}-{GRP}"
	openAdvisory(t, d, dialects.QueueSpec{Table: adv, Group: "g", DeadLetterGroup: "dead"})

	// A dead-letter table with the queue's columns, any case.
	dead := tableName(t, d, "ra_acc_dead")
	mustExec(t, d.DB(), "CREATE TABLE "+quote(dead)+" (ID BIGINT PRIMARY KEY, PAYLOAD LONGBLOB, GRP VARCHAR(191), ATTEMPT SMALLINT, "+
		"RETRY_AFTER DATETIME(6), LOCKED_UNTIL DATETIME(6), HEADERS JSON)")
	openLease(t, d, dialects.QueueSpec{Table: tbl, DeadLetterTable: dead})
}

// Odd identifiers are quoted everywhere.
func TestOddIdentifiers(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d, "ra_odd`q")
	tbl := dialects.Table{Name: name, ID: "i`d", Payload: "pay load", Group: "group", Attempt: "select",
		RetryAfter: "retry-after", LockedUntil: "locked`until", Headers: "order"}
	createTable(t, d, tbl)
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
	id := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p"), Headers: []byte(`{}`)})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 || rows[0].ID != id {
		t.Fatalf("claim %v %v", rows, err)
	}
	ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, dialects.Lease{ID: id, Token: rows[0].Token})
	if !ok || err != nil {
		t.Fatalf("dead letter: %v %v", ok, err)
	}
}
