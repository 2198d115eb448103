package sqlite

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

func TestOpenFoldsCase(t *testing.T) {
	d := newDialect(t)
	createTable(t, d, leaseTable("jobs"))
	tbl := leaseTable("JOBS")
	tbl.ID, tbl.LockedUntil = "ID", "Locked_Until"
	dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl})
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

// Refusals: SQLite has no row locks and no isolation levels to choose.
func (*harness) Refusals(t *testing.T, d dialects.Dialect, jobs, dead string) []dialecttest.Refusal {
	rowLock := leaseTable(jobs)
	rowLock.LockedUntil = ""
	isolation := leaseTable(jobs)
	isolation.Isolation = dialects.ReadCommitted
	return []dialecttest.Refusal{
		{Name: "row lock", Spec: dialects.QueueSpec{Table: rowLock}, Option: "Table.LockedUntil", Reason: "SQLite has no row locks"},
		{Name: "isolation", Spec: dialects.QueueSpec{Table: isolation}, Option: "Table.Isolation", Reason: "isolation"},
	}
}
