package mysql

import (
	"errors"
	"slices"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// A transactional handler whose transaction InnoDB ended (a deadlock's victim: the whole
// transaction rolled back, its row lock and savepoint with it) and that goes on writing
// through the lent *sql.Tx must not commit anything: not the writes the deadlock rolled
// back, not the writes after it (which would otherwise run in autocommit), not the
// settlement. The Ack reports an error wrapping dialects.ErrTxEnded, and the row returns
// by its form's rule.

// ledger is the table a handler debits and credits through its lent transaction: row 2
// exists before the delivery, so that a deadlock can be made on it.
func ledger(t *testing.T, d *Dialect) string {
	t.Helper()
	fx := effectsTable(t, d)
	mustExec(t, d.DB(), "INSERT INTO "+quote(fx)+" (id, v) VALUES (2, 'before')")
	return fx
}

// deadlockedHandler is a handler that writes a debit (row 1) through its transaction,
// becomes a deadlock's victim (another, heavier transaction, on partner's pool, holds row
// 2 and waits for row 1; the handler then asks for row 2), and goes on to write a credit
// (row 3).
func deadlockedHandler(t *testing.T, partner *Dialect, dt dialects.DeliveryTx, fx string) {
	t.Helper()
	tx := sqlTx(t, dt)
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+quote(fx)+" (id, v) VALUES (1, 'debit')"); err != nil {
		t.Fatal(err)
	}
	err := deadlockVictim(t, partner, fx, 2, fx, 1, func() error {
		_, err := tx.ExecContext(ctx, "UPDATE "+quote(fx)+" SET v = 'handler' WHERE id = 2")
		return err
	})
	if !isDeadlock(err) {
		t.Fatalf("want the handler's write deadlocked, got %v", err)
	}
	// A handler that ignores the error (or reports it and then writes anyway): the credit
	// must not commit by itself. Whether it fails is the dialect's business.
	_, _ = tx.ExecContext(ctx, "INSERT INTO "+quote(fx)+" (id, v) VALUES (3, 'credit')")
}

// nothingCommitted checks, from another connection, that neither the debit nor the credit
// was committed, and that row 2 is as it was.
func nothingCommitted(t *testing.T, d *Dialect, fx string) {
	t.Helper()
	if committed(t, d, fx, 1) {
		t.Error("the debit was committed")
	}
	if committed(t, d, fx, 3) {
		t.Error("the credit, written after the deadlock, was committed")
	}
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(fx)+" WHERE id = 2 AND v = 'before'"); n != 1 {
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
	tbl := newTable(t, d, "ra_txerl", rowLockTable)
	fx := ledger(t, d)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := openTxRowLock(t, d, dialects.QueueSpec{Table: tbl})
	c := dialecttest.ClaimTx(t, q)
	deadlockedHandler(t, d, c, fx)

	wantTxEnded(t, "the Ack", c.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}))
	nothingCommitted(t, d, fx)
	// The claim transaction ended with the deadlock: the row is back at once, unsettled,
	// its attempt not counted.
	if s, ok := stateOf(t, d, tbl, id); !ok || s.Attempt != 1 {
		t.Fatalf("row %+v (exists %v), want it queued at attempt 1", s, ok)
	}
	again := claimLocked(t, q)
	if again.Row().ID != id {
		t.Errorf("claimed %d, want %d", again.Row().ID, id)
	}
	again.Rollback(ctx)
}

// The other outcomes roll the handler's writes back to the savepoint first: that fails
// too, and so does the settlement after it.
func TestTxEndedByDeadlockRowLockRetry(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_txerr", rowLockTable)
	fx := ledger(t, d)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := openTxRowLock(t, d, dialects.QueueSpec{Table: tbl})
	c := dialecttest.ClaimTx(t, q)
	deadlockedHandler(t, d, c, fx)
	wantTxEnded(t, "the rollback to the savepoint", c.RollbackToSavepoint(ctx))
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetry}); err == nil {
		t.Error("the retry settled a claim whose transaction had ended")
	}
	nothingCommitted(t, d, fx)
	if s, ok := stateOf(t, d, tbl, id); !ok || s.Attempt != 1 {
		t.Fatalf("row %+v (exists %v), want it queued at attempt 1", s, ok)
	}
}

func TestTxEndedByDeadlockLease(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_txele", leaseTable)
	fx := ledger(t, d)
	q := openTxLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	held := dialecttest.ClaimOne(t, d, q, tbl)
	tx := beginDelivery(t, q)
	deadlockedHandler(t, d, tx, fx)

	ok, err := tx.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, held)
	if ok {
		t.Error("the Ack reported the row settled")
	}
	wantTxEnded(t, "the Ack", err)
	nothingCommitted(t, d, fx)
	// The row keeps the delivery's lease, to expire or be released; nothing settled it.
	s, exists := stateOf(t, d, tbl, held.ID)
	if !exists || s.Attempt != 2 {
		t.Fatalf("row %+v (exists %v), want it leased at attempt 2", s, exists)
	}
	sameTime(t, "locked_until", s.LockedUntil, held.Token)
	if err := tx.Rollback(ctx); err != nil {
		t.Errorf("rollback after the failed settlement: %v", err)
	}
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepRelease}, held); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	nothingCommitted(t, d, fx)
	rows, err := q.ClaimLeases(ctx, held.Token, held.Token.Add(60e9), 1)
	if err != nil || !slices.Equal(dialecttest.IDs(rows), []int64{held.ID}) {
		t.Fatalf("the released row was not claimable: %v %v", dialecttest.IDs(rows), err)
	}
}

func TestTxEndedByDeadlockAdvisory(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_txead", advisoryTable)
	fx := ledger(t, d)
	q := openTxAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	cands, err := q.Candidates(ctx, t0, 1)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates %v %v", cands, err)
	}
	key := cands[0].Key
	s := takeTx(t, q, key, id)
	if err := s.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	deadlockedHandler(t, d, s, fx)

	// The Ack as the runtime runs it: the settlement inside the transaction, then the
	// commit, then the unlock.
	err = s.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, id)
	if err == nil {
		err = s.Commit(ctx)
	} else if cerr := s.Commit(ctx); cerr == nil {
		t.Error("Commit after a failed settlement reported success")
	}
	wantTxEnded(t, "the Ack", err)
	if _, err := s.Unlock(ctx); err != nil {
		t.Errorf("unlock: %v", err)
	}
	nothingCommitted(t, d, fx)
	if st, ok := stateOf(t, d, tbl, id); !ok || st.ProcessedAt != nil || st.Attempt != 2 {
		t.Fatalf("row %+v (exists %v), want it unsettled at attempt 2", st, ok)
	}
	if got := usedBy(t, d.DB(), LockName(databaseName(t, d.DB()), key)); got != 0 {
		t.Fatalf("the key is still held by %d", got)
	}
	cands, err = q.Candidates(ctx, t0, 1)
	if err != nil || len(cands) != 1 || cands[0].ID != id {
		t.Fatalf("the row is not a candidate again: %v %v", cands, err)
	}
}

// A lent transaction's connection goes back to the pool with autocommit on, whether its
// delivery settled, rolled back, or found its transaction ended: with a pool of one
// connection, the next user of the pool gets it, and its write commits on its own.
func TestTxLentConnectionReturnsWithAutocommit(t *testing.T) {
	d := newDialect(t)
	d.DB().SetMaxOpenConns(1)
	d.DB().SetMaxIdleConns(1)
	other := newDialect(t) // the deadlock's partner, and the reader from outside
	pooled := func(t *testing.T, fx string, id int64) {
		t.Helper()
		var on int
		if err := d.DB().QueryRowContext(ctx, "SELECT @@autocommit").Scan(&on); err != nil || on != 1 {
			t.Fatalf("the pooled connection has autocommit %d (%v)", on, err)
		}
		mustExec(t, d.DB(), "INSERT INTO "+quote(fx)+" (id, v) VALUES (?, 'pool')", id)
		if !committed(t, other, fx, id) {
			t.Fatal("a write through the pool did not commit on its own")
		}
	}
	ack := dialects.Step{Kind: dialects.StepAck, Now: t0}
	for _, deadlock := range []bool{false, true} {
		name := "settled"
		if deadlock {
			name = "ended by a deadlock"
		}
		t.Run("row lock "+name, func(t *testing.T) {
			tbl := newTable(t, other, "ra_txac", rowLockTable)
			fx := ledger(t, other)
			dialecttest.Publish(t, other, tbl, dialects.Message{Payload: []byte("p")})
			c := dialecttest.ClaimTx(t, openTxRowLock(t, d, dialects.QueueSpec{Table: tbl}))
			if deadlock {
				deadlockedHandler(t, other, c, fx)
			}
			if err := c.Settle(ctx, ack); (err != nil) != deadlock {
				t.Fatalf("settle: %v", err)
			}
			pooled(t, fx, 10)
		})
		t.Run("lease "+name, func(t *testing.T) {
			tbl := newTable(t, other, "ra_txac", leaseTable)
			fx := ledger(t, other)
			q := openTxLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
			held := dialecttest.ClaimOne(t, other, q, tbl)
			tx := beginDelivery(t, q)
			if deadlock {
				deadlockedHandler(t, other, tx, fx)
			}
			if ok, err := tx.SettleLease(ctx, ack, held); ok == deadlock || (err != nil) != deadlock {
				t.Fatalf("settle: %v %v", ok, err)
			}
			pooled(t, fx, 10)
			// A delivery rolled back.
			tx = beginDelivery(t, q)
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			pooled(t, fx, 11)
		})
		t.Run("advisory "+name, func(t *testing.T) {
			tbl := newTable(t, other, "ra_txac", advisoryTable)
			fx := ledger(t, other)
			q := openTxAdvisory(t, d, dialects.QueueSpec{Table: tbl})
			id := dialecttest.Publish(t, other, tbl, dialects.Message{Payload: []byte("p")})
			cands, err := q.Candidates(ctx, t0, 1)
			if err != nil || len(cands) != 1 {
				t.Fatalf("candidates %v %v", cands, err)
			}
			s := takeTx(t, q, cands[0].Key, id)
			if err := s.Begin(ctx); err != nil {
				t.Fatal(err)
			}
			if deadlock {
				deadlockedHandler(t, other, s, fx)
			}
			err = s.Settle(ctx, ack, id)
			if err == nil {
				err = s.Commit(ctx)
			}
			if (err != nil) != deadlock {
				t.Fatalf("settle: %v", err)
			}
			// The session keeps its connection after the transaction: a statement on it
			// commits on its own.
			if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepRetryAfter, At: t0.Add(3600e9)}, id); err != nil {
				t.Fatal(err)
			}
			if st, _ := stateOf(t, other, tbl, id); st.RetryAfter == nil {
				t.Error("a settlement after the transaction did not commit on its own")
			}
			if closed, err := s.Unlock(ctx); closed || err != nil {
				t.Fatalf("unlock %v %v", closed, err)
			}
			pooled(t, fx, 10)
		})
	}
}
