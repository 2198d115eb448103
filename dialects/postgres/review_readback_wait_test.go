package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// TestReviewWaitCancelledWithoutDeadlineChangesNothing: a waiting ack and a waiting
// extension whose context has no deadline (no lock_timeout is set then) and is cancelled
// while another session holds the row change nothing, also once that session commits.
func TestReviewWaitCancelledWithoutDeadlineChangesNothing(t *testing.T) {
	d := newDialect(t)
	tbl, q, held := reviewClaimOne(t, d)
	other, err := d.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	if _, err := other.Exec(ctx, "UPDATE "+quote(tbl.Name)+" SET payload = payload WHERE id = $1", held.ID); err != nil {
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
	done, err := q.SettleLeaseWaiting(cut(), dialects.Step{Kind: dialects.StepAck, Now: time.Now()}, held)
	if done || err == nil {
		t.Fatalf("waiting ack cancelled: done %v, err %v", done, err)
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if found, err := q.Holding(ctx, []dialects.Lease{held}); err != nil || len(found) != 1 {
		t.Fatalf("the row after the cancelled waits no longer holds its token: %v %v", found, err)
	}
}
