package mysql

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// The copy matches the token but the delete does not (the row was taken between the two
// statements): the move rolls back.
func TestMoveRollsBackWhenTheDeleteMisses(t *testing.T) {
	d := newDialect(t)
	noGroup := func(name string) dialects.Table {
		tbl := leaseTable(name)
		tbl.Group = ""
		return tbl
	}
	tbl := newTable(t, d, "ra_mv", noGroup)
	dead := newTable(t, d, "ra_mv_dead", noGroup)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, DeadLetterTable: dead.Name}).(*leaseQueue)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 {
		t.Fatal(err)
	}
	// A delete that names another token stands in for a row re-leased in between.
	q.settle.moveDelete = "DELETE FROM " + quote(tbl.Name) + " WHERE id = ? AND locked_until = ? AND FALSE"
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, dialects.Lease{ID: id, Token: rows[0].Token}); ok || err != nil {
		t.Fatalf("move: %v %v", ok, err)
	}
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(dead.Name)); n != 0 {
		t.Fatal("the copy was committed")
	}
	if _, ok := stateOf(t, d, tbl, id); !ok {
		t.Fatal("the row is gone")
	}
}

// A waiting extension cut short by its context (the renewer's eighth-of-a-lease bound)
// leaves no lock on the rows it had already locked while it waited for a row another
// session holds. The driver answers a cancelled context by closing its socket, which the
// server does not notice while the statement waits in the lock queue, so a transaction
// left behind would keep row A locked for up to innodb_lock_wait_timeout.
func TestWaitingExtensionCutShortHoldsNoLock(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_r2wait", leaseTable)
	a := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("a")})
	b := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("b")})
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl})
	start := t0.Truncate(time.Second)
	token := start.Add(10 * time.Second)
	if rows, err := q.ClaimLeases(ctx, start, token, 2); err != nil || len(rows) != 2 {
		t.Fatalf("claim: %v %v", dialecttest.IDs(rows), err)
	}
	other, err := d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback()
	if _, err := other.ExecContext(ctx, "SELECT id FROM "+quote(tbl.Name)+" WHERE id = ? FOR UPDATE", b); err != nil {
		t.Fatal(err)
	}

	w := q.(dialects.WaitingExtender)
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	moved, err := w.ExtendLeasesWaiting(short, token.Add(20*time.Second),
		[]dialects.Lease{{ID: a, Token: token}, {ID: b, Token: token}})
	cancel()
	if err == nil {
		t.Fatalf("the extension returned %v with row %d locked elsewhere", moved, b)
	}

	// The extension has returned: row A must be free (a moment for the server).
	time.Sleep(200 * time.Millisecond)
	// The extension has returned: row A must be free. A batched ack of A must settle it,
	// not find it busy.
	c, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	startAck := time.Now()
	acked, err := q.(dialects.LeaseBatchQueue).SettleLeases(c, dialects.StepAck, start, []dialects.Lease{{ID: a, Token: token}})
	var busy *dialects.RowsBusyError
	if errors.As(err, &busy) || len(acked) != 1 {
		t.Fatalf("ack of row %d after the waiting extension returned (%v later): acked %v, err %v; "+
			"the cancelled extension's transaction still holds its lock", a, time.Since(startAck), acked, err)
	}
}
