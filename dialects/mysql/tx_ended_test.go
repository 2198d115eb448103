package mysql

import (
	"database/sql"
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
	return dialecttest.Ledger(t, harness{dialecttest.SQLRunner{DB: dbOf}}, d)
}

// deadlockedHandler is a handler that writes a debit (row 1) through its transaction,
// becomes a deadlock's victim (another, heavier transaction, on partner's pool, holds row
// 2 and waits for row 1; the handler then asks for row 2), and goes on to write a credit
// (row 3).
func deadlockedHandler(t *testing.T, partner *Dialect, dt dialects.DeliveryTx, fx string) {
	t.Helper()
	deadlockLent(t, partner, sqlTx(t, dt), fx)
}

// TxEndings: InnoDB ends a lent transaction as a deadlock's victim, rolling it back whole
// (the suite's txended topic runs each form through it).
func (harness) TxEndings() []dialecttest.TxEnding {
	return []dialecttest.TxEnding{{Name: "deadlock", End: func(t *testing.T, d dialects.Dialect, lent any, ledger string) {
		tx, ok := lent.(*sql.Tx)
		if !ok || tx == nil {
			t.Fatalf("the lent transaction is a %T", lent)
		}
		deadlockLent(t, d.(*Dialect), tx, ledger)
	}}}
}

// deadlockLent is deadlockedHandler on the lent *sql.Tx.
func deadlockLent(t *testing.T, partner *Dialect, tx *sql.Tx, fx string) {
	t.Helper()
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
