package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

var ctx, t0 = context.Background(), dialecttest.T0 // the suite's now, finer than a microsecond

func openFile(t *testing.T, path string) *Dialect {
	t.Helper()
	d, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func newDialect(t *testing.T) *Dialect {
	t.Helper()
	return openFile(t, filepath.Join(t.TempDir(), "queue.db"))
}

func mustExec(t *testing.T, d *Dialect, query string, args ...any) {
	t.Helper()
	if _, err := d.DB().ExecContext(ctx, query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// createTable creates the table Schema renders for tbl.
func createTable(t *testing.T, d *Dialect, tbl dialects.Table) {
	t.Helper()
	dialecttest.CreateTable(t, d, tbl, func(s string) { mustExec(t, d, s) })
}

var leaseTable = dialecttest.LeaseTable

// rowState is a row's state as stored; NULL reads as "NULL".
type rowState struct {
	Attempt     int
	LockedUntil string
	RetryAfter  string
	Group       string
}

func stateOf(t *testing.T, d *Dialect, table string, id int64) (rowState, bool) {
	t.Helper()
	var s rowState
	err := d.DB().QueryRowContext(ctx, "SELECT attempt, ifnull(locked_until, 'NULL'), ifnull(retry_after, 'NULL'), grp FROM `"+
		table+"` WHERE id = ?", id).Scan(&s.Attempt, &s.LockedUntil, &s.RetryAfter, &s.Group)
	if errors.Is(err, sql.ErrNoRows) {
		return s, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return s, true
}

func count(t *testing.T, d *Dialect, query string, args ...any) int {
	t.Helper()
	var n int
	if err := d.DB().QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}
