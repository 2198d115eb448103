package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

var jobScenarios = []scenario{
	{
		name:  "Inspect tells a row in work, a delayed one and a deleted one, and refuses once Shutdown began",
		forms: []rowactor.Form{rowactor.FormLease},
		run:   inspectScenario,
	},
	{
		name:   "Inspect tells a dead letter in its group as dead, with its time of death, never as due",
		shapes: []tableShape{withDeadAt},
		run:    inspectDeadScenario,
	},
	{
		name:   "RetryNow runs a delayed row at once, Cancel ends a queued one, and both leave a row another broker holds to its delivery",
		shapes: []tableShape{withProcessedAt},
		run:    jobControlScenario,
	},
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
	// Attempt is the calls made: the first one, under way (its handler reads 1).
	if err != nil || j.State != rowactor.JobInWork || j.LockedUntil.Before(time.Now()) || j.Attempt != 1 {
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

func inspectDeadScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Retry() },
		rowactor.MaxAttempts(1), rowactor.DeadLetterGroup("dead"))
	start := time.Now()
	id := h.publish(b, 1)[0]
	if s := h.waitSettled(1)[0]; s.Step != "dead_letter" || s.Err != nil {
		t.Fatalf("settlement %+v, want a dead letter", s)
	}
	end := time.Now()
	if st := h.row(id); st.group != "dead" {
		t.Fatalf("row %+v, want it moved into group dead", st)
	}
	if h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE id = ? AND dead_at IS NOT NULL", h.table.Name), id) != 1 {
		t.Fatal("the move left dead_at NULL")
	}
	j, err := b.Inspect(ctx, h.table, id)
	if err != nil || j.State != rowactor.JobDead || j.State.String() != "dead" || j.Group != "dead" {
		t.Fatalf("the dead letter: %+v, %v; want dead in group dead", j, err)
	}
	if j.DeadAt.Before(start.Add(-time.Second)) || j.DeadAt.After(end.Add(time.Second)) {
		t.Fatalf("the dead letter died at %v, want between %v and %v", j.DeadAt, start, end)
	}
}

func jobControlScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	delayed, err := b.Publish(ctx, h.table, h.queue, []byte("delayed"), rowactor.After(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cancelled := h.publish(b, 1)[0]
	if err := b.Cancel(ctx, h.table, cancelled, "not wanted"); err != nil {
		t.Fatalf("Cancel of a queued row: %v", err)
	}
	if st := h.row(cancelled); !st.exists || st.processedAt == nil {
		t.Fatalf("the cancelled row: %+v, want it processed", st)
	}
	started, release := make(chan int64, 4), make(chan struct{})
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- d.ID()
		<-release
		return rowactor.Ack()
	}, rowactor.Workers(2))
	if err := b.RetryNow(ctx, h.table, delayed); err != nil {
		t.Fatalf("RetryNow of a delayed row: %v", err)
	}
	var held int64
	select {
	case held = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the row RetryNow made due was not delivered")
	}
	if held != delayed {
		t.Fatalf("delivered row %d, want the delayed row %d (the cancelled one must not run)", held, delayed)
	}
	// Cancel of a row in work under this broker cancels its delivery (cancel_test.go);
	// another broker's is refused.
	for _, err := range []error{b.RetryNow(ctx, h.table, held), h.second().Cancel(ctx, h.table, held, "late")} {
		if !errors.Is(err, rowactor.ErrInWork) {
			t.Fatalf("RetryNow, or another broker's Cancel, of the row in work: %v, want ErrInWork", err)
		}
	}
	if err := b.Cancel(ctx, h.table, cancelled, "again"); !errors.Is(err, rowactor.ErrFinished) {
		t.Fatalf("Cancel of a cancelled row: %v, want ErrFinished", err)
	}
	close(release)
	if s := h.waitSettled(1)[0]; s.ID != held || s.Err != nil {
		t.Fatalf("the held row's settlement: %+v", s)
	}
	if st := h.row(held); !st.exists || st.processedAt == nil {
		t.Fatalf("the held row after its ack: %+v", st)
	}
	if _, err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Cancel(ctx, h.table, delayed, "x"); !errors.Is(err, rowactor.ErrClosed) {
		t.Fatalf("Cancel after Shutdown: %v", err)
	}
}
