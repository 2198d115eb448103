package rowactor_test

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// The busy lane settles one row at a time, each waiting for its lock up to the settle
// timeout (30 s), and every request in it is pinned: its lease is no longer renewed. A row
// whose lock ended at once waits behind a row another session holds for long; its lease
// runs out in the queue, another process claims it (the lock is gone, the lease ended) and
// delivers it a second time although its handler acked long before.
func TestReview2BusyLaneHeadOfLineCostsALease(t *testing.T) {
	for _, drv := range serverDrivers() {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			b := h.broker()
			ids := h.publish(b, 2)
			long, short := ids[0], ids[1]
			release := map[int64]chan struct{}{long: make(chan struct{}), short: make(chan struct{})}
			started := make(chan int64, 4)
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				started <- d.ID()
				<-release[d.ID()]
				return rowactor.Ack()
			}, rowactor.Workers(2), rowactor.Lease(2*time.Second))
			for range ids {
				select {
				case <-started:
				case <-time.After(15 * time.Second):
					t.Fatal("the rows were not all delivered")
				}
			}
			second := newCalls()
			h.subscribe(h.second(), func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				second.add(d)
				return rowactor.Ack()
			}, rowactor.Workers(2), rowactor.Lease(2*time.Second))

			endLong := holdRow(t, h, long) // a long report holds this row
			defer endLong()
			close(release[long]) // its ack waits in the lane
			time.Sleep(300 * time.Millisecond)
			endShort := holdRow(t, h, short) // a moment's lock on the other
			close(release[short])            // its ack is busy: into the lane, behind the long one
			time.Sleep(300 * time.Millisecond)
			endShort()

			deadline := time.Now().Add(6 * time.Second)
			for h.row(short).exists && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			n := len(second.of(short))
			exists := h.row(short).exists
			endLong()
			if n > 0 || exists {
				t.Fatalf("row %d, acked by its handler and locked for 300 ms only, was not acked by its own delivery within 6 s "+
					"(still there: %v; delivered again by another process %d times): its ack waited in the busy lane behind row %d, "+
					"which another session held, with its lease pinned and not renewed\nlogs:\n%s",
					short, exists, n, long, h.logs.String())
			}
		})
	}
}
