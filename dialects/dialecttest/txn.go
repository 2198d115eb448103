package dialecttest

import (
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

// txnScenarios are the transactions a delivery lends its handler (QueueSpec.Transactional).
var txnScenarios = []scenario{
	{name: "TxAdvisoryUnlockRollsBack", run: testTxAdvisoryUnlockRollsBack},
}

// takeTx claims the first candidate of a transactional advisory queue on a session of its
// own and begins its transaction, as the claimer does.
func (e *env) takeTx(q dialects.AdvisoryQueue) (dialects.TxSession, dialects.Candidate) {
	t := e.t
	t.Helper()
	cands, err := q.Candidates(ctx, t0, 1)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates %v %v", cands, err)
	}
	s := e.session(q)
	ts, ok := s.(dialects.TxSession)
	if !ok {
		t.Fatalf("a transactional session is a %T, not a TxSession", s)
	}
	if ts.Tx() != nil {
		t.Fatalf("Tx() before Begin = %v", ts.Tx())
	}
	if !tryLock(t, s, cands[0].Key) {
		t.Fatal("lock refused")
	}
	if _, ok, err := s.Take(ctx, cands[0].ID, t0); err != nil || !ok {
		t.Fatalf("take: %v %v", ok, err)
	}
	if err := ts.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	if ts.Tx() == nil {
		t.Fatal("Tx() after Begin is nil")
	}
	return ts, cands[0]
}

// Unlock with the transaction still open rolls it back (the handler's writes and the
// settlement) before the key is released, and keeps the connection; so does a transaction
// whose statement failed. Abort rolls back and closes the connection. Where the harness can
// tell (SessionWatcher), the connection is checked back in the pool outside a transaction,
// or gone.
func testTxAdvisoryUnlockRollsBack(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_txau", advisoryTable)
	fx := e.effects()
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := e.openAdvisory(dialects.QueueSpec{Table: tbl, Transactional: true})
	watcher, _ := h.(SessionWatcher)
	keyFree := func(what string, key string) {
		t.Helper()
		other := e.session(q)
		if !tryLock(t, other, key) {
			t.Errorf("after %s the key stayed held", what)
		}
		unlock(t, other)
		if inspector, ok := h.(KeyInspector); ok {
			if n := inspector.LocksHeld(t, e.d, key); n != 0 {
				t.Errorf("after %s %d locks left", what, n)
			}
		}
	}

	s, c := e.takeTx(q)
	e.handlerWrite(s, fx, 1)
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, id); err != nil {
		t.Fatal(err)
	}
	var check func(bool)
	if watcher != nil {
		check = watcher.WatchSession(t, e.d, s)
	}
	if closed, err := s.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock with an open transaction: closed %v, %v", closed, err)
	}
	if check != nil {
		check(false)
	}
	if e.committed(fx, 1) {
		t.Error("Unlock committed the handler's write")
	}
	if st, ok := e.state(tbl, id); !ok || st.ProcessedAt != nil {
		t.Errorf("Unlock committed the settlement: %+v %v", st, ok)
	}
	keyFree("unlock", c.Key)

	// A transaction whose statement failed rolls back as well.
	s, c = e.takeTx(q)
	if err := h.LentTry(s.Tx(), "SELECT * FROM "+e.q(e.name("ra_missing"))); err == nil {
		t.Fatal("a statement on a missing table succeeded")
	}
	if closed, err := s.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock with a failed transaction: closed %v, %v", closed, err)
	}
	keyFree("unlock of a failed transaction", c.Key)

	// Abort closes the connection, transaction and all.
	s, c = e.takeTx(q)
	e.handlerWrite(s, fx, 2)
	if watcher != nil {
		check = watcher.WatchSession(t, e.d, s)
	}
	if err := s.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if check != nil {
		check(true)
	}
	if e.committed(fx, 2) {
		t.Error("Abort committed the handler's write")
	}
	keyFree("abort", c.Key)
	if err := s.Begin(ctx); err == nil && !e.caps.EndedSessionWorks {
		t.Error("a transaction began on an ended session")
		s.Rollback(ctx)
	}
}
