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

// sqlRunner runs the tests' own statements on a dialect's pool.
var sqlRunner = dialecttest.SQLRunner{DB: dbOf}

func mustExec(t *testing.T, d *Dialect, query string, args ...any) {
	t.Helper()
	sqlRunner.Exec(t, d, query, args...)
}

// createTable creates the table Schema renders for tbl.
func createTable(t *testing.T, d *Dialect, tbl dialects.Table) {
	t.Helper()
	dialecttest.CreateTable(t, d, tbl, func(s string) { sqlRunner.Exec(t, d, s) })
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
	if !sqlRunner.QueryRow(t, d, query, args, &n) {
		t.Fatalf("%s: no row", query)
	}
	return n
}
