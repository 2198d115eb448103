package rowactor_test

import (
	"context"
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
	one, two := h.broker(), h.second()
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
	// Sample the rows held while the backlog drains: leased, and their handler not
	// returned (rows whose handler returned stay leased a little longer, until their
	// batched ack runs). Each broker holds at most its workers and one row of room.
	done := make(chan struct{})
	peak := make(chan int, 1)
	go func() {
		most := 0
		for {
			select {
			case <-done:
				peak <- most
				return
			case <-time.After(20 * time.Millisecond):
			}
			// The ids finished before the query: a row that finishes meanwhile is counted
			// held, which can only make the count larger.
			list := []string{"-1"}
			finished.Range(func(id, _ any) bool { list = append(list, strconv.FormatInt(id.(int64), 10)); return true })
			most = max(most, h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name+
				" WHERE locked_until IS NOT NULL AND id NOT IN ("+strings.Join(list, ",")+")"))
		}
	}()
	got := h.waitSettled(rows)
	close(done)
	for _, s := range got {
		if s.Err != nil || s.Step != "ack" {
			t.Fatalf("settlement %+v", s)
		}
	}
	// One claim's worth is the rows the workers finish while a claim is on its way: one
	// row for claims of a few milliseconds, two while a broker's first claims open their
	// connections (tens of milliseconds on PostgreSQL).
	if most, limit := <-peak, 2*(workers+2); most > limit {
		t.Errorf("two subscriptions of %d workers with 100 ms handlers held %d rows at once; want at most %d (workers and one claim's worth, a row or two, each)", workers, most, limit)
	}
	a, b := handled[0].Load(), handled[1].Load()
	if a+b != rows || a < rows*4/10 || b < rows*4/10 {
		t.Errorf("the two processes handled %d and %d of %d rows; want each 40–60%%", a, b, rows)
	}
}

// histogramMax reads the largest value recorded by an int64 histogram.
func (tb *telemetryBundle) histogramMax(t *testing.T, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tb.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var most int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if data, ok := m.Data.(metricdata.Histogram[int64]); ok && m.Name == name {
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
