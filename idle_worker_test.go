package rowactor_test

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

var idleWorkerScenarios = []scenario{
	{
		name: "a worker freed by an ack takes a due row at once, not at the next poll or settlement",
		run:  freedWorkerScenario,
	},
}

// freedWorkerScenario: four due rows, three workers, handlers that hold their rows. When
// one handler acks, the fourth row must start while the other two still run, long before
// the (one minute) poll: a free worker never idles while a row is due.
func freedWorkerScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	ids := h.publish(b, 4)
	release := map[int64]chan struct{}{}
	for _, id := range ids {
		release[id] = make(chan struct{})
	}
	started := make(chan int64, 8)
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- d.ID()
		<-release[d.ID()]
		return rowactor.Ack()
	}, rowactor.Workers(3), rowactor.PollInterval(time.Minute))
	running := map[int64]bool{}
	for range 3 {
		select {
		case id := <-started:
			running[id] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of 3 workers started", len(running))
		}
	}
	var first int64
	for id := range running {
		first = id
		break
	}
	close(release[first])
	if s := h.waitSettled(1)[0]; s.Err != nil || s.ID != first {
		t.Fatalf("settlement %+v", s)
	}
	select {
	case id := <-started:
		if running[id] {
			t.Fatalf("row %d delivered twice", id)
		}
		if st := h.row(id); !st.exists {
			t.Fatalf("row %d gone while in work", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the freed worker idled: the fourth row did not start within 10 s of the ack (poll is 1 min)")
	}
	for _, id := range ids {
		if id != first {
			close(release[id])
		}
	}
	h.waitSettled(3)
	for _, id := range ids {
		if h.row(id).exists {
			t.Fatalf("row %d outlived its ack", id)
		}
	}
}
