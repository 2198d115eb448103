package rowactor_test

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// A lease settlement that waits for a lock another session holds on its row (a report
// reading the row FOR UPDATE, an operator's transaction) must not hold up the
// settlements of the subscription's other rows: they queue in the batcher behind the
// statement that waits, and their workers with them.
func TestASettlementWaitingForALockHoldsUpNoOther(t *testing.T) {
	t.Parallel()
	for _, drv := range serverDrivers() {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			b := h.broker()
			ids := h.publish(b, 3)
			locked := ids[0]
			release := map[int64]chan struct{}{}
			for _, id := range ids {
				release[id] = make(chan struct{})
			}
			started := make(chan int64, 3)
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				started <- d.ID()
				<-release[d.ID()]
				return rowactor.Ack()
			}, rowactor.Workers(3), rowactor.Lease(30*time.Second))
			for range ids {
				select {
				case <-started:
				case <-time.After(15 * time.Second):
					t.Fatal("the rows were not all delivered")
				}
			}

			// Another session holds the first row; its delivery acks and waits for it.
			unlock := holdRow(t, h, locked)
			defer unlock()
			close(release[locked])
			time.Sleep(300 * time.Millisecond) // the ack is waiting on the server now
			for _, id := range ids[1:] {
				close(release[id])
			}
			// The other rows' acks go through while the lock is still held.
			waitFor(t, func() bool { return !h.row(ids[1]).exists && !h.row(ids[2]).exists })
			if !h.row(locked).exists {
				t.Fatal("the locked row was acked through another session's lock")
			}
			unlock()
			waitFor(t, func() bool { return !h.row(locked).exists })
			for _, s := range h.waitSettled(3) {
				if s.Err != nil || s.Step != "ack" {
					t.Errorf("settlement %+v, want an ack", s)
				}
			}
		})
	}
}

// holdRow opens a transaction of the test's own that holds row id FOR UPDATE, and returns
// its end (which may be called more than once).
func holdRow(t *testing.T, h *harness, id int64) (end func()) {
	t.Helper()
	ctx := context.Background()
	switch h.drv.name {
	case "postgres":
		tx, err := pgPool(h.d).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT 1 FROM "+pgQuote(h.table.Name)+" WHERE id = $1 FOR UPDATE", id); err != nil {
			t.Fatal(err)
		}
		return func() { _ = tx.Rollback(ctx) }
	case "mysql":
		tx, err := mysqlDB(h.d).BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "SELECT id FROM `"+h.table.Name+"` WHERE id = ? FOR UPDATE", id); err != nil {
			t.Fatal(err)
		}
		return func() { _ = tx.Rollback() }
	}
	t.Fatalf("%s has no row locks", h.drv.name)
	return nil
}
