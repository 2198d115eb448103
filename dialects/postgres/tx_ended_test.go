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
	name := tableName(t, d)
	mustExec(t, d, "CREATE TABLE "+quote(name)+" (id bigint PRIMARY KEY, v text NOT NULL)")
	mustExec(t, d, "INSERT INTO "+quote(name)+" VALUES (2, 'before')")
	return name
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

func TestTxEndedByDeadlockRowLock(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	ledger := ledgerTable(t, d)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true})
	c := dialecttest.ClaimTx(t, q)
	deadlockedHandler(t, d, c.Tx(), ledger)

	wantTxEnded(t, "the Ack", c.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}))
	ledgerUntouched(t, d, ledger)
	if s, ok := stateOf(t, d, tbl, id); !ok || s.Attempt != 1 {
		t.Fatalf("row %+v (exists %v), want it queued at attempt 1", s, ok)
	}
	again, ok := claimLocked(t, q, t0)
	if !ok || again.Row().ID != id {
		t.Fatalf("the row was not claimable again")
	}
	again.Rollback(ctx)
	if n := acquired(d); n != 0 {
		t.Errorf("%d connections held", n)
	}
}

func TestTxEndedByDeadlockLease(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	ledger := ledgerTable(t, d)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim %v %v", rows, err)
	}
	held := dialects.Lease{ID: id, Token: rows[0].Token}
	ltx, err := q.(dialects.TxLeaseQueue).BeginDelivery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deadlockedHandler(t, d, ltx.Tx(), ledger)

	ok, err := ltx.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, held)
	if ok {
		t.Error("the Ack reported the row settled")
	}
	wantTxEnded(t, "the Ack", err)
	ledgerUntouched(t, d, ledger)
	s, exists := stateOf(t, d, tbl, id)
	if !exists || s.Attempt != 2 || !sameTime(s.LockedUntil, held.Token) {
		t.Fatalf("row %+v (exists %v), want it leased at attempt 2", s, exists)
	}
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepRelease}, held); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	if n := acquired(d); n != 0 {
		t.Errorf("%d connections held", n)
	}
}

func TestTxEndedByDeadlockAdvisory(t *testing.T) {
	d := newDialect(t)
	tbl := advisoryTable(tableName(t, d))
	createTable(t, d, tbl)
	ledger := ledgerTable(t, d)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl, Transactional: true})
	s, _ := takeTx(t, q)
	deadlockedHandler(t, d, s.Tx(), ledger)

	err := s.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, id)
	if err == nil {
		err = s.Commit(ctx)
	} else if cerr := s.Commit(ctx); cerr == nil {
		t.Error("Commit after a failed settlement reported success")
	}
	wantTxEnded(t, "the Ack", err)
	if _, err := s.Unlock(ctx); err != nil {
		t.Errorf("unlock: %v", err)
	}
	ledgerUntouched(t, d, ledger)
	if st, ok := stateOf(t, d, tbl, id); !ok || st.ProcessedAt != nil || st.Attempt != 2 {
		t.Fatalf("row %+v (exists %v), want it unsettled at attempt 2", st, ok)
	}
	cands, err := q.Candidates(ctx, t0, 1)
	if err != nil || len(cands) != 1 || cands[0].ID != id {
		t.Fatalf("the row is not a candidate again: %v %v", cands, err)
	}
	if n := acquired(d); n != 0 {
		t.Errorf("%d connections held", n)
	}
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
