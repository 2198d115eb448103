package rowactor_test

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/internal/testhook"
)

// TestAStopAsAHandlerReturnsEndsItsRowOnce: as a lease handler returns, its goroutine
// plans the settlement and queues it in a batch, while a Shutdown's stop may reach the
// delivery: one of them takes the row (the delivery's state). The stop that took it once
// released the row through the delivery's own batch request, which the handler's goroutine
// was filling at that moment: a data race, and a panic ("Prepare of a used
// BatchRequest") that took the process down. The test widens that window with a pause in
// it (testhook.BeforeQueueing), and stops the subscription as the handlers return: each
// row is reported once (and a second time only as a claim in flight took it again after
// the stop released it, and gave it back unstarted), and the report matches the table
// (acked rows processed, the others not). Run it under -race.
func TestAStopAsAHandlerReturnsEndsItsRowOnce(t *testing.T) {
	t.Parallel()
	var tables sync.Map // the tables whose deliveries pause before queueing
	pause := func(table string) {
		if _, ok := tables.Load(table); ok {
			time.Sleep(300 * time.Microsecond)
		}
	}
	if !testhook.BeforeQueueing.CompareAndSwap(nil, &pause) {
		t.Fatal("testhook.BeforeQueueing is taken by another test")
	}
	t.Cleanup(func() { testhook.BeforeQueueing.Store(nil) })
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			for round := range 5 {
				h := newHarness(t, drv, rowactor.FormLease, withProcessedAt)
				tables.Store(h.table.Name, true)
				var (
					mu   sync.Mutex
					told = map[int64][]rowactor.Settlement{}
					n    atomic.Int64
				)
				b := h.broker(rowactor.WithOnSettled(func(s rowactor.Settlement) {
					mu.Lock()
					told[s.ID] = append(told[s.ID], s)
					mu.Unlock()
					n.Add(1)
				}))
				const rows = 128
				var started sync.WaitGroup
				started.Add(rows)
				gate := make(chan struct{})
				h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
					started.Done()
					<-gate
					time.Sleep(time.Duration(d.ID()%16) * 200 * time.Microsecond) // spread over the stop
					return rowactor.Ack()
				}, rowactor.Workers(rows))
				ids := h.publish(b, rows)
				started.Wait()
				close(gate) // the handlers return, over 3 ms, as the stop comes
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(round)*400*time.Microsecond)
				_, _ = b.Shutdown(ctx)
				cancel()
				waitFor(t, func() bool { return n.Load() >= rows })
				h.quiet(50 * time.Millisecond)
				mu.Lock()
				for _, id := range ids {
					ss := told[id]
					slices.SortFunc(ss, func(a, b rowactor.Settlement) int { return cmp.Compare(a.Attempt, b.Attempt) })
					// A claim in flight as the stop came (a poll's) may take a row the stop
					// had just released: that second delivery never starts, and is given
					// back as the stop found it. Each delivery is reported once.
					if len(ss) == 2 && ss[1].Attempt > ss[0].Attempt && ss[1].Step == "release" && ss[1].Released &&
						errors.Is(ss[1].Err, rowactor.ErrClosed) && ss[0].Step == "release" {
						ss = ss[:1]
					}
					if len(ss) != 1 {
						t.Errorf("round %d: row %d reported %d times: %+v", round, id, len(ss), ss)
						continue
					}
					acked := ss[0].Step == "ack" && ss[0].Err == nil
					if r := h.row(id); acked != (r.processedAt != nil) {
						t.Errorf("round %d: row %d reported %s (%v), but processed_at %v", round, id, ss[0].Step, ss[0].Err, r.processedAt)
					}
				}
				mu.Unlock()
			}
		})
	}
}
