package rowactor_test

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/rowactor/rowactor"
)

func init() {
	scenarios = append(scenarios,
		scenario{name: "without Prefetch, fast handlers get rows claimed ahead of their workers", forms: []rowactor.Form{rowactor.FormLease},
			run: fastHandlersClaimAhead},
		scenario{name: "without Prefetch, slow handlers hold Workers plus one and share a backlog with another process", forms: []rowactor.Form{rowactor.FormLease},
			run: slowHandlersDoNotHoard},
	)
}

// fastHandlersClaimAhead: one worker and an instant handler. Claiming only for free
// workers, no claim could take more than one row; the measured room (claim latency over
// handling time) makes claims take the next rows while the worker is busy, so some claim
// takes more rows than there are workers.
func fastHandlersClaimAhead(t *testing.T, h *harness, _ rowactor.Form) {
	tel := newTelemetry(t)
	b := h.broker(tel.options()...)
	const rows = 150
	h.publish(b, rows)
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }, rowactor.Workers(1))
	for _, s := range h.waitSettled(rows) {
		if s.Err != nil || s.Step != "ack" {
			t.Fatalf("settlement %+v", s)
		}
	}
	if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name); n != 0 {
		t.Fatalf("%d rows left after every ack", n)
	}
	if most := tel.histogramMax(t, "rowactor.claim.rows"); most <= 1 {
		t.Fatalf("the largest claim took %d rows with Workers(1) and an instant handler; want more than one (rows claimed ahead of the worker)", most)
	}
}

// slowHandlersDoNotHoard: two brokers on pools of their own (two processes, as far as the
// table can tell) with equal workers and 100 ms handlers drain one backlog. Each holds
// at most its workers plus one claim's worth (the room a 100 ms handler measures is a row
// or two), so each handles 40–60% of the rows.
func slowHandlersDoNotHoard(t *testing.T, h *harness, _ rowactor.Form) {
	const (
		rows    = 60
		workers = 3
	)
	tel := [2]*telemetryBundle{newDeltaTelemetry(t), newDeltaTelemetry(t)}
	one, two := h.broker(tel[0].options()...), h.second(tel[1].options()...)
	h.publish(one, rows)
	var (
		handled  [2]atomic.Int64
		finished sync.Map // ids whose handler returned
	)
	handler := func(i int) rowactor.Handler {
		return func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			handled[i].Add(1)
			time.Sleep(100 * time.Millisecond)
			finished.Store(d.ID(), true)
			return rowactor.Ack()
		}
	}
	h.subscribe(one, handler(0), rowactor.Workers(workers))
	h.subscribe(two, handler(1), rowactor.Workers(workers))
	peak := sampleHeld(t, h, &finished)
	got := h.waitSettled(rows)
	most := peak()
	for _, s := range got {
		if s.Err != nil || s.Step != "ack" {
			t.Fatalf("settlement %+v", s)
		}
	}
	if limit := roomBound(t, tel[:], workers, 100*time.Millisecond); most > limit {
		t.Errorf("two subscriptions of %d workers with 100 ms handlers held %d rows at once; want at most %d (workers and one claim's worth of room each)", workers, most, limit)
	}
	a, b := handled[0].Load(), handled[1].Load()
	if a+b != rows || a < rows*4/10 || b < rows*4/10 {
		t.Errorf("the two processes handled %d and %d of %d rows; want each 40–60%%", a, b, rows)
	}
}

// sampleHeld samples, every 20 ms until the returned func is called, the rows the table
// holds for handlers that have not returned: leased, and not in finished (a returned row
// stays leased until its batched ack commits). A row whose handler returns while the
// sample's query runs is counted held though its worker may already have claimed the
// next one: those rows are taken off, so a sample never counts more than was held. The
// func returns the largest sample.
func sampleHeld(t *testing.T, h *harness, finished *sync.Map) func() int {
	done := make(chan struct{})
	peak := make(chan int, 1)
	go func() {
		most := 0
		for {
			list := []string{"-1"}
			finished.Range(func(id, _ any) bool { list = append(list, strconv.FormatInt(id.(int64), 10)); return true })
			held := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name+
				" WHERE locked_until IS NOT NULL AND id NOT IN ("+strings.Join(list, ",")+")")
			after := 0
			finished.Range(func(any, any) bool { after++; return true })
			most = max(most, held-(after-(len(list)-1)))
			select {
			case <-done:
				peak <- most
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() int { close(done); return <-peak }
}

// roomBound is the most rows subscriptions of workers workers, one per broker measured
// by tel, may hold with handlers that take at least work: each its workers and one
// claim's worth of room, ceil(workers × claim / work), claim being the quickest of its
// latest claims (actors/room.go). The slowest claim each broker made since tel was last
// read bounds that from above whatever the machine's load: claims of 75 ms on a loaded
// CI run gave 3 rows of room, a hoarding subscription holds its whole room of rows.
func roomBound(t *testing.T, tel []*telemetryBundle, workers int, work time.Duration) int {
	t.Helper()
	limit := 0
	for i, tb := range tel {
		slowest := tb.slowestSeconds(t, "rowactor.claim.duration")
		room := int(math.Ceil(float64(workers) * slowest / work.Seconds()))
		t.Logf("broker %d: slowest claim %.0f ms, room at most %d", i, slowest*1000, room)
		limit += workers + room
	}
	return limit
}

// histogramMax reads the largest value recorded by an int64 histogram.
func (tb *telemetryBundle) histogramMax(t *testing.T, name string) int64 {
	t.Helper()
	return histogramMaxOf[int64](t, tb, name)
}

// histogramMaxOf reads the largest value a histogram of N named name recorded.
func histogramMaxOf[N int64 | float64](t *testing.T, tb *telemetryBundle, name string) N {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tb.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var most N
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if data, ok := m.Data.(metricdata.Histogram[N]); ok && m.Name == name {
				for _, dp := range data.DataPoints {
					if v, ok := dp.Max.Value(); ok {
						most = max(most, v)
					}
				}
			}
		}
	}
	return most
}
