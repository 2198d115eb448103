package rowactor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// On MariaDB a FIFO group's guard (every claim's first statement) locks every unfinished
// row of the group, FOR UPDATE SKIP LOCKED, for the claim's transaction: the head in work
// too. Since 3fe98c6 the renewer skips a row another session holds and comes back an
// eighth of a lease later, never waiting; a group whose claims run back to back (its
// subscribers woken by publishes into it, on one host or several) keeps its head locked
// most of the time, so round after round finds the head busy, its lease runs out while
// its handler still runs, and the head is claimed and delivered a second time. Before,
// the round waited a moment for the claim's transaction and moved the lease.
func TestFIFOHeadLeaseSurvivesTheGroupsOwnClaims(t *testing.T) {
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
	}, rowactor.Workers(2), rowactor.Lease(time.Second))
	waitFor(t, func() bool { return firsts.Load() == 1 })

	// Another host subscribes to the group, and rows keep arriving behind the head.
	b2 := h.second()
	h.subscribe(b2, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if d.ID() == head {
			seconds.Add(1)
		}
		return rowactor.Ack()
	}, rowactor.Workers(2), rowactor.Lease(time.Second))
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
	// The head's handler runs ten leases long.
	time.Sleep(10 * time.Second)
	close(stop)
	wg.Wait()
	close(release)
	if n := firsts.Load() + seconds.Load(); n != 1 {
		t.Fatalf("the group's head was delivered %d times while its first delivery still ran (lease 1 s, handler 10 s): "+
			"its renewals were skipped while the group's own claims held it\nlogs:\n%s", n, h.logs.String())
	}
}
