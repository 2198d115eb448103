package sqlite

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

func TestOpenRefuses(t *testing.T) {
	d := newDialect(t)
	createTable(t, d, leaseTable("jobs"))
	mustExec(t, d, "CREATE TABLE dead (id INTEGER PRIMARY KEY, payload BLOB, grp TEXT, attempt INTEGER, retry_after TEXT, locked_until TEXT)")

	missingCol := leaseTable("jobs")
	missingCol.ProcessedAt = "done_at"
	rowLock := leaseTable("jobs")
	rowLock.LockedUntil = ""
	isolation := leaseTable("jobs")
	isolation.Isolation = dialects.ReadCommitted
	clock := leaseTable("jobs")
	clock.DatabaseClock = true
	noGroup := leaseTable("jobs")
	noGroup.Group = ""

	cases := []struct {
		name   string
		spec   dialects.QueueSpec
		column string
		option string
		reason string
	}{
		{"missing column", dialects.QueueSpec{Table: missingCol}, "done_at", "Table.ProcessedAt", "no such column"},
		{"row lock", dialects.QueueSpec{Table: rowLock}, "", "Table.LockedUntil", "SQLite has no row locks"},
		{"isolation", dialects.QueueSpec{Table: isolation}, "", "Table.Isolation", "isolation"},
		{"database clock", dialects.QueueSpec{Table: clock}, "", "Table.DatabaseClock", "host"},
		{"missing table", dialects.QueueSpec{Table: leaseTable("nope")}, "", "", "does not exist"},
		{"dead-letter table missing", dialects.QueueSpec{Table: leaseTable("jobs"), DeadLetterTable: "graveyard"},
			"", "DeadLetterTable", `"graveyard" does not exist`},
		{"dead-letter table lacks a column", dialects.QueueSpec{Table: leaseTable("jobs"), DeadLetterTable: "dead"},
			"headers", "DeadLetterTable", `dead-letter table "dead" has no column "headers"`},
		{"dead-letter group without group", dialects.QueueSpec{Table: noGroup, DeadLetterGroup: "dead"},
			"", "DeadLetterGroup", "group column"},
		{"both dead letters", dialects.QueueSpec{Table: leaseTable("jobs"), DeadLetterGroup: "dead", DeadLetterTable: "dead"},
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
				t.Errorf("table %q column %q option %q; want %q %q %q", ce.Table, ce.Column, ce.Option,
					c.spec.Table.Name, c.column, c.option)
			}
			contains(t, err.Error(), c.reason)
		})
	}
}

func TestOpenFoldsCase(t *testing.T) {
	d := newDialect(t)
	createTable(t, d, leaseTable("jobs"))
	tbl := leaseTable("JOBS")
	tbl.ID, tbl.LockedUntil = "ID", "Locked_Until"
	openLease(t, d, dialects.QueueSpec{Table: tbl})
}

func TestOpenRequiresAFile(t *testing.T) {
	for _, p := range []string{"", ":memory:", "file:x.db"} {
		if d, err := Open(ctx, p); err == nil {
			d.Close()
			t.Errorf("Open(%q) succeeded", p)
		}
	}
}

func TestOpenPragmas(t *testing.T) {
	d := newDialect(t)
	var mode string
	var busy, sync int
	db := d.DB()
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" || busy != 10000 || sync != 1 {
		t.Errorf("journal_mode %s, busy_timeout %d, synchronous %d", mode, busy, sync)
	}
}

func TestOpenOddPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a?b#c%20d.db")
	d := openFile(t, path)
	mustExec(t, d, "CREATE TABLE x (id INTEGER)")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the database is not at %s: %v", path, err)
	}
}
