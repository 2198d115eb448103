package mysql

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// A claim, a renewal round and a batched settlement that meet an id list of a length not
// prepared before must not prepare it for the pool while their transaction holds a
// connection: on a pool of one connection that prepare would wait for a second one until
// the statement's deadline. Each call here uses a new list length on a pool of one.
func TestNewListLengthsInATransactionNeedNoSecondConnection(t *testing.T) {
	d := newDialect(t)
	d.DB().SetMaxOpenConns(1)
	tbl := newTable(t, d, "prep", leaseTable)
	for range 40 {
		dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("x")})
	}
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl})
	bq := q.(dialects.LeaseBatchQueue)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var held []dialects.Lease
	for _, limit := range []int{3, 5, 9, 17} { // list slots 2, 3, 4, 5
		now := time.Now()
		rows, err := q.ClaimLeases(cctx, now, now.Add(time.Minute), limit)
		if err != nil {
			t.Fatalf("claim of %d rows on a pool of one: %v", limit, err)
		}
		if len(rows) != limit {
			t.Fatalf("claimed %d rows, want %d", len(rows), limit)
		}
		for _, r := range rows {
			held = append(held, dialects.Lease{ID: r.ID, Token: r.Token})
		}
	}
	extended, err := q.ExtendLeases(cctx, time.Now().Add(2*time.Minute), held[:11])
	if err != nil || len(extended) != 11 {
		t.Fatalf("extend 11 leases on a pool of one: %d, %v", len(extended), err)
	}
	settled, err := bq.SettleLeases(cctx, dialects.StepRelease, time.Now(), held[11:])
	if err != nil || len(settled) != len(held)-11 {
		t.Fatalf("release %d leases on a pool of one: %d, %v", len(held)-11, len(settled), err)
	}
}
