package dialecttest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// TxEnder is a harness whose database can end a handler's lent transaction behind the
// handler's back: PostgreSQL and MySQL make it a deadlock's victim; SQLite ends it by
// itself after an interrupted write or a full disk, and leaves the connection in
// autocommit. A handler that goes on writing through it must commit nothing, and the
// settlement must report an error wrapping dialects.ErrTxEnded, never success.
type TxEnder interface {
	// TxEndings are the ways the database ends a lent transaction.
	TxEndings() []TxEnding
}

// TxEnding is one way a database ends a lent transaction.
type TxEnding struct {
	Name string
	// End runs as the handler: it writes a debit (row 1 of ledger, columns id and v; row
	// 2, v 'before', exists) through lent, has the database end the transaction (d is
	// the dialect, for a partner transaction on its pool), and writes a credit (row 3),
	// ignoring its error, as a handler that goes on would. Any other row it writes has
	// an id above 3.
	End func(t *testing.T, d dialects.Dialect, lent any, ledger string)
	// Recoverable says a rollback to a savepoint set before the handler ran recovers the
	// transaction (PostgreSQL: a failed statement aborts its transaction only back to the
	// last savepoint, and the locks taken before it stay held); elsewhere the whole
	// transaction is gone (InnoDB rolls a deadlock's victim back entirely).
	Recoverable bool
}

func txEnder(h Harness) bool { _, ok := h.(TxEnder); return ok }

var txEndedScenarios = []scenario{
	{name: "RowLockAck", run: eachEnding(testTxEndedRowLockAck), applies: func(h Harness) bool { return txEnder(h) && rowLock(h) }},
	{name: "RowLockRetry", run: eachEnding(testTxEndedRowLockRetry), applies: func(h Harness) bool { return txEnder(h) && rowLock(h) }},
	{name: "LeaseAck", run: eachEnding(testTxEndedLeaseAck), applies: txEnder},
	{name: "AdvisoryAck", run: eachEnding(testTxEndedAdvisoryAck), applies: txEnder},
}

// eachEnding runs a scenario once per way the database ends a transaction.
func eachEnding(run func(t *testing.T, h Harness, end TxEnding)) func(t *testing.T, h Harness) {
	return func(t *testing.T, h Harness) {
		for _, end := range h.(TxEnder).TxEndings() {
			t.Run(end.Name, func(t *testing.T) { run(t, h, end) })
		}
	}
}

// ledger creates the table the handler debits and credits, with row 2 in it.
func (e *env) ledger() string {
	e.t.Helper()
	fx := e.effects()
	e.exec("INSERT INTO " + e.q(fx) + " (id, v) VALUES (2, 'before')")
	return fx
}

// Ledger creates on d, for a dialect's own tests, the table TxEnding.End writes to:
// columns id and v, with row 2 ('before') in it.
func Ledger(t *testing.T, h Harness, d dialects.Dialect) string {
	t.Helper()
	return (&env{t: t, h: h, d: d, caps: h.Caps()}).ledger()
}

// nothingCommitted checks, from the pool, that no write of the handler's was committed
// and that row 2 is as it was.
func (e *env) nothingCommitted(fx string) {
	e.t.Helper()
	if n := e.count("SELECT COUNT(*) FROM " + e.q(fx) + " WHERE id <> 2"); n != 0 {
		e.t.Errorf("%d of the handler's writes (debit, credit, or the ending's own) were committed", n)
	}
	if n := e.count("SELECT COUNT(*) FROM " + e.q(fx) + " WHERE id = 2 AND v = 'before'"); n != 1 {
		e.t.Error("row 2 changed")
	}
}

func wantTxEnded(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, dialects.ErrTxEnded) {
		t.Errorf("%s returned %v, want an error wrapping dialects.ErrTxEnded", what, err)
	}
}

// Row lock: the claim transaction ended with the handler's: the Ack reports it, nothing is
// committed, and the row is back at once, unsettled, its attempt not counted.
func testTxEndedRowLockAck(t *testing.T, h Harness, end TxEnding) {
	e := setup(t, h)
	tbl := e.table("ra_txerl", rowLockTable)
	fx := e.ledger()
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl, Transactional: true})
	c := e.claimTx(q)
	end.End(t, e.d, c.Tx(), fx)

	wantTxEnded(t, "the Ack", c.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}))
	e.nothingCommitted(fx)
	if s, ok := e.state(tbl, id); !ok || s.Attempt != 1 {
		t.Fatalf("row %+v (exists %v), want it queued at attempt 1", s, ok)
	}
	again, ok := claimElsewhere(t, q)
	if !ok || again.Row().ID != id {
		t.Fatal("the row was not claimable again")
	}
	_ = again.Rollback(ctx)
	e.noConns("after the ended claim and a rollback")
}

// Row lock, the other outcomes: they roll the handler's writes back to the savepoint
// first. Where the whole transaction is gone, that fails too, and so does the settlement
// after it: the row is back at once, its attempt not counted. Where the savepoint recovers
// the transaction (Recoverable), the retry settles in it, counting the attempt, with the
// handler's writes undone.
func testTxEndedRowLockRetry(t *testing.T, h Harness, end TxEnding) {
	e := setup(t, h)
	tbl := e.table("ra_txerr", rowLockTable)
	fx := e.ledger()
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl, Transactional: true})
	c := e.claimTx(q)
	end.End(t, e.d, c.Tx(), fx)

	if end.Recoverable {
		if err := c.RollbackToSavepoint(ctx); err != nil {
			t.Fatalf("the rollback to the savepoint did not recover the transaction: %v", err)
		}
		if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetry}); err != nil {
			t.Fatalf("the retry after the recovered savepoint: %v", err)
		}
		e.nothingCommitted(fx)
		if s, ok := e.state(tbl, id); !ok || s.Attempt != 2 {
			t.Fatalf("row %+v (exists %v), want it queued at attempt 2 (the retry counted)", s, ok)
		}
		e.noConns("after the retried claim")
		return
	}
	wantTxEnded(t, "the rollback to the savepoint", c.RollbackToSavepoint(ctx))
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetry}); err == nil {
		t.Error("the retry settled a claim whose transaction had ended")
	}
	e.nothingCommitted(fx)
	if s, ok := e.state(tbl, id); !ok || s.Attempt != 1 {
		t.Fatalf("row %+v (exists %v), want it queued at attempt 1", s, ok)
	}
	e.noConns("after the ended claim")
}

// Lease: the Ack reports the ended transaction and settles nothing; the row keeps the
// delivery's lease, to expire or be released, and is claimable once released; the pool
// writes and commits as before.
func testTxEndedLeaseAck(t *testing.T, h Harness, end TxEnding) {
	e := setup(t, h)
	tbl := e.table("ra_txele", leaseTable)
	fx := e.ledger()
	q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true})
	held := e.claimOne(q, tbl)
	tx := e.beginDelivery(q)
	end.End(t, e.d, tx.Tx(), fx)

	ok, err := tx.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, held)
	if ok {
		t.Error("the Ack reported the row settled")
	}
	wantTxEnded(t, "the Ack", err)
	e.nothingCommitted(fx)
	s, exists := e.state(tbl, held.ID)
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
	e.nothingCommitted(fx)
	rows, err := q.ClaimLeases(ctx, held.Token, held.Token.Add(time.Minute), 1)
	if err != nil || !slices.Equal(IDs(rows), []int64{held.ID}) {
		t.Fatalf("the released row was not claimable: %v %v", IDs(rows), err)
	}
	e.exec("INSERT INTO " + e.q(fx) + " (id, v) VALUES (9, 'pool')")
	if !e.committed(fx, 9) {
		t.Error("a write through the pool did not commit after the ended transaction")
	}
	e.noConns("after the ended delivery")
}

// Advisory: the Ack as the runtime runs it (the settlement inside the transaction, the
// commit, the unlock) reports the ended transaction; the row is unsettled, its key free,
// and it is a candidate again.
func testTxEndedAdvisoryAck(t *testing.T, h Harness, end TxEnding) {
	e := setup(t, h)
	tbl := e.table("ra_txead", advisoryTable)
	fx := e.ledger()
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := e.openAdvisory(dialects.QueueSpec{Table: tbl, Transactional: true})
	s, cand := e.takeTx(q)
	end.End(t, e.d, s.Tx(), fx)

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
	e.nothingCommitted(fx)
	if st, ok := e.state(tbl, id); !ok || st.ProcessedAt != nil || st.Attempt != 2 {
		t.Fatalf("row %+v (exists %v), want it unsettled at attempt 2", st, ok)
	}
	if ki, ok := h.(KeyInspector); ok {
		if n := ki.LocksHeld(t, e.d, cand.Key); n != 0 {
			t.Fatalf("the key is still held (%d)", n)
		}
	}
	cands, err := q.Candidates(ctx, t0, 1)
	if err != nil || len(cands) != 1 || cands[0].ID != id {
		t.Fatalf("the row is not a candidate again: %v %v", cands, err)
	}
	e.noConns("after the ended delivery")
}
