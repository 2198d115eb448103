package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

func init() { scenarios = append(scenarios, batchScenarios...) }

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
}
