package dialecttest

import (
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// Lease: the fenced Ack commits the handler's writes with it when the row holds the token
// (not before), and ends the transaction; a wrong token rolls both back and reports
// false; Rollback discards, and the row is then settled on the pool as outside
// transactional mode.
func testTxLeaseSettle(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_txle", leaseTable)
	f := txLeaseFixture{e: e, h: h, tbl: tbl, fx: e.effects(), ack: dialects.Step{Kind: dialects.StepAck, Now: t0}}
	f.q = e.openLease(dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true})
	f.held = e.claimOne(f.q, tbl)
	f.before, _ = e.state(tbl, f.held.ID)

	f.staleTokenRollsBack(t)
	f.rollbackDiscards(t)
	f.rightTokenCommits(t)
	f.rolledBackSettlesOnThePool(t)
}

// txLeaseFixture is testTxLeaseSettle's queue, its effects table fx, the lease it holds
// and the row as it was when claimed.
type txLeaseFixture struct {
	e      *env
	h      Harness
	tbl    dialects.Table
	fx     string
	q      dialects.LeaseQueue
	held   dialects.Lease
	before RowState
	ack    dialects.Step
}

// ended checks that err is the dialect's ended-transaction error, where the harness
// can tell.
func (f *txLeaseFixture) ended(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", what)
	} else if c, ok := f.h.(TxEndedChecker); ok && !c.IsTxEnded(err) {
		t.Errorf("%s: %v, want the dialect's ended-transaction error", what, err)
	}
}

// staleTokenRollsBack: with a wrong token everything rolls back, the handler's write
// included.
func (f *txLeaseFixture) staleTokenRollsBack(t *testing.T) {
	e := f.e
	tx := e.beginDelivery(f.q)
	e.handlerWrite(tx, f.fx, 1)
	stale := f.held
	stale.Token = f.held.Token.Add(-time.Second)
	if ok, err := tx.SettleLease(ctx, f.ack, stale); ok || err != nil {
		t.Fatalf("stale settlement: %v %v", ok, err)
	}
	if e.committed(f.fx, 1) {
		t.Error("a lost lease committed the handler's write")
	}
	if after, ok := e.state(f.tbl, f.held.ID); !ok || !sameState(f.before, after) {
		t.Fatalf("a stale settlement changed the row: %+v, was %+v", after, f.before)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Errorf("rollback of an ended transaction: %v", err)
	}
	_, err := tx.SettleLease(ctx, f.ack, f.held)
	f.ended(t, "a settlement of an ended transaction", err)
}

// rollbackDiscards: Rollback discards the handler's write and leaves the lease.
func (f *txLeaseFixture) rollbackDiscards(t *testing.T) {
	e := f.e
	tx := e.beginDelivery(f.q)
	e.handlerWrite(tx, f.fx, 2)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Errorf("a second rollback: %v", err)
	}
	if e.committed(f.fx, 2) {
		t.Error("a rolled back write was committed")
	}
	if after, ok := e.state(f.tbl, f.held.ID); !ok || !sameState(f.before, after) {
		t.Fatalf("a rollback changed the row: %+v, was %+v", after, f.before)
	}
}

// rightTokenCommits: with the right token the Ack and the handler's write commit
// together, and only then.
func (f *txLeaseFixture) rightTokenCommits(t *testing.T) {
	e := f.e
	tx := e.beginDelivery(f.q)
	e.handlerWrite(tx, f.fx, 3)
	if e.committed(f.fx, 3) {
		t.Fatal("the handler's write is visible before the commit")
	}
	if ok, err := tx.SettleLease(ctx, f.ack, f.held); !ok || err != nil {
		t.Fatalf("settle: %v %v", ok, err)
	}
	if !e.committed(f.fx, 3) {
		t.Error("the handler's write was not committed with the ack")
	}
	if _, ok := e.state(f.tbl, f.held.ID); ok {
		t.Error("the acked row is still queued")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Errorf("rollback after the commit: %v", err)
	}
	if err := f.h.LentTry(tx.Tx(), "SELECT 1"); err == nil {
		t.Error("the lent transaction still runs after the settlement")
	}
	ok, err := tx.SettleLease(ctx, f.ack, f.held)
	if ok {
		t.Error("a second settlement settled")
	}
	f.ended(t, "a second settlement", err)
}

// rolledBackSettlesOnThePool: rolled back, a delivery settles on the pool, as outside
// transactional mode.
func (f *txLeaseFixture) rolledBackSettlesOnThePool(t *testing.T) {
	e := f.e
	held := e.claimOne(f.q, f.tbl)
	tx := e.beginDelivery(f.q)
	e.handlerWrite(tx, f.fx, 4)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.q.SettleLease(ctx, dialects.Step{Kind: dialects.StepRetry}, held); err != nil || !ok {
		t.Fatalf("retry after the rollback: %v %v", ok, err)
	}
	if s, _ := e.state(f.tbl, held.ID); s.LockedUntil != nil {
		t.Errorf("the row kept its lease: %+v", s)
	}
	if e.committed(f.fx, 4) {
		t.Error("the handler's write survived the rollback")
	}
}

// Lease: the dead-letter move runs inside the delivery's transaction, committed with the
// handler's writes only when the copy and the delete both matched the row and its token.
func testTxLeaseDeadLetterTable(t *testing.T, h Harness) {
	e := setup(t, h)
	noGroup := func(name string) dialects.Table {
		tbl := leaseTable(name)
		tbl.Group = ""
		return tbl
	}
	tbl := e.table("ra_txld", noGroup)
	dead := e.table("ra_txld_dead", noGroup)
	fx := e.effects()
	q := e.openLease(dialects.QueueSpec{Table: tbl, DeadLetterTable: dead.Name, Transactional: true})
	id := e.publish(tbl, dialects.Message{Payload: []byte("poison")})
	other := e.publish(tbl, dialects.Message{Payload: []byte("b")})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 2)
	if err != nil || len(rows) != 2 || rows[0].ID != id {
		t.Fatalf("claim %v %v", ids(rows), err)
	}
	held := dialects.Lease{ID: id, Token: rows[0].Token}
	step := dialects.Step{Kind: dialects.StepDeadLetter, Now: t0}

	tx := e.beginDelivery(q)
	e.handlerWrite(tx, fx, 1)
	for _, token := range []time.Time{held.Token.Add(time.Second), t0} {
		if ok, err := tx.SettleLease(ctx, step, dialects.Lease{ID: id, Token: token}); ok || err != nil {
			t.Fatalf("stale move: %v %v", ok, err)
		}
		tx = e.beginDelivery(q)
		e.handlerWrite(tx, fx, 1)
	}
	if e.committed(fx, 1) || e.count("SELECT COUNT(*) FROM "+e.q(dead.Name)) != 0 || e.count("SELECT COUNT(*) FROM "+e.q(tbl.Name)) != 2 {
		t.Fatal("a stale move committed")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	tx = e.beginDelivery(q)
	e.handlerWrite(tx, fx, 2)
	if ok, err := tx.SettleLease(ctx, step, held); !ok || err != nil {
		t.Fatalf("move: %v %v", ok, err)
	}
	if !e.committed(fx, 2) {
		t.Error("the handler's write was not committed with the move")
	}
	if _, ok := e.state(tbl, id); ok {
		t.Error("the row is still in the queue")
	}
	if _, ok := e.state(tbl, other); !ok {
		t.Error("the other row left the queue")
	}
	if s, ok := e.state(dead, id); !ok || s.LockedUntil != nil || s.Attempt != 2 {
		t.Errorf("dead-letter row %+v %v", s, ok)
	}
}

// A row the handler publishes through its lease delivery's transaction commits with the
// ack, and not before; a rolled-back delivery publishes nothing.
func testTxLeasePublishTx(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_txlp", leaseTable)
	q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true})
	held := e.claimOne(q, tbl)
	p, err := e.d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}

	tx := e.beginDelivery(q)
	id, err := p.Publish(ctx, tx.Tx(), dialects.Message{Group: "next", Payload: []byte("follow-up")})
	if err != nil {
		t.Fatal(err)
	}
	if _, found := e.state(tbl, id); found {
		t.Fatal("the published row is visible before the commit")
	}
	if ok, err := tx.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, held); err != nil || !ok {
		t.Fatalf("settle: %v %v", ok, err)
	}
	if s, found := e.state(tbl, id); !found || s.Group != "next" {
		t.Errorf("the published row did not commit with the ack: %+v %v", s, found)
	}

	// A rolled-back delivery publishes nothing.
	e.claimOne(q, tbl) // a lease in work, so the rollback has a delivery to undo
	tx = e.beginDelivery(q)
	id, err = p.Publish(ctx, tx.Tx(), dialects.Message{Group: "next", Payload: []byte("never")})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, found := e.state(tbl, id); found {
		t.Error("a row published in a rolled-back delivery exists")
	}
}
