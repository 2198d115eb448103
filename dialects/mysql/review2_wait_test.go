package mysql

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// A waiting extension cut short by its context (the renewer's eighth-of-a-lease bound)
// must leave nothing behind: no lock on the rows it had already locked while it waited
// for a row another session holds. go-sql-driver/mysql answers a cancelled context by
// closing its socket; the server does not notice while the statement waits in the lock
// queue, so the dead transaction keeps the locks it took (row A here) for up to
// innodb_lock_wait_timeout (50 s by default): A's settlement and extension are held up by
// a statement that is not theirs.
func TestReview2WaitingExtensionCutShortHoldsNoLock(t *testing.T) {
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
