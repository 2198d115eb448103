package rowactor_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// Review of Cancel of a row in a SubscribeBatch batch: races with a batch given up on,
// connections the server ends mid-batch, a handler cancelling a row of its own batch.

func init() {
	outcomeScenarios = append(outcomeScenarios,
		scenario{
			name:      "review bc abandoned batch returning after a cancel",
			forms:     rowLockOnly,
			plainOnly: true,
			shapes:    []tableShape{withProcessedAt, withError},
			run:       reviewBCAbandonReturns,
		},

		scenario{
			name:      "review bc same row twice and size one",
			forms:     rowLockOnly,
			plainOnly: true,
			run:       reviewBCTwiceSizeOne,
		},
	)
}

// reviewBCAbandonReturns: the handler of a batch given up on returns just after the
// abandon settled a cancelled row of it (-race sees what the two goroutines share).
func reviewBCAbandonReturns(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	ids := h.publish(b, 2)
	got := make(chan heldBatch, 1)
	returned := make(chan struct{})
	var calls atomic.Int32
	h.subscribeBatch(b, 2, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		if calls.Add(1) > 1 {
			return acks(len(ds))
		}
		got <- heldBatch{ctx, ds}
		defer close(returned)
		// Ignores its context, and returns on its own after the batch was given up on
		// (the deadline, 100ms, and the grace, 1s): nothing orders it after the abandon.
		time.Sleep(1600 * time.Millisecond)
		return acks(len(ds))
	}, rowactor.Timeout(100*time.Millisecond), rowactor.Workers(1))
	h.waitBatch(got, 2)
	if err := h.cancelReturned(h.startCancel(b, ids[0], "stuck")); err != nil {
		t.Fatalf("Cancel: %v\nlogs:\n%s", err, h.logs.String())
	}
	<-returned
	h.waitSettled(3) // the batch's two rows, then the released row's redelivery
	h.wantCancelledRow(ids[0], "stuck", 1)
	time.Sleep(100 * time.Millisecond)
}

// reviewBCTwiceSizeOne: two Cancels of the one row of a batch of one: the context ends,
// both return nil (the second waits for the first's end), the row is settled once.
func reviewBCTwiceSizeOne(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	ids := h.publish(b, 1)
	got, saw := make(chan heldBatch, 1), make(chan error, 1)
	h.subscribeBatch(b, 1, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		got <- heldBatch{ctx, ds}
		select {
		case <-ctx.Done():
			saw <- context.Cause(ctx)
		case <-time.After(15 * time.Second):
			saw <- nil
		}
		return []rowactor.Outcome{rowactor.Retry()}
	})
	h.waitBatch(got, 1)
	c1, c2 := h.startCancel(b, ids[0], "one"), h.startCancel(b, ids[0], "one")
	for _, c := range []<-chan error{c1, c2} {
		if err := h.cancelReturned(c); err != nil {
			t.Fatalf("Cancel: %v", err)
		}
	}
	if cause := <-saw; !errors.Is(cause, rowactor.ErrCancelled) {
		t.Fatalf("cause %v", cause)
	}
	ss := h.waitSettled(1)
	wantCancelledSettlement(t, ss[0])
	h.quiet(300 * time.Millisecond)
	if st := h.row(ids[0]); st.exists {
		t.Fatalf("row %+v, want it deleted", st)
	}
}

func init() {
	outcomeScenarios = append(outcomeScenarios, scenario{
		name:      "review bc handler cancels a row of its own batch with its ctx",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       reviewBCSelfCancel,
	})
}

// reviewBCSelfCancel: Broker.Cancel says that called from the row's own handler it would
// wait for itself, and that passed the handler's ctx it returns at once. A batch handler
// that does so for one of its rows must not wait for its own batch.
func reviewBCSelfCancel(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	ids := h.publish(b, 2)
	took := make(chan time.Duration, 1)
	var calls atomic.Int32
	h.subscribeBatch(b, 2, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		if calls.Add(1) > 1 {
			return acks(len(ds))
		}
		bounded, stop := context.WithTimeout(ctx, 3*time.Second) // the test's bound, not the advice's
		defer stop()
		began := time.Now()
		err := b.Cancel(bounded, h.table, ds[0].ID(), "self")
		took <- time.Since(began)
		t.Logf("Cancel from the handler: %v", err)
		return acks(len(ds))
	})
	select {
	case d := <-took:
		if d > time.Second {
			t.Errorf("Cancel of a row of its own batch, passed the handler's ctx, waited %v for the batch itself", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no batch")
	}
	h.waitSettled(2)
	h.wantCancelledRow(ids[0], "self", 1)
}
