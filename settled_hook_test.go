package rowactor_test

import (
	"context"
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
			// The handlers wait until every row is claimed, so that their settlements
			// meet in few batches.
			const n = 40
			release := make(chan struct{})
			var started sync.WaitGroup
			started.Add(n)
			h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome {
				started.Done()
				<-release
				return rowactor.Ack()
			}, rowactor.Workers(n))
			ids := h.publish(b, n)
			started.Wait()
			close(release)
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
