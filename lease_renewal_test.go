package rowactor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// TestOneBusyRowDoesNotMultiplyTheRenewersWrites proves that one row another session keeps
// locked (an operator's forgotten transaction, a report) costs the renewer that row's
// retries, not more: the other leases in work still move once per half lease, not every
// Lease/8 for as long as the lock lasts, and the busy row's lease moves soon after the
// lock ends.
func TestOneBusyRowDoesNotMultiplyTheRenewersWrites(t *testing.T) {
	t.Parallel()
	for _, drv := range serverDrivers() {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			b := h.broker()
			ids := h.publish(b, 2)
			locked, free := ids[0], ids[1]
			release := make(chan struct{})
			started := make(chan int64, 2)
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				started <- d.ID()
				<-release
				return rowactor.Ack()
			}, rowactor.Workers(2), rowactor.Lease(8*time.Second))
			defer close(release)
			for range ids {
				<-started
			}
			unlock := holdRow(t, h, locked)
			defer unlock()
			// Watch the free row's lease for three half leases: a round every 4 s moves it
			// three or four times.
			var moves int
			last := h.row(free).lockedUntil
			for end := time.Now().Add(12 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				lu := h.row(free).lockedUntil
				if lu != nil && last != nil && !lu.Equal(*last) {
					moves++
				}
				last = lu
			}
			if moves > 4 {
				t.Fatalf("the free row's lease moved %d times in 12 s (lease 8 s: a round every 4 s) while one other row "+
					"was locked: every busy retry moves every lease in work", moves)
			}
			// The busy row's own retries go on: once the lock ends, its lease moves within
			// a retry or two (an eighth of a lease each), not only at the next round.
			before := h.row(locked).lockedUntil
			unlock()
			waitFor(t, func() bool {
				lu := h.row(locked).lockedUntil
				return lu != nil && before != nil && lu.After(*before)
			})
		})
	}
}

// TestFIFOHeadLeaseSurvivesTheGroupsOwnClaims proves that on MariaDB a FIFO group's head
// in work keeps its lease while the group's own claims run back to back, and is delivered
// once. Every claim's first statement, the group's guard, locks every unfinished row of
// the group (FOR UPDATE SKIP LOCKED) for the claim's transaction, the head in work too, so
// a renewer that only skipped the busy head would let its lease run out while its handler
// still runs.
func TestFIFOHeadLeaseSurvivesTheGroupsOwnClaims(t *testing.T) {
	t.Parallel()
	h := newHarness(t, driverNamed(t, "mysql"), rowactor.FormLease, withFIFO, withProcessedAt)
	b1 := h.broker()
	head := h.publish(b1, 1)[0]
	var firsts, seconds atomic.Int64
	release := make(chan struct{})
	h.subscribe(b1, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if d.ID() == head {
			firsts.Add(1)
			<-release
		}
		return rowactor.Ack()
	}, rowactor.Workers(2), rowactor.Lease(2*time.Second))
	waitFor(t, func() bool { return firsts.Load() == 1 })

	// Another host subscribes to the group, and rows keep arriving behind the head.
	b2 := h.second()
	h.subscribe(b2, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if d.ID() == head {
			seconds.Add(1)
		}
		return rowactor.Ack()
	}, rowactor.Workers(2), rowactor.Lease(2*time.Second))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, pb := range []*rowactor.Broker{b1, b2, b1, b2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := pb.Publish(context.Background(), h.table, h.queue, []byte("behind")); err != nil {
					return
				}
			}
		}()
	}
	// The head's handler runs five leases long. (Leases of 1 s lost the head once on a
	// loaded CI machine, a renewal coming later than half a second before its end.)
	time.Sleep(10 * time.Second)
	close(stop)
	wg.Wait()
	close(release)
	if n := firsts.Load() + seconds.Load(); n != 1 {
		t.Fatalf("the group's head was delivered %d times while its first delivery still ran (lease 2 s, handler 10 s): "+
			"its renewals were skipped while the group's own claims held it\nlogs:\n%s", n, h.logs.String())
	}
}
