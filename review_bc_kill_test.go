package rowactor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

func init() {
	outcomeScenarios = append(outcomeScenarios,
		scenario{
			name:      "review bc killed connection",
			forms:     rowLockOnly,
			plainOnly: true,
			shapes:    []tableShape{withProcessedAt, withError},
			run:       reviewBCKilled,
		},
		scenario{
			name:      "review bc killed connection without processed_at",
			forms:     rowLockOnly,
			plainOnly: true,
			run:       reviewBCKilled,
		},
	)
}

// reviewBCKilled: the server ends the batch's connection while a row of it is cancelled;
// the cancelled row must still end cancelled, the other row be handled, once each.
func reviewBCKilled(t *testing.T, h *harness, form rowactor.Form) {
	d, kill := killablePool(t, h)
	b := h.brokerOn(d)
	ids := h.publish(b, 2)
	got := make(chan heldBatch, 1)
	stuck, open := h.gate()
	calls := 0
	h.subscribeBatch(b, 2, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		calls++
		if calls > 1 {
			return acks(len(ds))
		}
		got <- heldBatch{ctx, ds}
		<-stuck
		return acks(len(ds))
	}, rowactor.Workers(1))
	held := h.waitBatch(got, 2)
	done := h.startCancel(b, ids[0], "gone")
	waitFor(t, func() bool { return held.ds[held.indexOf(t, ids[0])].Cancelled() != nil })
	if n := kill(); n == 0 {
		t.Fatal("no connection killed")
	}
	time.Sleep(100 * time.Millisecond)
	open()
	err := h.cancelReturned(done)
	t.Logf("Cancel after the kill: %v", err)
	deadline := time.Now().Add(15 * time.Second)
	for {
		st0, st1 := h.row(ids[0]), h.row(ids[1])
		ok0 := !st0.exists || st0.processedAt != nil
		ok1 := !st1.exists || st1.processedAt != nil
		if ok0 && ok1 {
			// The cancel's own commit died with the connection: the row went back, and
			// either the Cancel cancelled it in the table (nil), or a redelivery ended it
			// first and the Cancel says so. Never nil for a row that does not end as
			// cancelled, never an error for one that does.
			cancelled := st0.exists && st0.lastError != nil && *st0.lastError == "gone"
			if h.table.ProcessedAt == "" {
				cancelled = !st0.exists && err == nil
			}
			switch {
			case err == nil && !cancelled:
				t.Fatalf("Cancel returned nil, the row %+v", st0)
			case err != nil && (cancelled || !errors.Is(err, rowactor.ErrFinished) && !errors.Is(err, rowactor.ErrNotFound)):
				t.Fatalf("Cancel returned %v, the row %+v", err, st0)
			}
			if st1.exists && st1.lastError != nil {
				t.Fatalf("the other row: %+v", st1)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rows %+v %+v did not end (Cancel said %v)\nlogs:\n%s", st0, st1, err, h.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
