package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// TestMain fails the package if a goroutine outlives the tests: every command shuts its
// broker down and closes its database.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreCurrent())
}

var ctx = context.Background()

// database is one server the tests run on, with what the test fixtures need to know of
// it (the command under test asks its dialect for everything else).
type database struct {
	name  string // rowactor.Open's scheme, and schema's -db
	forms []rowactor.Form
	// dsn returns a DSN for rowactor.Open and -dsn. The servers must be up: the tests
	// fail, never skip, without them.
	dsn func(t *testing.T) string
	// sqlDB is the broker's pool as a *sql.DB for the fixtures' plain SQL, and whether
	// that *sql.DB is the fixture's to close (a view of a pgx pool is; a dialect's own
	// pool closes with its broker).
	sqlDB func(d dialects.Dialect) (db *sql.DB, closeIt bool)
	quote func(name string) string
	// rebind turns ? placeholders into the database's.
	rebind func(query string) string
	// timeArg is how the database takes a time (SQLite: fixed-width UTC text).
	timeArg func(t time.Time) any
	// holdKey holds an advisory key on a connection of its own until the test ends;
	// nil where keys live in the consuming process (SQLite).
	holdKey func(t *testing.T, db *sql.DB, key string)
}

func postgresURL() string {
	if u := os.Getenv("ROWACTOR_POSTGRES_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

func mysqlDSN() string {
	if dsn := os.Getenv("ROWACTOR_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	return "root@tcp(127.0.0.1:3306)/test?parseTime=true"
}

func backtick(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

var databases = []database{
	{
		name:  "sqlite",
		forms: []rowactor.Form{rowactor.FormLease, rowactor.FormAdvisory},
		dsn: func(t *testing.T) string {
			path := filepath.Join(t.TempDir(), "queue.db")
			if err := os.WriteFile(path, nil, 0o600); err != nil { // the command opens only files that exist
				t.Fatal(err)
			}
			return "sqlite:" + path
		},
		sqlDB:   func(d dialects.Dialect) (*sql.DB, bool) { return d.(*sqlite.Dialect).DB(), false },
		quote:   backtick,
		rebind:  func(q string) string { return q },
		timeArg: func(t time.Time) any { return t.UTC().Format(sqlite.TimeLayout) },
	},
	{
		name:  "postgres",
		forms: []rowactor.Form{rowactor.FormRowLock, rowactor.FormLease, rowactor.FormAdvisory},
		dsn:   func(*testing.T) string { return postgresURL() },
		sqlDB: func(d dialects.Dialect) (*sql.DB, bool) {
			return stdlib.OpenDBFromPool(d.(*postgres.Dialect).Pool()), true
		},
		quote: func(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` },
		rebind: func(q string) string {
			var b strings.Builder
			n := 0
			for _, r := range q {
				if r == '?' {
					n++
					b.WriteString("$" + strconv.Itoa(n))
					continue
				}
				b.WriteRune(r)
			}
			return b.String()
		},
		timeArg: func(t time.Time) any { return t },
		holdKey: func(t *testing.T, db *sql.DB, key string) {
			t.Helper()
			conn := dedicated(t, db, "SELECT pg_advisory_unlock_all()")
			if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", key); err != nil {
				t.Fatal(err)
			}
		},
	},
	{
		name:    "mysql",
		forms:   []rowactor.Form{rowactor.FormRowLock, rowactor.FormLease, rowactor.FormAdvisory},
		dsn:     func(*testing.T) string { return "mysql://" + mysqlDSN() },
		sqlDB:   func(d dialects.Dialect) (*sql.DB, bool) { return d.(*mysql.Dialect).DB(), false },
		quote:   backtick,
		rebind:  func(q string) string { return q },
		timeArg: func(t time.Time) any { return t.UTC().Truncate(time.Microsecond) },
		holdKey: func(t *testing.T, db *sql.DB, key string) {
			t.Helper()
			conn := dedicated(t, db, "SELECT RELEASE_ALL_LOCKS()")
			var name string
			if err := conn.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name); err != nil {
				t.Fatal(err)
			}
			var got int
			if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", mysql.LockName(name, key)).Scan(&got); err != nil || got != 1 {
				t.Fatalf("GET_LOCK %s: %d, %v", key, got, err)
			}
		},
	},
}

// dedicated takes a connection of its own, which runs release before it returns to the
// pool when the test ends.
func dedicated(t *testing.T, db *sql.DB, release string) *sql.Conn {
	t.Helper()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := conn.ExecContext(ctx, release); err != nil {
			t.Errorf("%s: %v", release, err)
		}
		conn.Close()
	})
	return conn
}

// fixture is a broker on one database, for publishing and plain SQL, and the DSN the
// command under test is given.
type fixture struct {
	t   *testing.T
	db  database
	dsn string
	b   *rowactor.Broker
	sql *sql.DB
}

func newFixture(t *testing.T, db database) *fixture {
	t.Helper()
	dsn := db.dsn(t)
	b, err := rowactor.Open(ctx, dsn, rowactor.WithPollOnly())
	if err != nil {
		t.Fatalf("rowactor.Open on %s (the server must be up; the tests never skip): %v", db.name, err)
	}
	t.Cleanup(func() {
		if _, err := b.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	sqlDB, closeIt := db.sqlDB(b.Dialect())
	if closeIt {
		t.Cleanup(func() { sqlDB.Close() })
	}
	return &fixture{t: t, db: db, dsn: dsn, b: b, sql: sqlDB}
}

// tableName returns a name no other test (or earlier run) uses; the table is dropped
// when the test ends.
func (f *fixture) tableName(prefix string) string {
	f.t.Helper()
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		f.t.Fatal(err)
	}
	name := prefix + hex.EncodeToString(b[:])
	f.t.Cleanup(func() {
		if _, err := f.sql.ExecContext(ctx, "DROP TABLE IF EXISTS "+f.db.quote(name)); err != nil {
			f.t.Errorf("drop %s: %v", name, err)
		}
	})
	return name
}

// create creates the table rowactor.Schema renders for tb.
func (f *fixture) create(tb rowactor.Table) {
	f.t.Helper()
	ddl, err := rowactor.Schema(f.b.Dialect(), tb)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, s := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(s) != "" {
			f.exec(s)
		}
	}
}

func (f *fixture) exec(query string, args ...any) {
	f.t.Helper()
	if _, err := f.sql.ExecContext(ctx, f.db.rebind(query), args...); err != nil {
		f.t.Fatalf("%s: %v", query, err)
	}
}

func (f *fixture) publish(tb rowactor.Table, group, payload string, opts ...rowactor.PublishOption) int64 {
	f.t.Helper()
	id, err := f.b.Publish(ctx, tb, group, []byte(payload), opts...)
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

// set sets one column of row id (a time column when v is a time.Time).
func (f *fixture) set(tb rowactor.Table, id int64, column string, v any) {
	f.t.Helper()
	if tv, ok := v.(time.Time); ok {
		v = f.db.timeArg(tv)
	}
	f.exec("UPDATE "+f.db.quote(tb.Name)+" SET "+f.db.quote(column)+" = ? WHERE "+f.db.quote(tb.ID)+" = ?", v, id)
}

// row is a row's described columns as text ("<nil>" for NULL), by role.
type row map[string]string

// rows reads every row of table (described like tb) by id.
func (f *fixture) rows(tb rowactor.Table, table string) map[int64]row {
	f.t.Helper()
	cols := tb.DistinctColumns(true)
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = f.db.quote(c.Name)
	}
	rs, err := f.sql.QueryContext(ctx, "SELECT "+strings.Join(names, ", ")+" FROM "+f.db.quote(table))
	if err != nil {
		f.t.Fatal(err)
	}
	defer rs.Close()
	out := map[int64]row{}
	for rs.Next() {
		vals := make([]sql.NullString, len(cols))
		dest := make([]any, len(cols))
		for i := range vals {
			dest[i] = &vals[i]
		}
		if err := rs.Scan(dest...); err != nil {
			f.t.Fatal(err)
		}
		r := row{}
		for i, c := range cols {
			r[c.Role] = "<nil>"
			if vals[i].Valid {
				r[c.Role] = vals[i].String
			}
		}
		id, err := strconv.ParseInt(r["ID"], 10, 64)
		if err != nil {
			f.t.Fatal(err)
		}
		out[id] = r
	}
	if err := rs.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// cli runs the command line and returns its exit status, stdout and stderr.
func cli(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// columnFlags are the column flags describing tb.
func columnFlags(tb rowactor.Table) []string {
	var args []string
	for _, fl := range tableFlags {
		if v := *fl.field(&tb); v != "" {
			args = append(args, "-"+fl.flag+"="+v)
		}
	}
	return args
}
