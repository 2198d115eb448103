package outbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
	"github.com/rowactor/rowactor/outbox"
)

// database is one database the suite runs every case on. The test SQL is written with
// unquoted lower-case names and ? placeholders, which each database reads alike once
// PostgreSQL's are renumbered.
type database struct {
	name string
	// places names where a test's outbox and consumer databases are: two SQLite files in
	// the test's directory (a transactional consumer's write lock would otherwise hold the
	// outbox's stamps), the servers' test database otherwise.
	places func(t *testing.T) (outboxAt, consumerAt string)
	// openAt opens a dialect on a place, on a pool of its own; the caller closes it.
	openAt func(ctx context.Context, at string) (dialects.Dialect, error)
	// begin opens a transaction of the dialect's type.
	begin func(t *testing.T, d dialects.Dialect) (tx any, commit, rollback func() error)
	// txExec runs a statement in a transaction of the dialect's type.
	txExec func(ctx context.Context, tx any, query string, args ...any) error
	// exec runs a statement on the dialect's pool.
	exec func(d dialects.Dialect, query string, args ...any) error
	// ints runs a query whose every column is an integer and returns its rows.
	ints func(t *testing.T, d dialects.Dialect, query string, args ...any) [][]int64
}

func postgresURL() string {
	url := os.Getenv("ROWACTOR_POSTGRES_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	// Transactional deliveries hold a connection each; pgxpool's default is max(4, CPUs).
	if !strings.Contains(url, "pool_max_conns") {
		sep := "?"
		if strings.Contains(url, "?") {
			sep = "&"
		}
		url += sep + "pool_max_conns=12"
	}
	return url
}

func mysqlDSN() string {
	if dsn := os.Getenv("ROWACTOR_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	return "root@tcp(127.0.0.1:3306)/test?parseTime=true"
}

// dollars renumbers ? placeholders as $1..$n (the suite's statements hold no ? in
// literals).
func dollars(q string) string {
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
}

func sqlDB(d dialects.Dialect) *sql.DB {
	switch x := d.(type) {
	case *sqlite.Dialect:
		return x.DB()
	case *mysql.Dialect:
		return x.DB()
	}
	panic("not a database/sql dialect")
}

func sqlBegin(t *testing.T, d dialects.Dialect) (any, func() error, func() error) {
	tx, err := sqlDB(d).Begin()
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	return tx, tx.Commit, tx.Rollback
}

func sqlTxExec(ctx context.Context, tx any, q string, args ...any) error {
	_, err := tx.(*sql.Tx).ExecContext(ctx, q, args...)
	return err
}

func sqlExec(d dialects.Dialect, q string, args ...any) error {
	_, err := sqlDB(d).Exec(q, args...)
	return err
}

func sqlInts(t *testing.T, d dialects.Dialect, q string, args ...any) [][]int64 {
	t.Helper()
	rows, err := sqlDB(d).Query(q, args...)
	if err != nil {
		t.Fatalf("query %q: %v", q, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out [][]int64
	for rows.Next() {
		row := make([]int64, len(cols))
		dest := make([]any, len(cols))
		for i := range row {
			dest[i] = &row[i]
		}
		if err := rows.Scan(dest...); err != nil {
			t.Fatalf("query %q: %v", q, err)
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("query %q: %v", q, err)
	}
	return out
}

var databases = []database{
	{
		name: "sqlite",
		places: func(t *testing.T) (string, string) {
			dir := t.TempDir()
			return filepath.Join(dir, "outbox.db"), filepath.Join(dir, "consumer.db")
		},
		openAt: func(ctx context.Context, at string) (dialects.Dialect, error) { return sqlite.Open(ctx, at) },
		begin:  sqlBegin, txExec: sqlTxExec, exec: sqlExec, ints: sqlInts,
	},
	{
		name:   "postgres",
		places: func(*testing.T) (string, string) { return postgresURL(), postgresURL() },
		openAt: func(ctx context.Context, at string) (dialects.Dialect, error) {
			d, err := postgres.Open(ctx, at)
			if err != nil {
				return nil, fmt.Errorf("PostgreSQL must be up at ROWACTOR_POSTGRES_URL (%s): %w", at, err)
			}
			return d, nil
		},
		begin: func(t *testing.T, d dialects.Dialect) (any, func() error, func() error) {
			ctx := context.Background()
			tx, err := d.(*postgres.Dialect).Pool().Begin(ctx)
			if err != nil {
				t.Fatalf("begin: %v", err)
			}
			return tx, func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) }
		},
		txExec: func(ctx context.Context, tx any, q string, args ...any) error {
			if x, ok := tx.(pgx.Tx); ok {
				_, err := x.Exec(ctx, dollars(q), args...)
				return err
			}
			_, err := tx.(*sql.Tx).ExecContext(ctx, dollars(q), args...)
			return err
		},
		exec: func(d dialects.Dialect, q string, args ...any) error {
			_, err := d.(*postgres.Dialect).Pool().Exec(context.Background(), dollars(q), args...)
			return err
		},
		ints: func(t *testing.T, d dialects.Dialect, q string, args ...any) [][]int64 {
			t.Helper()
			rows, err := d.(*postgres.Dialect).Pool().Query(context.Background(), dollars(q), args...)
			if err != nil {
				t.Fatalf("query %q: %v", q, err)
			}
			defer rows.Close()
			var out [][]int64
			for rows.Next() {
				row := make([]int64, len(rows.FieldDescriptions()))
				dest := make([]any, len(row))
				for i := range row {
					dest[i] = &row[i]
				}
				if err := rows.Scan(dest...); err != nil {
					t.Fatalf("query %q: %v", q, err)
				}
				out = append(out, row)
			}
			if err := rows.Err(); err != nil {
				t.Fatalf("query %q: %v", q, err)
			}
			return out
		},
	},
	{
		name:   "mysql",
		places: func(*testing.T) (string, string) { return mysqlDSN(), mysqlDSN() },
		openAt: func(ctx context.Context, at string) (dialects.Dialect, error) {
			d, err := mysql.Open(ctx, at)
			if err != nil {
				return nil, fmt.Errorf("MySQL/MariaDB must be up at ROWACTOR_MYSQL_DSN: %w", err)
			}
			return d, nil
		},
		begin: sqlBegin, txExec: sqlTxExec, exec: sqlExec, ints: sqlInts,
	},
}

// env is one test's databases and the tables it made, dropped when it ends.
type env struct {
	t    *testing.T
	db   database
	obD  dialects.Dialect // the outbox's database
	conD dialects.Dialect // the consumer's database
	// obAt and conAt are where they are, for a child process to open them too.
	obAt, conAt string

	mu     sync.Mutex
	tables map[dialects.Dialect][]string
}

func newEnv(t *testing.T, db database) *env {
	e := &env{t: t, db: db, tables: map[dialects.Dialect][]string{}}
	e.obAt, e.conAt = db.places(t)
	open := func(at string) dialects.Dialect {
		d, err := db.openAt(context.Background(), at)
		if err != nil {
			t.Fatalf("open %s: %v", db.name, err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	e.obD, e.conD = open(e.obAt), open(e.conAt)
	// Registered after the pools' Close and before any relay or broker, so it runs after
	// those stopped and before the pools close.
	t.Cleanup(func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		for d, names := range e.tables {
			for _, n := range names {
				if err := db.exec(d, "DROP TABLE IF EXISTS "+n); err != nil {
					t.Errorf("drop table %s: %v", n, err)
				}
			}
		}
	})
	return e
}

// name returns a table name unique to this test run.
func (e *env) name(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// create runs a schema's statements on d and drops table at the end of the test.
func (e *env) create(d dialects.Dialect, table, ddl string) {
	e.t.Helper()
	e.mu.Lock()
	e.tables[d] = append(e.tables[d], table)
	e.mu.Unlock()
	for _, stmt := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if err := e.db.exec(d, stmt); err != nil {
			e.t.Fatalf("create %s: %q: %v", table, stmt, err)
		}
	}
}

// outboxTable creates an outbox table in the outbox's database from outbox.Schema.
func (e *env) outboxTable() outbox.Table {
	e.t.Helper()
	tb := outbox.Table{Name: e.name("ob"), ID: "id", Topic: "topic", Payload: "payload", Headers: "headers",
		SentAt: "sent_at", ProcessedAt: "processed_at"}
	ddl, err := outbox.Schema(e.obD, tb)
	if err != nil {
		e.t.Fatalf("outbox.Schema: %v", err)
	}
	e.create(e.obD, tb.Name, ddl)
	return tb
}

// newOutbox creates an outbox table and opens an Outbox on it.
func (e *env) newOutbox(opts ...outbox.Option) *outbox.Outbox {
	e.t.Helper()
	opts = append([]outbox.Option{outbox.WithLogger(testLogger(e.t))}, opts...)
	ob, err := outbox.New(context.Background(), e.obD, e.outboxTable(), opts...)
	if err != nil {
		e.t.Fatalf("outbox.New: %v", err)
	}
	e.t.Cleanup(func() { _ = ob.Close() })
	return ob
}

// queueTable creates a lease-form queue table with headers in the consumer's database.
func (e *env) queueTable() rowactor.Table {
	e.t.Helper()
	q := rowactor.Table{Name: e.name("q"), ID: "id", Payload: "payload", Group: "queue", Attempt: "attempt",
		RetryAfter: "retry_after", LockedUntil: "locked_until", Headers: "headers"}
	ddl, err := rowactor.Schema(e.conD, q)
	if err != nil {
		e.t.Fatalf("rowactor.Schema: %v", err)
	}
	e.create(e.conD, q.Name, ddl)
	return q
}

// consumerTables creates a dedupe table and an effects table (no key: an effect made
// twice shows as two rows) in the consumer's database.
func (e *env) consumerTables() (*outbox.Dedupe, string) {
	e.t.Helper()
	dt := outbox.DedupeTable{Name: e.name("seen"), ID: "record_id", SeenAt: "seen_at"}
	ddl, err := outbox.DedupeSchema(e.conD, dt)
	if err != nil {
		e.t.Fatalf("outbox.DedupeSchema: %v", err)
	}
	e.create(e.conD, dt.Name, ddl)
	dd, err := outbox.NewDedupe(context.Background(), e.conD, dt)
	if err != nil {
		e.t.Fatalf("outbox.NewDedupe: %v", err)
	}
	effects := e.name("effects")
	e.create(e.conD, effects, "CREATE TABLE "+effects+" (record_id BIGINT NOT NULL)")
	return dd, effects
}

// broker starts a broker on the consumer's database that tells ob of its settlements; it
// is shut down when the test ends unless the test did it.
func (e *env) broker(ob *outbox.Outbox) *rowactor.Broker {
	e.t.Helper()
	b, err := rowactor.New(e.conD, rowactor.WithOnSettled(ob.Settled))
	if err != nil {
		e.t.Fatalf("rowactor.New: %v", err)
	}
	e.t.Cleanup(func() { _, _ = b.Shutdown(context.Background()) })
	return b
}

// record writes one record in a transaction of its own and commits it (or rolls it back).
func (e *env) record(ob *outbox.Outbox, topic, payload string, commit bool) int64 {
	e.t.Helper()
	tx, commitTx, rollback := e.db.begin(e.t, e.obD)
	id, err := ob.Record(context.Background(), tx, topic, []byte(payload), map[string]string{"k": payload})
	if err != nil {
		_ = rollback()
		e.t.Fatalf("Record: %v", err)
	}
	if commit {
		err = commitTx()
	} else {
		err = rollback()
	}
	if err != nil {
		e.t.Fatalf("end the record's transaction: %v", err)
	}
	return id
}

// outboxRow is one outbox row as the table holds it.
type outboxRow struct {
	id              int64
	sent, processed bool
}

// rows reads the outbox table, in id order.
func (e *env) rows(ob *outbox.Outbox) []outboxRow {
	e.t.Helper()
	tb := ob.Table()
	var out []outboxRow
	for _, r := range e.db.ints(e.t, e.obD, "SELECT "+tb.ID+", CASE WHEN "+tb.SentAt+" IS NULL THEN 0 ELSE 1 END, "+
		"CASE WHEN "+tb.ProcessedAt+" IS NULL THEN 0 ELSE 1 END FROM "+tb.Name+" ORDER BY "+tb.ID) {
		out = append(out, outboxRow{id: r[0], sent: r[1] == 1, processed: r[2] == 1})
	}
	return out
}

// count runs a COUNT query.
func (e *env) count(d dialects.Dialect, q string, args ...any) int {
	e.t.Helper()
	rows := e.db.ints(e.t, d, q, args...)
	return int(rows[0][0])
}

// eventually polls cond until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testLogger logs through t.Log, shown when the test fails or with -v.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// stopAtCleanup stops r at the end of the test unless the test did.
func stopAtCleanup(t *testing.T, r *outbox.Relay) {
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
}
