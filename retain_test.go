package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

func init() {
	scenarios = append(scenarios, scenario{
		name:   "retention deletes old finished rows, in one round at a time across brokers, and goes on when one broker stops",
		forms:  []rowactor.Form{rowactor.FormLease},
		shapes: []tableShape{withProcessedAt},
		run:    retentionScenario,
	})
}

func retentionScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b1, b2 := h.broker(), h.second()
	finish := func(b *rowactor.Broker, n int, at time.Time) []int64 {
		ids := h.publish(b, n)
		for _, id := range ids {
			h.drv.exec(t, h.d, fmt.Sprintf("UPDATE %s SET processed_at = ? WHERE id = ?", h.table.Name), h.drv.timeValue(at), id)
		}
		return ids
	}
	old := finish(b1, 5, time.Now().Add(-2*time.Hour))
	recent := finish(b1, 2, time.Now())
	queued := h.publish(b1, 1)
	opts := []rowactor.RetainOption{rowactor.RetainEvery(50 * time.Millisecond), rowactor.RetainBatch(2)}
	r1, err := b1.Retain(ctx, h.table, time.Hour, opts...)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b2.Retain(ctx, h.table, time.Hour, opts...)
	if err != nil {
		t.Fatal(err)
	}
	gone := func(ids []int64) bool {
		for _, id := range ids {
			if h.row(id).exists {
				return false
			}
		}
		return true
	}
	// Deleted counts a round's rows when the round ends, a moment after they are gone.
	waitUntil(t, "the old finished rows to go and be counted", func() bool {
		return gone(old) && r1.Deleted()+r2.Deleted() >= int64(len(old))
	})
	if d := r1.Deleted() + r2.Deleted(); d != int64(len(old)) {
		t.Fatalf("deleted %d + %d rows, want %d", r1.Deleted(), r2.Deleted(), len(old))
	}
	for _, id := range append(recent, queued...) {
		if !h.row(id).exists {
			t.Fatalf("row %d (recent or queued) was deleted", id)
		}
	}
	// One retention stops; the other goes on alone.
	r1.Stop()
	if r1.Leading() {
		t.Fatal("a stopped retention still leads")
	}
	before := r2.Deleted()
	more := finish(b1, 3, time.Now().Add(-3*time.Hour))
	waitUntil(t, "the other broker to delete the later finished rows and count them", func() bool {
		return gone(more) && r2.Deleted() >= before+int64(len(more))
	})
	if r2.Deleted() != before+int64(len(more)) || r1.Deleted()+r2.Deleted() != int64(len(old)+len(more)) {
		t.Fatalf("deleted after the stop: %d by the stopped one, %d by the other", r1.Deleted(), r2.Deleted()-before)
	}
	if _, err := b2.Retain(ctx, h.table, time.Hour); err == nil {
		t.Fatal("a second Retain of the table on one broker was accepted")
	}

	var ce *rowactor.ConfigError
	noProcessed := h.table
	noProcessed.ProcessedAt = ""
	if _, err := b1.Retain(ctx, noProcessed, time.Hour); !errors.As(err, &ce) || ce.Option != "Table.ProcessedAt" {
		t.Fatalf("Retain of a table without processed_at: %v", err)
	}
	if _, err := b1.Retain(ctx, h.table, 0); !errors.As(err, &ce) {
		t.Fatalf("Retain with keep 0: %v", err)
	}
	if _, err := b1.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b1.Retain(ctx, h.table, time.Hour); !errors.Is(err, rowactor.ErrClosed) {
		t.Fatalf("Retain after Shutdown: %v", err)
	}
}

// waitUntil polls cond for up to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
