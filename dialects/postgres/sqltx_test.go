package postgres

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// lentFixture begins a pgx.Tx on a pool connection, as a transactional delivery does,
// and lends it as a *sql.Tx until the test calls end.
func lentFixture(t *testing.T) (d *Dialect, tx pgx.Tx, stx *sql.Tx, end func()) {
	t.Helper()
	d = newDialect(t)
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	stx, end = d.lend(tx)
	t.Cleanup(end)
	return d, tx, stx, end
}

// rowValues reads a query's one row as []any through database/sql.
func rowValues(t *testing.T, rows *sql.Rows, err error) []any {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	if !rows.Next() {
		t.Fatalf("no row: %v", rows.Err())
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		t.Fatal(err)
	}
	return vals
}

// A handler moving from MySQL or SQLite, or from pgx's stdlib driver, reads the same
// values through the lent *sql.Tx as through pgx's stdlib driver.
func TestLentSQLTxReadsValuesAsPgxStdlibDoes(t *testing.T) {
	d, _, stx, _ := lentFixture(t)
	const q = `SELECT 1::int2, 2::int4, 3::int8, 1.5::float4, 2.25::float8, 12.345::numeric,
		true, 'text'::text, 'vc'::varchar, '\x00ff'::bytea, '{"a": 1}'::json, '{"b": [2]}'::jsonb,
		'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, '2026-12-05'::date,
		'2026-12-05 10:11:12.345678'::timestamp, '2026-12-05 10:11:12.345678+02'::timestamptz,
		'infinity'::timestamptz, '-infinity'::date, '1 day 2 hours'::interval, ARRAY['x', 'y']::text[],
		NULL::int4, NULL::text, 42::oid, '<a/>'::xml`
	rows, err := stx.QueryContext(ctx, q)
	got := rowValues(t, rows, err)
	conn, err := d.SQLDB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rows, err = conn.QueryContext(ctx, q)
	want := rowValues(t, rows, err)
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("column %d: the lent *sql.Tx read %#v (%T), pgx's stdlib reads %#v (%T)", i+1, got[i], got[i], want[i], want[i])
		}
	}
}

// The *sql.Tx runs in the lent transaction: what it writes, the pgx.Tx sees before any
// commit, and what the pgx.Tx writes, it sees. Prepared statements run there too.
func TestLentSQLTxIsTheDeliverysTransaction(t *testing.T) {
	d, tx, stx, _ := lentFixture(t)
	name := tableName(t, d)
	mustExec(t, d, "CREATE TABLE "+quote(name)+" (id bigint PRIMARY KEY, v text NOT NULL)")
	if _, err := tx.Exec(ctx, "INSERT INTO "+quote(name)+" VALUES (1, 'pgx')"); err != nil {
		t.Fatal(err)
	}
	res, err := stx.ExecContext(ctx, "INSERT INTO "+quote(name)+" VALUES ($1, $2), ($3, $4)", 2, "sql", int64(3), "sql")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := res.RowsAffected(); n != 2 || err != nil {
		t.Fatalf("RowsAffected %d, %v; want 2", n, err)
	}
	stmt, err := stx.PrepareContext(ctx, "SELECT count(*) FROM "+quote(name)+" WHERE v = $1")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := stmt.QueryRowContext(ctx, "pgx").Scan(&n); err != nil || n != 1 {
		t.Fatalf("through the *sql.Tx the pgx.Tx's row counts %d (%v), want 1", n, err)
	}
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+quote(name)+" WHERE v = 'sql'").Scan(&n); err != nil || n != 2 {
		t.Fatalf("through the pgx.Tx the *sql.Tx's rows count %d (%v), want 2", n, err)
	}
	if got := count(t, d, "SELECT count(*) FROM "+quote(name)); got != 0 {
		t.Fatalf("another session sees %d rows before the commit, want 0", got)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := count(t, d, "SELECT count(*) FROM "+quote(name)); got != 3 {
		t.Fatalf("after the pgx.Tx's commit %d rows, want 3", got)
	}
	// The transaction is over: the *sql.Tx's statements fail rather than autocommit.
	if _, err := stx.ExecContext(ctx, "DELETE FROM "+quote(name)); !errors.Is(err, errNotInTx) {
		t.Fatalf("a statement after the commit: %v, want errNotInTx", err)
	}
}

// A handler cannot end the transaction it is lent: Commit and Rollback run nothing and
// say so, and the transaction goes on for the settlement to end.
func TestLentSQLTxRefusesTheHandlersCommitAndRollback(t *testing.T) {
	for _, end := range []string{"Commit", "Rollback"} {
		t.Run(end, func(t *testing.T) {
			d, tx, stx, _ := lentFixture(t)
			name := tableName(t, d)
			mustExec(t, d, "CREATE TABLE "+quote(name)+" (id bigint PRIMARY KEY)")
			if _, err := stx.ExecContext(ctx, "INSERT INTO "+quote(name)+" VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			var err error
			if end == "Commit" {
				err = stx.Commit()
			} else {
				err = stx.Rollback()
			}
			if !errors.Is(err, errLentEnd) {
				t.Fatalf("%s: %v, want errLentEnd", end, err)
			}
			if got := count(t, d, "SELECT count(*) FROM "+quote(name)); got != 0 {
				t.Fatalf("after the handler's %s another session sees %d rows, want 0", end, got)
			}
			if st := tx.Conn().PgConn().TxStatus(); st != 'T' {
				t.Fatalf("after the handler's %s the session's transaction status is %q, want 'T' (open)", end, st)
			}
			if _, err := stx.ExecContext(ctx, "SELECT 1"); !errors.Is(err, sql.ErrTxDone) {
				t.Fatalf("a statement after the handler's %s: %v, want sql.ErrTxDone", end, err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if got := count(t, d, "SELECT count(*) FROM "+quote(name)); got != 0 {
				t.Fatalf("after the settlement's rollback %d rows, want 0", got)
			}
		})
	}
}

// The lending's end waits for a statement in flight through the *sql.Tx and closes the
// rows a handler left open, so the session is free for the settlement; afterwards the
// *sql.Tx is done, and the transaction goes on.
func TestLentSQLTxEndWaitsForItsStatementsAndRows(t *testing.T) {
	d, tx, stx, end := lentFixture(t)
	name := tableName(t, d)
	mustExec(t, d, "CREATE TABLE "+quote(name)+" (id bigint PRIMARY KEY)")
	// A statement in flight: end waits for it.
	var pid int
	if err := stx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	slow := make(chan error, 1)
	go func() {
		_, err := stx.ExecContext(context.Background(), "SELECT pg_sleep(0.3)")
		slow <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); count(t, d, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND query LIKE 'SELECT pg_sleep%' AND state = 'active'", pid) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the statement never ran")
		}
	}
	// Rows left open, with most of their result unread: end closes them. (The rows run
	// after the statement: database/sql runs one call at a time on a connection.)
	rowsOpen := make(chan error, 1)
	go func() {
		rows, err := stx.QueryContext(context.Background(), "SELECT g FROM generate_series(1, 100000) g")
		if err == nil {
			rows.Next()
		}
		rowsOpen <- err
	}()
	end()
	// The session is the settlement's at once: a statement still running on it, or a
	// result left unread, would make this one fail ("conn busy").
	if _, err := tx.Exec(ctx, "INSERT INTO "+quote(name)+" VALUES (1)"); err != nil {
		t.Fatalf("the settlement's statement right after the end: %v", err)
	}
	if err := <-slow; err != nil {
		t.Fatalf("the statement in flight at the end: %v", err)
	}
	t.Logf("the query begun as the lending ended: %v", <-rowsOpen)
	if _, err := stx.ExecContext(ctx, "INSERT INTO "+quote(name)+" VALUES (2)"); !errors.Is(err, sql.ErrTxDone) {
		t.Fatalf("a statement through the *sql.Tx after the end: %v, want sql.ErrTxDone", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := count(t, d, "SELECT count(*) FROM "+quote(name)); got != 1 {
		t.Fatalf("%d rows committed, want the settlement's one", got)
	}
}

// A COMMIT run through the *sql.Tx ends the transaction behind rowactor's back: the
// statements after it are refused, never autocommitted.
func TestLentSQLTxRefusesStatementsAfterARawCommit(t *testing.T) {
	for _, end := range []string{"COMMIT", "ROLLBACK", "END", "ABORT"} {
		t.Run(end, func(t *testing.T) {
			d, _, stx, _ := lentFixture(t)
			name := tableName(t, d)
			mustExec(t, d, "CREATE TABLE "+quote(name)+" (id bigint PRIMARY KEY)")
			if _, err := stx.ExecContext(ctx, end); err != nil {
				t.Fatal(err)
			}
			if _, err := stx.ExecContext(ctx, "INSERT INTO "+quote(name)+" VALUES (1)"); !errors.Is(err, errNotInTx) {
				t.Fatalf("a write after %s: %v, want errNotInTx", end, err)
			}
			if _, err := stx.QueryContext(ctx, "SELECT 1"); !errors.Is(err, errNotInTx) {
				t.Fatalf("a query after %s: %v, want errNotInTx", end, err)
			}
			if got := count(t, d, "SELECT count(*) FROM "+quote(name)); got != 0 {
				t.Fatalf("a write after %s autocommitted (%d rows)", end, got)
			}
		})
	}
}

// A lending asked for after the dialect closed (an abandoned handler's first Tx after
// Shutdown) is a *sql.Tx done from the start.
func TestLentSQLTxAfterCloseIsDone(t *testing.T) {
	d := newDialect(t)
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	d.lent.close()
	stx, end := d.lend(tx)
	defer end()
	if stx == nil {
		t.Fatal("lend after close returned nil")
	}
	if _, err := stx.ExecContext(ctx, "SELECT 1"); !errors.Is(err, sql.ErrTxDone) {
		t.Fatalf("a statement through a lending after close: %v, want sql.ErrTxDone", err)
	}
}

// Column metadata reads as the values do.
func TestLentSQLTxColumnTypes(t *testing.T) {
	_, _, stx, _ := lentFixture(t)
	rows, err := stx.QueryContext(ctx, "SELECT 1::int4 AS a, 'x'::text AS b, 1.5::numeric AS c, now() AS d")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cts, err := rows.ColumnTypes()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ct := range cts {
		got = append(got, ct.Name()+" "+ct.DatabaseTypeName()+" "+ct.ScanType().String())
	}
	want := []string{"a INT4 int64", "b TEXT string", "c NUMERIC string", "d TIMESTAMPTZ time.Time"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("column types %q, want %q", got, want)
	}
}
