package dialecttest

import (
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// claimTx is ClaimTx on the test's queue.
func (e *env) claimTx(q dialects.RowLockQueue) dialects.TxLockedClaim {
	e.t.Helper()
	return ClaimTx(e.t, q)
}

// claimElsewhere claims from another goroutine, as another worker would, and fails if
// the claim waits for a locked row instead of skipping it.
func claimElsewhere(t *testing.T, q dialects.RowLockQueue) (dialects.LockedClaim, bool) {
	t.Helper()
	type result struct {
		c   dialects.LockedClaim
		ok  bool
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, ok, err := q.ClaimLocked(ctx, t0)
		ch <- result{c, ok, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.c, r.ok
	case <-time.After(10 * time.Second):
		t.Fatal("a claim waited for a locked row instead of skipping it")
	}
	return nil, false
}

// Row lock: the handler's writes through Tx, a publish through it included, commit with
// the Ack, and not before; the ended claim sets no savepoint.
func testTxRowLockAckCommitsHandlerWrites(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_txrl", rowLockTable)
	out := e.table("ra_txrl_out", rowLockTable)
	fx := e.effects()
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl, Transactional: true})
	c := e.claimTx(q)
	if c.Row().ID != id {
		t.Fatalf("claimed %d", c.Row().ID)
	}
	e.handlerWrite(c, fx, id)
	p, err := e.d.Publisher(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := p.Publish(ctx, c.Tx(), dialects.Message{Payload: []byte("out")})
	if err != nil {
		t.Fatal(err)
	}
	if e.committed(fx, id) || e.count("SELECT COUNT(*) FROM "+e.q(out.Name)) != 0 {
		t.Fatal("the handler's writes are visible before the settlement")
	}
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.state(tbl, id); ok {
		t.Error("the acked row is still queued")
	}
	if !e.committed(fx, id) {
		t.Error("the handler's write was not committed with the ack")
	}
	if _, ok := e.state(out, pub); !ok {
		t.Error("the row published through Tx was not committed with the ack")
	}
	if err := c.Savepoint(ctx); err == nil {
		t.Error("a savepoint on an ended claim")
	}
}

// Row lock: ROLLBACK TO SAVEPOINT discards the handler's writes and keeps the row locked;
// the retry then counts the attempt and commits in the same transaction.
func testTxRowLockRetryDiscardsHandlerWrites(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_txrr", rowLockTable)
	out := e.table("ra_txrr_out", rowLockTable)
	fx := e.effects()
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl, Transactional: true})
	c := e.claimTx(q)
	e.handlerWrite(c, fx, id)
	p, err := e.d.Publisher(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(ctx, c.Tx(), dialects.Message{Payload: []byte("out")}); err != nil {
		t.Fatal(err)
	}
	if err := c.RollbackToSavepoint(ctx); err != nil {
		t.Fatal(err)
	}
	// The row stays locked after the rollback to the savepoint.
	if other, ok := claimElsewhere(t, q); ok {
		other.Rollback(ctx)
		t.Fatal("the row was claimable after ROLLBACK TO SAVEPOINT")
	}
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetry}); err != nil {
		t.Fatal(err)
	}
	if e.committed(fx, id) || e.count("SELECT COUNT(*) FROM "+e.q(out.Name)) != 0 {
		t.Error("the handler's writes survived the rollback to the savepoint")
	}
	if s, ok := e.state(tbl, id); !ok || s.Attempt != 2 {
		t.Errorf("after the retry the row is %+v %v, want attempt 2", s, ok)
	}
	again := claimLocked(t, q, t0)
	if again.Row().ID != id || again.Row().Attempt != 2 {
		t.Errorf("claimed %+v after the retry", again.Row())
	}
	again.Rollback(ctx)
}
