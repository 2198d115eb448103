package sqlite

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

// TestClassifyRealFaults produces each fault SQLite can have and checks its class, bare
// and wrapped the way the runtime wraps claim errors.
func TestClassifyRealFaults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "faults.db")
	d := openFile(t, path)
	mustExec(t, d, "CREATE TABLE jobs (id INTEGER PRIMARY KEY)")

	check := func(what string, err error, want dialects.Fault) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		for _, e := range []error{err, fmt.Errorf("claim leases: %w", err)} {
			if got := dialects.Classify(d, e); got != want {
				t.Errorf("%s: Classify(%v) = %v, want %v", what, e, got, want)
			}
		}
	}

	_, err := d.DB().ExecContext(ctx, "SELECT * FROM missing")
	check("missing table", err, dialects.FaultSchema)
	_, err = d.DB().ExecContext(ctx, "SELECT nope FROM jobs")
	check("missing column", err, dialects.FaultSchema)

	// A second handle on the file that finds the write lock taken, and does not wait.
	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	other.SetMaxOpenConns(1)
	holder, err := d.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer holder.ExecContext(ctx, "ROLLBACK")
	_, err = other.ExecContext(ctx, "INSERT INTO jobs VALUES (1)")
	check("busy file", err, dialects.FaultContention)
}
