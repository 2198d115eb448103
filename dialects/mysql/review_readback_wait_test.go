package mysql

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// TestReviewWaitCancelledWithoutDeadlineChangesNothing: a waiting ack and a waiting
// extension whose context has no deadline and is cancelled while another session holds
// the row change nothing, also once that session commits, and name the table.
func TestReviewWaitCancelledWithoutDeadlineChangesNothing(t *testing.T) {
	d := newDialect(t)
	tbl := dialects.Table{Name: tableName(t, d, "ra_rbw"), ID: "id", Payload: "payload", Attempt: "attempt", LockedUntil: "locked_until"}
	ddl, err := d.Schema(tbl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.DB().ExecContext(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl}).(dialects.LeaseBatchQueue)
	now := time.Now()
	held := dialects.Lease{ID: id, Token: now.Truncate(time.Second).Add(30 * time.Second)}
	if rows, err := q.ClaimLeases(ctx, now, held.Token, 1); err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", dialecttest.IDs(rows), err)
	}
	other, err := d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	if _, err := other.ExecContext(ctx, "UPDATE "+quote(tbl.Name)+" SET payload = payload WHERE id = ?", id); err != nil {
		t.Fatal(err)
	}
	cut := func() context.Context {
		c, cancel := context.WithCancel(ctx)
		time.AfterFunc(300*time.Millisecond, cancel)
		return c
	}
	moved, err := q.(dialects.WaitingExtender).ExtendLeasesWaiting(cut(), held.Token.Add(time.Minute), []dialects.Lease{held})
	if len(moved) != 0 || err == nil {
		t.Fatalf("waiting extension cancelled: moved %v, err %v", moved, err)
	}
	dialecttest.Contains(t, err.Error(), tbl.Name)
	done, err := q.SettleLeaseWaiting(cut(), dialects.Step{Kind: dialects.StepAck, Now: now}, held)
	if done || err == nil {
		t.Fatalf("waiting ack cancelled: done %v, err %v", done, err)
	}
	dialecttest.Contains(t, err.Error(), tbl.Name)
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if found, err := q.Holding(ctx, []dialects.Lease{held}); err != nil || len(found) != 1 {
		t.Fatalf("the row after the cancelled waits no longer holds its token: %v %v", found, err)
	}
}
