package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

var ctx, t0 = context.Background(), dialecttest.T0 // the suite's now, finer than a microsecond

// testDSN is the server the tests run against. It must be reachable: the tests fail,
// never skip, without it.
func testDSN() string {
	return dialecttest.Env("ROWACTOR_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test?parseTime=true")
}

func newDialect(t *testing.T) *Dialect {
	t.Helper()
	d, err := Open(ctx, testDSN())
	if err != nil {
		t.Fatalf("the MySQL test server is unreachable (set ROWACTOR_MYSQL_DSN): %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

var tableSeq atomic.Int64

// tableName returns a table name unique to this run, dropped when the test ends.
func tableName(t *testing.T, d *Dialect, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s_%d_%d", prefix, time.Now().UnixNano()%1e9, tableSeq.Add(1))
	dropLater(t, name)
	return name
}

// dropLater drops the table when the test ends, on a connection of its own (the test's
// dialects may be closed by then), never waiting long for a lock.
func dropLater(t *testing.T, name string) {
	t.Cleanup(func() {
		db, err := sql.Open("mysql", testDSN())
		if err != nil {
			t.Errorf("drop %s: %v", name, err)
			return
		}
		defer db.Close()
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		conn, err := db.Conn(c)
		if err != nil {
			t.Errorf("drop %s: %v", name, err)
			return
		}
		defer conn.Close()
		if _, err := conn.ExecContext(c, "SET SESSION lock_wait_timeout = 10"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
		if _, err := conn.ExecContext(c, "DROP TABLE IF EXISTS "+quote(name)); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
}

func mustExec(t *testing.T, db *sql.DB, query string, args ...any) sql.Result {
	t.Helper()
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return res
}

// createTable creates the table Schema renders for tbl.
func createTable(t *testing.T, d *Dialect, tbl dialects.Table) {
	t.Helper()
	dialecttest.CreateTable(t, d, tbl, func(s string) { mustExec(t, d.DB(), s) })
}

var leaseTable, rowLockTable = dialecttest.LeaseTable, dialecttest.RowLockTable

// newTable creates a fresh table of shape (given its unique name) and returns its
// description.
func newTable(t *testing.T, d *Dialect, prefix string, shape func(string) dialects.Table) dialects.Table {
	t.Helper()
	tbl := shape(tableName(t, d, prefix))
	createTable(t, d, tbl)
	return tbl
}

// rowState is a row as stored; NULL times are nil.
type rowState = dialecttest.RowState

// stateOf reads the columns a description names (unnamed ones read as zero).
func stateOf(t *testing.T, d *Dialect, tbl dialects.Table, id int64) (rowState, bool) {
	t.Helper()
	return dialecttest.ReadState(t, d.DB(), quote, tbl, id, func(n sql.NullTime) *time.Time {
		if !n.Valid {
			return nil
		}
		return &n.Time
	})
}

func count(t *testing.T, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// sameTime fails unless got is exactly want (to the microsecond DATETIME(6) keeps).
func sameTime(t *testing.T, what string, got *time.Time, want time.Time) {
	t.Helper()
	if got == nil {
		t.Errorf("%s is NULL, want %v", what, want)
		return
	}
	if !got.Equal(dbTime(want)) || got.Location() != time.UTC {
		t.Errorf("%s = %v, want exactly %v", what, got, dbTime(want))
	}
}

// connectionAlive reports whether a server session with this id still exists.
func connectionAlive(t *testing.T, db *sql.DB, id int64) bool {
	t.Helper()
	return count(t, db, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", id) > 0
}

// waitGone waits for the server to end the session (a closed connection's COM_QUIT is
// handled asynchronously).
func waitGone(t *testing.T, db *sql.DB, id int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for connectionAlive(t, db, id) {
		if time.Now().After(deadline) {
			t.Fatalf("server session %d still alive", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
