package rowactor_test

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

func init() {
	scenarios = append(scenarios, scenario{
		name:   "review ret: Shutdown stops a retention before it drains, so a handler waiting for the leader's connection finishes",
		forms:  []rowactor.Form{rowactor.FormRowLock},
		shapes: []tableShape{withProcessedAt},
		run:    reviewRetShutdownScenario,
	})
}

// reviewRetShutdownScenario: on a pool of 2 the subscription holds one connection for its
// row in work and the leading retention the other; the handler's own publish waits for a
// connection. Shutdown must stop the retention (it is no delivery) before it waits for the
// drain, or the drain waits on the leader it would stop only afterwards.
func reviewRetShutdownScenario(t *testing.T, h *harness, _ rowactor.Form) {
	d, ok := sizedDialect(t, h, 2)
	if !ok {
		t.Skip("SQLite holds no connection per row")
	}
	ctx := context.Background()
	b := h.brokerOn(d)
	h.publish(b, 1)
	r, err := b.Retain(ctx, h.table, time.Hour, rowactor.RetainEvery(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the retention to lead", r.Leading)
	started := make(chan struct{}, 1)
	h.subscribe(b, func(ctx context.Context, dl *rowactor.Delivery) rowactor.Outcome {
		started <- struct{}{}
		if _, err := b.Publish(ctx, h.table, "side", []byte("from the handler")); err != nil {
			return rowactor.Fail(err)
		}
		return rowactor.Ack()
	}, rowactor.Timeout(time.Minute))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery in 10 s")
	}
	time.Sleep(200 * time.Millisecond) // the handler's publish waits for a connection
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rep, err := b.Shutdown(sctx)
	if err != nil || !rep.Drained {
		t.Fatalf("Shutdown with a handler waiting for the leader's connection: %+v %v", rep, err)
	}
	if s := <-h.settled; s.Step != "ack" {
		t.Fatalf("the handler's delivery: %+v (HandlerErr %v)", s, s.HandlerErr)
	}
}
