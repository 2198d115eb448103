package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
	"github.com/rowactor/rowactor/internal/pgwarm"
)

var ctx, t0 = context.Background(), dialecttest.T0 // the suite's now, finer than a microsecond

// testURL is the server the tests run on. They fail, never skip, when it is unreachable.
func testURL() string {
	return dialecttest.Env("ROWACTOR_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// withParams adds connection parameters to a URL.
func withParams(url string, params ...string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + strings.Join(params, "&")
}

func openURL(t *testing.T, url string) *Dialect {
	t.Helper()
	d, err := Open(ctx, url)
	if err != nil {
		t.Fatalf("PostgreSQL at %s is unreachable: %v", url, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// newDialect returns a dialect on a warm pool of eight (internal/pgwarm): a new session
// costs the test server about 40 ms of CPU.
func newDialect(t *testing.T) *Dialect {
	t.Helper()
	url := withParams(testURL(), "pool_max_conns=8")
	pool, err := pgwarm.Take(ctx, url)
	if err != nil {
		t.Fatalf("PostgreSQL at %s is unreachable: %v", url, err)
	}
	d := New(pool)
	t.Cleanup(func() {
		_ = d.Close()
		pgwarm.Give(t, pool)
	})
	return d
}

// tableName returns a name no other test (or earlier run) uses, and drops the table
// when the test ends.
func tableName(t *testing.T, d *Dialect) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := "rapg_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := d.Pool().Exec(cctx, "DROP TABLE IF EXISTS "+quote(name)); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	return name
}

func mustExec(t *testing.T, d *Dialect, query string, args ...any) {
	t.Helper()
	if _, err := d.Pool().Exec(ctx, query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// createTable creates the table Schema renders for tbl.
func createTable(t *testing.T, d *Dialect, tbl dialects.Table) {
	t.Helper()
	dialecttest.CreateTable(t, d, tbl, func(s string) { mustExec(t, d, s) })
}

var leaseTable, rowLockTable = dialecttest.LeaseTable, dialecttest.RowLockTable

// rowState is a row's state as stored; NULL times are nil.
type rowState = dialecttest.RowState

// stateOf reads the columns a description names (NULL for the others).
func stateOf(t *testing.T, d *Dialect, tbl dialects.Table, id int64) (rowState, bool) {
	t.Helper()
	col := func(name, typ string) string {
		if name == "" {
			return "NULL::" + typ
		}
		return quote(name)
	}
	var s rowState
	var attempt *int64
	var group *string
	err := d.Pool().QueryRow(ctx, "SELECT "+col(tbl.Attempt, "int")+", "+col(tbl.Group, "text")+", "+
		col(tbl.LockedUntil, "timestamptz")+", "+col(tbl.RetryAfter, "timestamptz")+", "+col(tbl.ProcessedAt, "timestamptz")+
		" FROM "+quote(tbl.Name)+" WHERE "+quote(tbl.ID)+" = $1", id).
		Scan(&attempt, &group, &s.LockedUntil, &s.RetryAfter, &s.ProcessedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, false
	}
	if err != nil {
		t.Fatal(err)
	}
	if attempt != nil {
		s.Attempt = int(*attempt)
	}
	if group != nil {
		s.Group = *group
	}
	return s, true
}

func count(t *testing.T, d *Dialect, query string, args ...any) int {
	t.Helper()
	var n int
	if err := d.Pool().QueryRow(ctx, query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// micro is t as the server stores it.
func micro(t time.Time) time.Time { return t.Truncate(time.Microsecond) }

func sameTime(a *time.Time, b time.Time) bool { return a != nil && a.Equal(micro(b)) }

func tableNameSuffix(t *testing.T) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

var sameState = dialecttest.SameState
