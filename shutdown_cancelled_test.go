package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

func init() {
	scenarios = append(scenarios, scenario{
		name: "shutdown with a context already cancelled under a busy queue leaves no row held",
		run:  cancelledShutdownScenario,
	})
}

// cancelledShutdownScenario: a service stopping on a signal calls Shutdown with a context
// that has already ended, while claims are in flight. Every claim started must be
// delivered or released: afterwards a fresh broker drains every row left at once (a row
// lock left open, a key left locked or a lease left standing would hold its row back for
// the lease or forever), and no key stays locked.
func cancelledShutdownScenario(t *testing.T, h *harness, form rowactor.Form) {
	const rounds, rows = 5, 60
	ids := h.publish(h.broker(rowactor.WithPollOnly()), rows)
	var handled atomic.Int64
	for range rounds {
		b := h.second()
		h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome {
			time.Sleep(time.Millisecond)
			handled.Add(1)
			return rowactor.Ack()
		}, rowactor.Workers(4), rowactor.PollInterval(5*time.Millisecond))
		start := handled.Load()
		waitFor(t, func() bool { return handled.Load() > start || handled.Load() >= rows })
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := b.Shutdown(ctx); err != nil && !strings.Contains(err.Error(), "context canceled") {
			t.Fatalf("Shutdown: %v", err)
		}
	}
	// Everything left must be claimable at once.
	left := h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s", h.table.Name))
	var drained atomic.Int64
	h.subscribe(h.second(), func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		drained.Add(1)
		return rowactor.Ack()
	}, rowactor.Workers(4), rowactor.PollInterval(20*time.Millisecond))
	deadline := time.Now().Add(10 * time.Second)
	for h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s", h.table.Name)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rows left after the shutdowns could not be claimed in 10 s (held by a claim the shutdowns leaked)\nlogs:\n%s",
				h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s", h.table.Name)), left, h.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if h.drv.keyLocked != nil && form == rowactor.FormAdvisory {
		for _, id := range ids {
			if key := strings.ReplaceAll(h.table.AdvisoryKey, "{id}", fmt.Sprint(id)); h.drv.keyLocked(t, h.d, key) {
				t.Fatalf("key %s still locked", key)
			}
		}
	}
}
