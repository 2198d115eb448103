package rowactor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

func init() {
	scenarios = append(scenarios, scenario{
		name:  "Inspect tells a row in work, a delayed one and a deleted one, and refuses once Shutdown began",
		forms: []rowactor.Form{rowactor.FormLease},
		run:   inspectScenario,
	})
}

func inspectScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	ids := h.publish(b, 2)
	started, release := make(chan int64, 2), make(chan struct{})
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- d.ID()
		<-release
		return rowactor.Ack()
	}, rowactor.Workers(1), rowactor.Prefetch(1), rowactor.Lease(time.Minute))
	held := <-started
	waiting := ids[0] + ids[1] - held
	later, err := b.Publish(ctx, h.table, h.queue, []byte("later"), rowactor.After(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	j, err := b.Inspect(ctx, h.table, held)
	if err != nil || j.State != rowactor.JobInWork || j.LockedUntil.Before(time.Now()) || j.Attempt != 2 {
		t.Fatalf("the row in work: %+v, %v", j, err)
	}
	if st := h.row(held); st.lockedUntil == nil || !st.lockedUntil.Equal(j.LockedUntil) {
		t.Fatalf("Inspect's lease %v, the table's %v", j.LockedUntil, st.lockedUntil)
	}
	// The other row waits for the worker: due, or already in hand (leased) as the
	// subscription's room allows; either way not delayed.
	if j, err := b.Inspect(ctx, h.table, waiting); err != nil || (j.State != rowactor.JobDue && j.State != rowactor.JobInWork) {
		t.Fatalf("the waiting row: %+v, %v", j, err)
	}
	if j, err := b.Inspect(ctx, h.table, later); err != nil || j.State != rowactor.JobDelayed || j.RetryAfter.Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("the delayed row: %+v, %v", j, err)
	}
	close(release)
	h.waitSettled(2)
	if _, err := b.Inspect(ctx, h.table, held); !errors.Is(err, rowactor.ErrNotFound) {
		t.Fatalf("Inspect of an acked (deleted) row: %v", err)
	}
	if _, err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Inspect(ctx, h.table, waiting); !errors.Is(err, rowactor.ErrClosed) {
		t.Fatalf("Inspect after Shutdown: %v", err)
	}
}
