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
// and lends it as a *sql.Tx under a context the test ends.
func lentFixture(t *testing.T) (d *Dialect, tx pgx.Tx, stx *sql.Tx, endLending context.CancelFunc) {
	t.Helper()
	d = newDialect(t)
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	lctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	return d, tx, d.lend(lctx, tx), cancel
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
	// The transaction is over: the *sql.Tx's statements fail.
	if _, err := stx.ExecContext(ctx, "DELETE FROM "+quote(name)); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("a statement after the commit: %v, want pgx.ErrTxClosed", err)
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

// The lending ends with its context: the *sql.Tx is done, nothing of the transaction is
// ended, and a lending asked for under an ended context is done from the start.
func TestLentSQLTxEndsWithItsContext(t *testing.T) {
	d, tx, stx, endLending := lentFixture(t)
	name := tableName(t, d)
	mustExec(t, d, "CREATE TABLE "+quote(name)+" (id bigint PRIMARY KEY)")
	if _, err := stx.ExecContext(ctx, "INSERT INTO "+quote(name)+" VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	endLending()
	// database/sql ends the *sql.Tx from a goroutine of its own once the context ended.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		_, err := stx.ExecContext(context.Background(), "SELECT 1")
		if errors.Is(err, sql.ErrTxDone) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after its lending ended the *sql.Tx still runs statements (%v)", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the settlement's commit after the lending ended: %v", err)
	}
	if got := count(t, d, "SELECT count(*) FROM "+quote(name)); got != 1 {
		t.Fatalf("%d rows committed, want the one written while lent", got)
	}

	tx2, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	late := d.lend(ended, tx2)
	if late == nil {
		t.Fatal("lend under an ended context returned nil")
	}
	if _, err := late.ExecContext(ctx, "SELECT 1"); !errors.Is(err, sql.ErrTxDone) {
		t.Fatalf("a statement through a lending begun under an ended context: %v, want sql.ErrTxDone", err)
	}
}
