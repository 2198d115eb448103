package postgres

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// PostgreSQL aborts a transaction whose statement failed (a deadlock's victim included):
// every later statement in it fails, and its COMMIT is a ROLLBACK. A handler that goes on
// writing through the lent pgx.Tx after a deadlock commits nothing, and the settlement
// must report an error wrapping dialects.ErrTxEnded, never success.

// ledgerTable is the table a handler debits and credits: row 2 exists beforehand, so that
// a deadlock can be made on it.
func ledgerTable(t *testing.T, d *Dialect) string {
	t.Helper()
	return dialecttest.Ledger(t, harness{}, d)
}

// deadlockedHandler writes a debit (row 1) through tx, becomes a deadlock's victim
// (another transaction holds row 2 and waits for row 1; the handler then asks for row 2
// and, checking first, is the one PostgreSQL aborts), then tries to write a credit (row 3).
func deadlockedHandler(t *testing.T, d *Dialect, lent any, ledger string) {
	t.Helper()
	tx := lent.(pgx.Tx)
	if _, err := tx.Exec(ctx, "INSERT INTO "+quote(ledger)+" VALUES (1, 'debit')"); err != nil {
		t.Fatal(err)
	}
	// The handler's backend checks for deadlocks after 50ms of waiting, the other's only
	// after a minute: the handler's is the one that finds the cycle and aborts.
	if _, err := tx.Exec(ctx, "SET LOCAL deadlock_timeout = '50ms'"); err != nil {
		t.Fatal(err)
	}
	other, err := d.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	var otherPID int
	if err := other.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&otherPID); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, "SET LOCAL deadlock_timeout = '60s'"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, "UPDATE "+quote(ledger)+" SET v = 'other' WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		// Waits for the handler's uncommitted row 1.
		_, err := other.Exec(ctx, "INSERT INTO "+quote(ledger)+" VALUES (1, 'other')")
		waited <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for count(t, d, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'", otherPID) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the other transaction never waited for the handler's row")
		}
		time.Sleep(5 * time.Millisecond)
	}
	_, err = tx.Exec(ctx, "UPDATE "+quote(ledger)+" SET v = 'handler' WHERE id = 2")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
		t.Fatalf("want the handler's write deadlocked, got %v", err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the other transaction was the victim: %v", err)
	}
	// The handler goes on: the credit fails in the aborted transaction.
	_, _ = tx.Exec(ctx, "INSERT INTO "+quote(ledger)+" VALUES (3, 'credit')")
}

func ledgerUntouched(t *testing.T, d *Dialect, ledger string) {
	t.Helper()
	if n := count(t, d, "SELECT count(*) FROM "+quote(ledger)+" WHERE id IN (1, 3)"); n != 0 {
		t.Errorf("%d of the handler's debit and credit were committed", n)
	}
	if n := count(t, d, "SELECT count(*) FROM "+quote(ledger)+" WHERE id = 2 AND v = 'before'"); n != 1 {
		t.Error("row 2 changed")
	}
}

func wantTxEnded(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, dialects.ErrTxEnded) {
		t.Errorf("%s returned %v, want an error wrapping dialects.ErrTxEnded", what, err)
	}
}

// TxEndings: PostgreSQL ends a lent transaction as a deadlock's victim (the suite's
// txended topic runs each form through it).
func (harness) TxEndings() []dialecttest.TxEnding {
	return []dialecttest.TxEnding{{Name: "deadlock", Recoverable: true, End: func(t *testing.T, d dialects.Dialect, lent any, ledger string) {
		deadlockedHandler(t, d.(*Dialect), lent, ledger)
	}}}
}

// The commit of an aborted transaction is a rollback: a Commit run without a settlement
// statement first (nothing to settle inside the transaction) reports it, never success.
func TestTxEndedCommitOfAbortedTransaction(t *testing.T) {
	d := newDialect(t)
	tbl := advisoryTable(tableName(t, d))
	createTable(t, d, tbl)
	ledger := ledgerTable(t, d)
	dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl, Transactional: true})
	s, _ := takeTx(t, q)
	tx := s.Tx().(pgx.Tx)
	if _, err := tx.Exec(ctx, "INSERT INTO "+quote(ledger)+" VALUES (1, 'debit')"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("division by zero succeeded")
	}
	wantTxEnded(t, "the commit", s.Commit(ctx))
	if _, err := s.Unlock(ctx); err != nil {
		t.Errorf("unlock: %v", err)
	}
	ledgerUntouched(t, d, ledger)
}
