package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

var batchScenarios = []scenario{
	{name: "acks settled together settle the rows holding their tokens and report the rest lost", forms: []rowactor.Form{rowactor.FormLease},
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			const rows = 24
			b := h.broker()
			other := time.Now().Add(time.Hour).Truncate(time.Second)
			stale := func(id int64) bool { return id%4 == 0 }
			h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
				if stale(d.ID()) {
					// Another claim took the row: its token replaces ours.
					h.exec(fmt.Sprintf("UPDATE %s SET locked_until = ? WHERE id = ?", h.table.Name), h.drv.timeValue(other), d.ID())
				}
				time.Sleep(5 * time.Millisecond) // several settlements meet in one batch
				return rowactor.Ack()
			}, rowactor.Workers(8))
			ids := h.publish(b, rows)
			seen := map[int64]int{}
			for _, s := range h.waitSettled(rows) {
				seen[s.ID]++
				switch {
				case stale(s.ID) && !errors.Is(s.Err, rowactor.ErrLeaseLost):
					t.Errorf("row %d: %+v, want ErrLeaseLost", s.ID, s)
				case !stale(s.ID) && s.Err != nil:
					t.Errorf("row %d: %+v", s.ID, s)
				}
			}
			for _, id := range ids {
				st := h.row(id)
				switch {
				case seen[id] != 1:
					t.Errorf("row %d settled %d times", id, seen[id])
				case stale(id) && (!st.exists || st.lockedUntil == nil || !st.lockedUntil.Equal(other)):
					t.Errorf("stale row %d changed: %+v", id, st)
				case !stale(id) && st.exists:
					t.Errorf("row %d still exists after its ack", id)
				}
			}
		}},
	{name: "prefetched rows wait for a worker and go back at shutdown", forms: []rowactor.Form{rowactor.FormLease},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b := h.broker()
			var inWork, peak, calls atomic.Int64
			release := make(chan struct{})
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				calls.Add(1)
				n := inWork.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				<-release
				inWork.Add(-1)
				return rowactor.Ack()
			}, rowactor.Workers(2), rowactor.Prefetch(3), rowactor.Lease(time.Hour))
			ids := h.publish(b, 8)
			// Two rows in work, three more claimed and waiting: five leased, three due.
			waitFor(t, func() bool {
				return h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name+" WHERE locked_until IS NOT NULL") == 5
			})
			time.Sleep(200 * time.Millisecond)
			if p, n := peak.Load(), h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name+" WHERE locked_until IS NOT NULL"); p != 2 || n != 5 {
				t.Fatalf("peak %d handlers with Workers(2), %d rows leased with Prefetch(3); want 2 and 5", p, n)
			}
			// Shutdown lets the two in work settle and gives the waiting three back at once.
			done := make(chan struct{})
			go func() {
				defer close(done)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				rep, err := b.Shutdown(ctx)
				if err != nil || !rep.Drained || rep.Released != 3 {
					t.Errorf("Shutdown: %+v, %v; want drained with the 3 waiting rows released", rep, err)
				}
			}()
			var closed int
			for _, s := range h.waitSettled(3) {
				if !errors.Is(s.Err, rowactor.ErrClosed) || !s.Released {
					t.Fatalf("waiting row %d: %+v, want released with ErrClosed", s.ID, s)
				}
				closed++
			}
			close(release)
			for _, s := range h.waitSettled(2) {
				if s.Err != nil || s.Step != "ack" {
					t.Fatalf("row in work %d: %+v", s.ID, s)
				}
			}
			<-done
			if n := calls.Load(); n != 2 {
				t.Fatalf("handler called %d times, want 2: waiting rows must not start after the drain began", n)
			}
			left := 0
			for _, id := range ids {
				if st := h.row(id); st.exists {
					left++
					if st.lockedUntil != nil {
						t.Errorf("row %d still leased after shutdown: %+v", id, st)
					}
				}
			}
			if left != 6 {
				t.Fatalf("%d rows left, want 6 (8 published, 2 acked)", left)
			}
		}},
}
