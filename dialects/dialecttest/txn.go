package dialecttest

import (
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// txnScenarios are the transactions a delivery lends its handler (QueueSpec.Transactional).
var txnScenarios = []scenario{
	{name: "TxAdvisoryUnlockRollsBack", run: testTxAdvisoryUnlockRollsBack},
	{name: "TxLeaseSettle", run: testTxLeaseSettle},
	{name: "TxAdvisoryAckCommits", run: testTxAdvisoryAckCommits},
	{name: "TxAdvisoryRollbackThenRetry", run: testTxAdvisoryRollbackThenRetry},
	{name: "TxAdvisoryDeadLetterTable", run: testTxAdvisoryDeadLetterTable},
	{name: "TxLeasePublishTx", run: testTxLeasePublishTx},
	{name: "TxAdvisoryPublishTx", run: testTxAdvisoryPublishTx},
	{name: "TxOnlyWhenTransactional", run: testTxOnlyWhenTransactional},
	{name: "TxRowLockAckCommitsHandlerWrites", run: testTxRowLockAckCommitsHandlerWrites, applies: rowLock},
	{name: "TxRowLockRetryDiscardsHandlerWrites", run: testTxRowLockRetryDiscardsHandlerWrites, applies: rowLock},
	{name: "TxLeaseDeadLetterTable", run: testTxLeaseDeadLetterTable},
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

// txEnded checks a session's Tx() after its transaction ended: nil
// (Caps.TxNilAfterEnd), or a transaction that runs nothing.
func (e *env) txEnded(after string, s dialects.TxSession) {
	e.t.Helper()
	tx := s.Tx()
	switch {
	case e.caps.TxNilAfterEnd && tx != nil:
		e.t.Errorf("Tx() after %s is not nil", after)
	case tx != nil && e.h.LentTry(tx, "SELECT 1") == nil:
		e.t.Errorf("Tx() after %s still runs statements", after)
	}
}

// keyHeld checks that key is held by a session other than a new one of q's (and, where the
// harness can tell, by exactly one session).
func (e *env) keyHeld(q dialects.AdvisoryQueue, key string, want bool) {
	t := e.t
	t.Helper()
	other := NewSession(t, q)
	if got := !tryLock(t, other, key); got != want {
		t.Errorf("key held: %v, want %v", got, want)
	}
	unlock(t, other)
	if inspector, ok := e.h.(KeyInspector); ok && want {
		if n := inspector.LocksHeld(t, e.d, key); n != 1 {
			t.Errorf("%d locks on the key, want 1", n)
		}
	}
}

// commitWithoutTx checks a Commit with no transaction open (Caps.CommitWithoutTxSucceeds).
func (e *env) commitWithoutTx(what string, s dialects.TxSession) {
	e.t.Helper()
	err := s.Commit(ctx)
	switch {
	case e.caps.CommitWithoutTxSucceeds && err != nil:
		e.t.Errorf("%s: %v", what, err)
	case !e.caps.CommitWithoutTxSucceeds && err == nil:
		e.t.Errorf("%s succeeded", what)
	}
}

// Advisory: Begin (once), the handler's write and the Ack inside the transaction are
// invisible until Commit commits both; the key, a session lock, survives the COMMIT until
// Unlock, and the connection stays the session's and then the pool's.
func testTxAdvisoryAckCommits(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_txad", advisoryTable)
	fx := e.effects()
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := e.openAdvisory(dialects.QueueSpec{Table: tbl, Transactional: true})
	s, c := e.takeTx(q)
	if err := s.Begin(ctx); err == nil {
		t.Error("a second Begin while the transaction is open")
	}
	e.handlerWrite(s, fx, id)
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, id); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.state(tbl, id); st.ProcessedAt != nil || e.committed(fx, id) {
		t.Fatal("the settlement or the handler's write is visible before the commit")
	}
	var check func(bool)
	if w, ok := h.(SessionWatcher); ok {
		check = w.WatchSession(t, e.d, s)
	}
	if err := s.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.txEnded("the commit", s)
	e.commitWithoutTx("a second commit", s)
	if err := s.Rollback(ctx); err != nil {
		t.Errorf("rollback after the commit: %v", err)
	}
	st, _ := e.state(tbl, id)
	sameTime(t, "processed_at", st.ProcessedAt, t0)
	if !e.committed(fx, id) {
		t.Error("the handler's write was not committed")
	}
	e.keyHeld(q, c.Key, true)
	if closed, err := s.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock %v %v", closed, err)
	}
	if check != nil {
		check(false)
	}
	e.keyHeld(q, c.Key, false)

	// A commit before Begin.
	id = e.publish(tbl, dialects.Message{Payload: []byte("q")})
	e.exec("UPDATE "+e.q(tbl.Name)+" SET account = 'second' WHERE id = ?", id)
	s2 := e.session(q).(dialects.TxSession)
	if !tryLock(t, s2, keyOf(tbl.Name, "second")) {
		t.Fatal("lock refused")
	}
	e.commitWithoutTx("a commit before Begin", s2)
	unlock(t, s2)
}

// Advisory: Rollback (twice) discards the handler's write, the key surviving it; then
// settlements run outside the transaction, on the session.
func testTxAdvisoryRollbackThenRetry(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_txar", advisoryTable)
	fx := e.effects()
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := e.openAdvisory(dialects.QueueSpec{Table: tbl, Transactional: true})
	s, c := e.takeTx(q)
	e.handlerWrite(s, fx, id)
	if err := s.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e.txEnded("the rollback", s)
	e.keyHeld(q, c.Key, true)
	e.commitWithoutTx("a commit after the rollback", s)
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepRetry}, id); err != nil {
		t.Fatal(err)
	}
	at := t0.Add(time.Hour)
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepRetryAfter, At: at}, id); err != nil {
		t.Fatal(err)
	}
	if closed, err := s.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock %v %v", closed, err)
	}
	if e.committed(fx, id) {
		t.Error("a rolled back write was committed")
	}
	st, ok := e.state(tbl, id)
	if !ok || st.Attempt != 2 || st.ProcessedAt != nil {
		t.Errorf("row %+v %v", st, ok)
	}
	sameTime(t, "retry_after", st.RetryAfter, at)
}

// Advisory: a dead letter into a table moves the row inside the open transaction, with
// the handler's writes, visible only at the commit.
func testTxAdvisoryDeadLetterTable(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_txam", advisoryTable)
	dead := e.table("ra_txam_dead", advisoryTable)
	fx := e.effects()
	id := e.publish(tbl, dialects.Message{Payload: []byte("poison")})
	q := e.openAdvisory(dialects.QueueSpec{Table: tbl, DeadLetterTable: dead.Name, Transactional: true})
	s, _ := e.takeTx(q)
	e.handlerWrite(s, fx, id)
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter, Now: t0}, id); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.state(tbl, id); !ok || e.count("SELECT COUNT(*) FROM "+e.q(dead.Name)) != 0 {
		t.Fatal("the move was committed before the transaction")
	}
	if err := s.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.state(tbl, id); ok {
		t.Error("row still in the queue")
	}
	if st, ok := e.state(dead, id); !ok || st.Attempt != 2 {
		t.Errorf("dead-letter row %+v %v", st, ok)
	}
	if !e.committed(fx, id) {
		t.Error("the handler's write was not committed with the move")
	}
	unlock(t, s)
}

// A row the handler publishes through its advisory session's transaction commits with
// it, and not before.
func testTxAdvisoryPublishTx(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_txap", advisoryTable)
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := e.openAdvisory(dialects.QueueSpec{Table: tbl, Transactional: true})
	p, err := e.d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := e.takeTx(q)
	pub, err := p.Publish(ctx, s.Tx(), dialects.Message{Payload: []byte("follow-up")})
	if err != nil {
		t.Fatal(err)
	}
	if _, found := e.state(tbl, pub); found {
		t.Fatal("the published row is visible before the commit")
	}
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, id); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, found := e.state(tbl, pub); !found {
		t.Error("the published row did not commit")
	}
	unlock(t, s)
}

// Only a transactional subscription's queue, claims and sessions lend transactions (the
// lease queues and sessions of every subscription may, where Caps.TxAlways).
func testTxOnlyWhenTransactional(t *testing.T, h Harness) {
	e := setup(t, h)
	if e.caps.RowLock {
		rl := e.table("ra_txno", rowLockTable)
		e.publish(rl, dialects.Message{Payload: []byte("p")})
		c := claimLocked(t, OpenRowLock(t, e.d, dialects.QueueSpec{Table: rl}), t0)
		if _, ok := c.(dialects.TxLockedClaim); ok {
			t.Error("a claim of a plain subscription is a TxLockedClaim")
		}
		c.Rollback(ctx)
		c = claimLocked(t, OpenRowLock(t, e.d, dialects.QueueSpec{Table: rl, Transactional: true}), t0)
		if _, ok := c.(dialects.TxLockedClaim); !ok {
			t.Errorf("a claim of a transactional subscription is %T, not a TxLockedClaim", c)
		}
		c.Rollback(ctx)
	}
	ls := e.table("ra_txno", leaseTable)
	if q, ok := e.openLease(dialects.QueueSpec{Table: ls, Group: "g"}).(dialects.TxLeaseQueue); ok && !e.caps.TxAlways {
		t.Errorf("a plain lease queue %T is a TxLeaseQueue", q)
	}
	if _, ok := e.openLease(dialects.QueueSpec{Table: ls, Group: "g", Transactional: true}).(dialects.TxLeaseQueue); !ok {
		t.Error("a transactional lease queue is not a TxLeaseQueue")
	}
	adv := e.table("ra_txno", advisoryTable)
	if s, ok := e.session(e.openAdvisory(dialects.QueueSpec{Table: adv})).(dialects.TxSession); ok && !e.caps.TxAlways {
		t.Errorf("a plain advisory session %T is a TxSession", s)
	}
	if _, ok := e.session(e.openAdvisory(dialects.QueueSpec{Table: adv, Transactional: true})).(dialects.TxSession); !ok {
		t.Error("a transactional advisory session is not a TxSession")
	}
}
