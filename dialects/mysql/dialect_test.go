package mysql

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

func TestParseVersion(t *testing.T) {
	cases := []struct {
		text    string
		want    version
		refused bool
	}{
		{"10.5.23-MariaDB", version{10, 5, 23, true}, true},
		{"10.11.19-MariaDB-0+deb12u1", version{10, 11, 19, true}, false},
		{"10.6.0-MariaDB", version{10, 6, 0, true}, false},
		{"5.5.5-10.11.2-MariaDB-log", version{10, 11, 2, true}, false},
		{"5.5.5-10.4.2-MariaDB", version{10, 4, 2, true}, true},
		{"11.4.2-MariaDB-ubu2404", version{11, 4, 2, true}, false},
		{"8.0.0", version{8, 0, 0, false}, true},
		{"8.0.1", version{8, 0, 1, false}, false},
		{"8.0.36", version{8, 0, 36, false}, false},
		{"8.4.0-log", version{8, 4, 0, false}, false},
		{"5.7.44-log", version{5, 7, 44, false}, true},
		{"9.1", version{9, 1, 0, false}, false},
	}
	for _, c := range cases {
		got, err := parseVersion(c.text)
		if err != nil {
			t.Errorf("parseVersion(%q): %v", c.text, err)
			continue
		}
		if got != c.want {
			t.Errorf("parseVersion(%q) = %+v, want %+v", c.text, got, c.want)
		}
		ferr := got.atLeastFloor()
		if (ferr != nil) != c.refused {
			t.Errorf("%q: floor error %v, want refused=%v", c.text, ferr, c.refused)
		}
		if ferr != nil {
			dialecttest.Contains(t, ferr.Error(), got.String())
			if c.want.mariadb {
				dialecttest.Contains(t, ferr.Error(), "MariaDB 10.6.0")
			} else {
				dialecttest.Contains(t, ferr.Error(), "MySQL 8.0.1")
			}
		}
	}
	for _, bad := range []string{"", "MariaDB", "v8.0.1", "8"} {
		if v, err := parseVersion(bad); err == nil {
			t.Errorf("parseVersion(%q) = %+v, want an error", bad, v)
		}
	}
}

func TestOpenFailsLoudlyWhenUnreachable(t *testing.T) {
	d, err := Open(ctx, "root@tcp(127.0.0.1:1)/test?timeout=1s")
	if err == nil {
		d.Close()
		t.Fatal("Open reached a server on port 1")
	}
	if strings.Contains(err.Error(), "root@") {
		t.Errorf("the error echoes the DSN: %v", err)
	}
}

func TestOpenAddsParseTimeAndUTC(t *testing.T) {
	cfg, err := mysql.ParseDSN(testDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ParseTime = false
	d, err := Open(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var tm sql.NullTime
	if err := d.DB().QueryRowContext(ctx, "SELECT CAST('2001-02-03 04:05:06.5' AS DATETIME(6))").Scan(&tm); err != nil {
		t.Fatalf("Open did not add parseTime: %v", err)
	}
	if tm.Time.Location().String() != "UTC" || tm.Time.Hour() != 4 {
		t.Errorf("scanned %v", tm.Time)
	}
}

// A pool handed to New is checked when its first queue or publisher opens.
func TestNewChecksThePool(t *testing.T) {
	base := newDialect(t)
	tbl := newTable(t, base, "ra_new", leaseTable)
	cfg, err := mysql.ParseDSN(testDSN())
	if err != nil {
		t.Fatal(err)
	}

	noParse := cfg.Clone()
	noParse.ParseTime = false
	paris := cfg.Clone()
	paris.ParseTime = true
	paris.Loc = time.FixedZone("CET", 3600)
	for _, c := range []struct {
		name   string
		cfg    *mysql.Config
		option string
	}{
		{"without parseTime", noParse, "DSN parseTime"},
		{"loc not UTC", paris, "DSN loc"},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := mysql.NewConnector(c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(conn)
			defer db.Close()
			d := New(db)
			_, err = d.Open(ctx, dialects.QueueSpec{Table: tbl})
			ce := dialecttest.ConfigError(t, err)
			if ce.Option != c.option || ce.Table != tbl.Name {
				t.Errorf("option %q table %q: %v", ce.Option, ce.Table, err)
			}
			if _, err := d.Publisher(ctx, tbl); err == nil {
				t.Error("Publisher accepted the pool")
			}
		})
	}
}

func TestNewOnTheCallersPool(t *testing.T) {
	db, err := sql.Open("mysql", testDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d := New(db)
	// An unlimited pool has a budget too (it follows a limit set later), with no limit.
	unlimited := d.Limits()
	if unlimited.Budget == nil {
		t.Fatal("an unlimited pool has no budget: a limit set later would not be followed")
	}
	unlimited.Budget = nil
	if d.DB() != db || d.Name() != "mysql" || unlimited != (dialects.Limits{SessionConnections: true}) {
		t.Fatalf("accessors: %+v", unlimited)
	}
	// A limited pool's connections are one Budget per pool, shared by its subscriptions.
	budget := func(l dialects.Limits) dialects.Limits {
		t.Helper()
		if l.Budget == nil || l.Budget != dialects.BudgetFor(db, l.Connections) {
			t.Errorf("limits %+v: not the pool's budget", l)
		}
		l.Budget = nil
		return l
	}
	db.SetMaxOpenConns(8)
	if got := d.Limits(); budget(got) != (dialects.Limits{Connections: 7, SessionConnections: true}) {
		t.Errorf("limits with 8 connections: %+v", got)
	}
	db.SetMaxOpenConns(1)
	if got := d.Limits(); budget(got) != (dialects.Limits{Connections: 1, SessionConnections: true}) {
		t.Errorf("limits with 1 connection: %+v", got)
	}
	db.SetMaxOpenConns(0)
	// Closing leaves the pool to the caller: TestConformance/admin/NewLeavesThePoolToTheCaller.
}

func TestDiscardClosesTheConnection(t *testing.T) {
	d := newDialect(t)
	db := d.DB()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	// A session variable shows whether the same session came back from the pool.
	if _, err := conn.ExecContext(ctx, "SET @rowactor_mark = 1"); err != nil {
		t.Fatal(err)
	}
	open := db.Stats().OpenConnections
	discard(conn)
	if got := db.Stats().OpenConnections; got != open-1 {
		t.Errorf("open connections %d after discard, want %d", got, open-1)
	}
	waitGone(t, db, id)
	if n := count(t, db, "SELECT COUNT(@rowactor_mark)"); n != 0 {
		t.Error("the discarded session came back from the pool")
	}
}

// OnCallerPool: New on a *sql.DB of the test's own.
func (harness) OnCallerPool(t *testing.T) (dialects.Dialect, func() error) {
	db, err := sql.Open("mysql", testDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return New(db), func() error { return db.PingContext(ctx) }
}
