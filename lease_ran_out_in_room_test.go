package rowactor_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// TestRowWhoseLeaseRanOutInTheRoomIsNotStarted: when a write stall (an exclusive table
// lock held longer than a lease) lets the leases of rows waiting in a busy process's room
// run out and another process claims them, the first process does not start those rows.
func TestRowWhoseLeaseRanOutInTheRoomIsNotStarted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, driverNamed(t, "postgres"), rowactor.FormLease)
	a, b := h.broker(), h.second()
	var (
		slow     atomic.Bool
		gate     = make(chan struct{})
		first    atomic.Bool
		mu       sync.Mutex
		running  = map[int64]string{}
		overlaps []string
		handled  = map[string]int{}
	)
	enter := func(who string, id int64) {
		mu.Lock()
		defer mu.Unlock()
		handled[who]++
		if other, ok := running[id]; ok && who == "A" {
			// A starts a row B is handling: A's lease of it ran out before A started it.
			overlaps = append(overlaps, fmt.Sprintf("row %d: A started it while %s handled it", id, other))
		}
		running[id] = who
	}
	leave := func(id int64) { mu.Lock(); delete(running, id); mu.Unlock() }
	sa := h.subscribe(a, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if !slow.Load() {
			return rowactor.Ack()
		}
		enter("A", d.ID())
		defer leave(d.ID())
		if first.CompareAndSwap(false, true) {
			<-gate // busy until after the stall
		} else {
			time.Sleep(1500 * time.Millisecond)
		}
		return rowactor.Ack()
	}, rowactor.Workers(1), rowactor.Lease(time.Second), rowactor.Prefetch(5))
	ctx := context.Background()
	if err := sa.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	slow.Store(true)
	h.publish(a, 12)
	if err := sa.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	leased := func() int {
		return h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name+" WHERE locked_until IS NOT NULL")
	}
	waitFor(t, func() bool { return leased() >= 3 })
	t.Logf("A holds %d rows with one worker", leased())

	// B joins; its claims queue behind the lock.
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		enter("B", d.ID())
		defer leave(d.ID())
		time.Sleep(1500 * time.Millisecond)
		return rowactor.Ack()
	}, rowactor.Workers(4), rowactor.Lease(time.Second))

	pool := pgPool(h.d)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgQuote(h.table.Name)+" IN EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // two leases: every lease in A's room runs out
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	close(gate)
	deadline := time.Now().Add(20 * time.Second)
	for h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	// The table is empty: a row goes at its ack, after its handler returned, so no handler
	// of B still runs and a start by A can no longer meet one.
	mu.Lock()
	defer mu.Unlock()
	t.Logf("handled: %v", handled)
	if len(overlaps) > 0 {
		t.Errorf("A started %d rows that B was handling (%v): rows whose leases ran out while they waited in A's room were started", len(overlaps), overlaps)
	}
}
