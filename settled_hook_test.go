package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// TestSlowOnSettledHooksRunSideBySide: the lease form's batched settlements finish on the
// goroutine of the batch's leader while they are quick, and a WithOnSettled hook runs as
// each finishes. A slow hook must not make the rest of its batch wait behind it: past a
// millisecond, the leader hands each remaining settlement to a goroutine of its own, and
// the hooks run side by side, as they did when every settlement had its own goroutine.
func TestSlowOnSettledHooksRunSideBySide(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			var (
				mu            sync.Mutex
				running, most int
				acked         = map[int64]int{}
			)
			b := h.broker(rowactor.WithOnSettled(func(s rowactor.Settlement) {
				mu.Lock()
				running++
				most = max(most, running)
				if s.Err == nil && s.Step == "ack" {
					acked[s.ID]++
				}
				mu.Unlock()
				time.Sleep(30 * time.Millisecond)
				mu.Lock()
				running--
				mu.Unlock()
			}))
			const n = 40
			release := subscribeHeldAcks(h, b, n)
			ids := h.publish(b, n)
			release()
			waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) == n && running == 0 })
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				if acked[id] != 1 {
					t.Errorf("row %d acked %d times in the hook, want once", id, acked[id])
				}
				if h.row(id).exists {
					t.Errorf("row %d is still in the table", id)
				}
			}
			if most < 4 {
				t.Errorf("at most %d hooks of 30 ms ran at once for %d rows settled together; want them side by side", most, n)
			}
		})
	}
}

// TestAHookThatWaitsForAnotherRowOfItsBatchHoldsNothingUp: a WithOnSettled hook may block
// on another row of the same settlement batch (it waits for that row's hook, or cancels
// it with Broker.Cancel). The batch's leader, which finishes the batch's rows on its own
// goroutine, once ran the first row's hook and never reached the second: the first hook
// waited out its own timeout, and a Cancel its context. The rows the leader has not begun
// go to goroutines of their own a millisecond into the batch, whatever it is inside.
func TestAHookThatWaitsForAnotherRowOfItsBatchHoldsNothingUp(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, how := range []string{"waits for its hook", "cancels it"} {
			t.Run(drv.name+"/"+how, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, drv, rowactor.FormLease)
				const n = 2
				var (
					mu     sync.Mutex
					ids    []int64
					called = map[int64]bool{}
					b      *rowactor.Broker
					ready  = make(chan struct{})
					both   = make(chan struct{})
					errs   = make(chan error, n)
				)
				b = h.broker(rowactor.WithOnSettled(func(s rowactor.Settlement) {
					<-ready
					mu.Lock()
					called[s.ID] = true
					first := len(called) == 1
					if len(called) == n {
						close(both)
					}
					other := ids[0]
					if other == s.ID {
						other = ids[1]
					}
					mu.Unlock()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					if how == "cancels it" {
						// The first hook cancels the other row, whose settlement ran in the same
						// batch: the Cancel finds it settled, or ended, at once.
						if first {
							errs <- b.Cancel(ctx, h.table, other, "from a hook")
						} else {
							errs <- nil
						}
						return
					}
					select {
					case <-both:
						errs <- nil
					case <-ctx.Done():
						errs <- fmt.Errorf("row %d's hook waited 5 s for row %d's", s.ID, other)
					}
				}))
				release := subscribeHeldAcks(h, b, n)
				mu.Lock()
				ids = h.publish(b, n)
				mu.Unlock()
				close(ready)
				release() // both rows settle in one batch
				for range n {
					if err := <-errs; err != nil && !errors.Is(err, rowactor.ErrNotFound) && !errors.Is(err, rowactor.ErrFinished) {
						t.Error(err)
					}
				}
			})
		}
	}
}

// subscribeHeldAcks subscribes n workers whose handlers wait and then ack: release, once
// n rows were published, waits until all n handlers began and lets them return together,
// so that their settlements meet in few batches.
func subscribeHeldAcks(h *harness, b *rowactor.Broker, n int) (release func()) {
	gate := make(chan struct{})
	var started sync.WaitGroup
	started.Add(n)
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		started.Done()
		<-gate
		return rowactor.Ack()
	}, rowactor.Workers(n))
	return func() {
		started.Wait()
		close(gate)
	}
}
