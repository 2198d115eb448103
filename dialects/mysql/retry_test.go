package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
)

func lockTable(t *testing.T, d *Dialect) string {
	t.Helper()
	name := tableName(t, d, "ra_dl")
	mustExec(t, d.DB(), "CREATE TABLE "+quote(name)+" (id INT PRIMARY KEY, v INT) ENGINE=InnoDB")
	mustExec(t, d.DB(), "INSERT INTO "+quote(name)+" VALUES (1, 0), (2, 0)")
	return name
}

func beginOn(t *testing.T, db *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	return tx
}

func TestIsRetryableDeadlock(t *testing.T) {
	d := newDialect(t)
	table := quote(lockTable(t, d))
	lock := func(tx *sql.Tx, id int) error {
		_, err := tx.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id = ?", id)
		return err
	}
	a, b := beginOn(t, d.DB()), beginOn(t, d.DB())
	if err := lock(a, 1); err != nil {
		t.Fatal(err)
	}
	if err := lock(b, 2); err != nil {
		t.Fatal(err)
	}
	errA := make(chan error, 1)
	go func() { errA <- lock(a, 2) }() // waits for b
	// b now waits for a, which waits for b: InnoDB kills one of them.
	var errs []error
	if err := lock(b, 1); err != nil {
		errs = append(errs, err)
		b.Rollback() // lets a go on
	}
	if err := <-errA; err != nil {
		errs = append(errs, err)
	}
	if len(errs) != 1 {
		t.Fatalf("want one deadlock victim, got %v", errs)
	}
	var me *mysql.MySQLError
	if !errors.As(errs[0], &me) || me.Number != 1213 || !IsRetryable(errs[0]) || !IsRetryable(fmt.Errorf("wrapped: %w", errs[0])) {
		t.Fatalf("deadlock %v not retryable", errs[0])
	}
}

func TestIsRetryableLockWaitTimeout(t *testing.T) {
	d := newDialect(t)
	table := quote(lockTable(t, d))
	a := beginOn(t, d.DB())
	if _, err := a.ExecContext(ctx, "SELECT * FROM "+table+" WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	conn, err := d.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer discard(conn)
	if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
		t.Fatal(err)
	}
	_, err = conn.ExecContext(ctx, "UPDATE "+table+" SET v = 1 WHERE id = 1")
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1205 || !IsRetryable(err) {
		t.Fatalf("lock wait timeout %v not retryable", err)
	}
	for _, e := range []error{nil, errors.New("x"), context.Canceled, &mysql.MySQLError{Number: 1062}, sql.ErrNoRows} {
		if IsRetryable(e) {
			t.Errorf("%v retryable", e)
		}
	}
}

func TestWithRetry(t *testing.T) {
	deadlock := &mysql.MySQLError{Number: 1213, Message: "Deadlock found"}
	calls := 0
	v, err := withRetry(ctx, func() (int, error) {
		calls++
		if calls < 3 {
			return 0, fmt.Errorf("claim: %w", deadlock)
		}
		return 7, nil
	})
	if v != 7 || err != nil || calls != 3 {
		t.Fatalf("got %v %v after %d calls", v, err, calls)
	}

	calls = 0
	_, err = withRetry(ctx, func() (int, error) { calls++; return 0, deadlock })
	if !IsRetryable(err) || calls != 1+len(retryDelays) {
		t.Fatalf("exhausted: %v after %d calls", err, calls)
	}

	calls = 0
	other := errors.New("syntax")
	if _, err = withRetry(ctx, func() (int, error) { calls++; return 0, other }); err != other || calls != 1 {
		t.Fatalf("non-retryable: %v after %d calls", err, calls)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	calls = 0
	_, err = withRetry(cctx, func() (int, error) { calls++; return 0, deadlock })
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("cancelled: %v after %d calls", err, calls)
	}
}
