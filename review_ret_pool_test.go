package rowactor_test

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

func init() {
	scenarios = append(scenarios, scenario{
		name:   "review ret: a retention on a small shared pool starves no delivery and no Shutdown",
		forms:  []rowactor.Form{rowactor.FormRowLock, rowactor.FormAdvisory},
		shapes: []tableShape{withProcessedAt},
		run:    reviewRetSmallPoolScenario,
	})
}

// reviewRetSmallPoolScenario: a pool of 2, which the subscriptions budget as 1 for their
// claims and deliveries, leaving one for publishes and handlers' own queries. Each
// handler publishes a row (its own query). A retention on the same broker must not take
// that spare connection away: a round holds a connection only while it runs.
func reviewRetSmallPoolScenario(t *testing.T, h *harness, _ rowactor.Form) {
	d, ok := sizedDialect(t, h, 2)
	if !ok {
		t.Skip("SQLite holds no connection per row")
	}
	ctx := context.Background()
	b := h.brokerOn(d)
	ids := h.publish(b, 3)
	r, err := b.Retain(ctx, h.table, time.Hour, rowactor.RetainEvery(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the retention to lead", r.Leading)
	h.subscribe(b, func(ctx context.Context, dl *rowactor.Delivery) rowactor.Outcome {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := b.Publish(pctx, h.table, "side", []byte("from the handler")); err != nil {
			return rowactor.Fail(err)
		}
		return rowactor.Ack()
	})
	for range ids {
		select {
		case s := <-h.settled:
			if s.Err != nil || s.Step != "ack" {
				t.Fatalf("a handler's own publish beside a leading retention on a pool of 2: %+v (HandlerErr %v)", s, s.HandlerErr)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("no settlement in 15 s")
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := b.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}
