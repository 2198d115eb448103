package rowactor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

var earlyWorkerScenarios = []scenario{
	{
		name:  "a row lock or advisory delivery gives its worker back before its settlement's round trips",
		forms: []rowactor.Form{rowactor.FormRowLock, rowactor.FormAdvisory},
		run:   earlyWorkerScenario,
	},
}

// earlyWorkerScenario: one worker, two rows, and an ack whose DELETE takes 1.5 s (a
// trigger sleeps). The first row's handler returns; its settlement is under way on its
// own connection (row lock: the claim's transaction; advisory: its key's session) when the
// worker takes the second row: the second handler starts before the first settlement is
// reported. Holding the worker until the settlement ran would start it 1.5 s later.
func earlyWorkerScenario(t *testing.T, h *harness, _ rowactor.Form) {
	if !slowDeletes(t, h, 1500*time.Millisecond) {
		t.Skip("SQLite has no sleep for a trigger: no settlement can be made slow")
	}
	b := h.broker()
	ids := h.publish(b, 2)
	var (
		mu      sync.Mutex
		started = map[int64]time.Time{}
	)
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		mu.Lock()
		started[d.ID()] = time.Now()
		mu.Unlock()
		return rowactor.Ack()
	}, rowactor.Workers(1))
	settled := map[int64]time.Time{}
	for range ids {
		s := h.waitSettled(1)[0]
		if s.Err != nil || s.Step != "ack" {
			t.Fatalf("settlement %+v", s)
		}
		settled[s.ID] = time.Now()
	}
	mu.Lock()
	defer mu.Unlock()
	first, second := ids[0], ids[1]
	if started[first].After(started[second]) {
		first, second = second, first
	}
	if !started[second].Before(settled[first]) {
		t.Fatalf("the second row started %v after the first row's settlement was reported: its worker waited for the settlement",
			started[second].Sub(settled[first]))
	}
	for _, id := range ids {
		if h.row(id).exists {
			t.Fatalf("row %d outlived its ack", id)
		}
	}
}

// slowDeletes makes every DELETE of the harness's table take delay, where the database
// can sleep in a trigger.
func slowDeletes(t *testing.T, h *harness, delay time.Duration) bool {
	return sleepTrigger(t, h, "DELETE", delay)
}
