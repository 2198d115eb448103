package rowactor_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

func init() {
	scenarios = append(scenarios,
		scenario{name: "review16 slow handlers after fast ones do not hoard a backlog", forms: []rowactor.Form{rowactor.FormLease},
			run: review16SlowAfterFast},
	)
}

// review16SlowAfterFast: two processes of equal workers first drain a backlog of rows
// their handler finishes at once (the measured room grows), then their handler turns
// slow (100 ms: a downstream got slow, or the rows are of another kind). The contract:
// with slow handlers a subscription holds at most Workers plus about one row, and two
// processes with equal workers share a backlog (40–60%). The backlog of slow rows is
// made claimable to both at once (both paused while it is published, then resumed).
func review16SlowAfterFast(t *testing.T, h *harness, _ rowactor.Form) {
	const (
		fast    = 400
		rows    = 80
		workers = 4
	)
	// Each broker's claim latencies, read per phase (delta temporality): the room a
	// subscription may take is bounded by the slowest claim it made in the slow phase.
	tel := [2]*telemetryBundle{newDeltaTelemetry(t), newDeltaTelemetry(t)}
	one, two := h.broker(tel[0].options()...), h.second(tel[1].options()...)
	var (
		slow     atomic.Bool
		handled  [2]atomic.Int64
		finished sync.Map
	)
	handler := func(i int) rowactor.Handler {
		return func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			if slow.Load() {
				handled[i].Add(1)
				time.Sleep(100 * time.Millisecond)
				finished.Store(d.ID(), true)
			}
			return rowactor.Ack()
		}
	}
	s1 := h.subscribe(one, handler(0), rowactor.Workers(workers))
	s2 := h.subscribe(two, handler(1), rowactor.Workers(workers))
	h.publish(one, fast)
	h.waitSettled(fast)

	ctx := context.Background()
	if err := s1.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s2.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	slow.Store(true)
	for _, tb := range tel {
		tb.slowestSeconds(t, "rowactor.claim.duration") // forget the fast phase's claims
	}
	h.publish(one, rows)

	peak := sampleHeld(t, h, &finished)
	if err := s1.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s2.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	// A claim in flight as a Pause began gives its rows back (released, ErrClosed): they
	// are claimed again after the Resume. Every row is acked once.
	for acked := 0; acked < rows; {
		for _, s := range h.waitSettled(1) {
			switch {
			case s.Err == nil && s.Step == "ack":
				acked++
			case s.Released && errors.Is(s.Err, rowactor.ErrClosed):
			default:
				t.Fatalf("settlement %+v", s)
			}
		}
	}
	most := peak()
	a, b := handled[0].Load(), handled[1].Load()
	t.Logf("slow phase: peak rows held %d; processes handled %d and %d", most, a, b)
	// The hoarding this test guards against held 19 to 73 rows with claims of milliseconds.
	limit := roomBound(t, tel[:], workers, 100*time.Millisecond)
	if most > limit {
		t.Errorf("two subscriptions of %d workers with 100 ms handlers held %d rows at once; want at most %d (workers and one claim's worth of room each)", workers, most, limit)
	}
	if a+b != rows || a < rows*4/10 || b < rows*4/10 {
		t.Errorf("the two processes handled %d and %d of %d slow rows; want each 40–60%%", a, b, rows)
	}
}

func init() {
	scenarios = append(scenarios,
		scenario{name: "review16 rows waiting in the measured room keep their short leases", forms: []rowactor.Form{rowactor.FormLease},
			run: review16BacklogShortLease},
	)
}

// review16BacklogShortLease: two processes with Lease(1s) first drain instant rows (the
// room grows), then get rows whose handler takes 1.2 s, longer than the lease: rows wait
// in the room for several leases. The renewer must keep them alive, so no row is handled
// twice (once here, once by the other process after its lease ran out), and every
// settlement takes effect.
func review16BacklogShortLease(t *testing.T, h *harness, _ rowactor.Form) {
	const (
		fast    = 400
		rows    = 16
		workers = 2
	)
	one, two := h.broker(), h.second()
	var (
		slow    atomic.Bool
		mu      sync.Mutex
		calls   = map[int64]int{}
		running = map[int64]int{}
		overlap []int64
	)
	handler := func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if !slow.Load() {
			return rowactor.Ack()
		}
		mu.Lock()
		calls[d.ID()]++
		if running[d.ID()]++; running[d.ID()] > 1 {
			overlap = append(overlap, d.ID())
		}
		mu.Unlock()
		time.Sleep(1200 * time.Millisecond)
		mu.Lock()
		running[d.ID()]--
		mu.Unlock()
		return rowactor.Ack()
	}
	s1 := h.subscribe(one, handler, rowactor.Workers(workers), rowactor.Lease(time.Second))
	s2 := h.subscribe(two, handler, rowactor.Workers(workers), rowactor.Lease(time.Second))
	h.publish(one, fast)
	h.waitSettled(fast)
	ctx := context.Background()
	_ = s1.Pause(ctx)
	_ = s2.Pause(ctx)
	slow.Store(true)
	h.publish(one, rows)
	_ = s1.Resume(ctx)
	_ = s2.Resume(ctx)
	var got []rowactor.Settlement
	deadline := time.After(30 * time.Second)
	for acked := 0; acked < rows; {
		select {
		case s := <-h.settled:
			got = append(got, s)
			if s.Err == nil && s.Step == "ack" {
				acked++
			}
		case <-deadline:
			t.Fatalf("acked fewer than %d rows in 30 s: %+v", rows, got)
		}
	}
	h.quiet(1500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for _, s := range got {
		// A claim in flight as a Pause began gives its rows back (released, ErrClosed).
		if s.Err != nil && !(s.Released && errors.Is(s.Err, rowactor.ErrClosed)) {
			t.Errorf("settlement of row %d: %+v", s.ID, s)
		}
	}
	for id, n := range calls {
		if n != 1 {
			t.Errorf("row %d handled %d times", id, n)
		}
	}
	if len(overlap) > 0 {
		t.Errorf("rows handled twice at once: %v", overlap)
	}
}
