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

func init() {
	outcomeScenarios = append(outcomeScenarios, scenario{
		name:      "review bc cancels racing a batch of mixed outcomes",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       reviewBCMixedRace,
	})
}

// reviewBCMixedRace: every row of batches whose handler returns Ack, Retry or Drop is
// cancelled while the handler returns; each Cancel's answer must match where its row ends.
func reviewBCMixedRace(t *testing.T, h *harness, form rowactor.Form) {
	const n = 6
	for round := 0; round < 6; round++ {
		b := h.broker()
		ids := h.publish(b, n)
		var calls atomic.Int32
		started := make(chan struct{}, 1)
		h.subscribeBatch(b, n, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
			if calls.Add(1) == 1 {
				started <- struct{}{}
				time.Sleep(5 * time.Millisecond)
			}
			out := make([]rowactor.Outcome, len(ds))
			for i := range out {
				switch i % 3 {
				case 0:
					out[i] = rowactor.Ack()
				case 1:
					out[i] = rowactor.Retry()
				default:
					out[i] = rowactor.Drop()
				}
			}
			return out
		})
		<-started
		errs := make([]error, n)
		done := make(chan int, n)
		for i, id := range ids {
			go func() {
				bounded, stop := context.WithTimeout(context.Background(), 15*time.Second)
				defer stop()
				time.Sleep(time.Duration(i*round) * time.Millisecond / 2)
				errs[i] = b.Cancel(bounded, h.table, id, "raced")
				done <- i
			}()
		}
		for range ids {
			<-done
		}
		for i, id := range ids {
			st, err := h.row(id), errs[i]
			raced := st.lastError != nil && *st.lastError == "raced"
			switch {
			case err == nil:
				if st.processedAt == nil || !raced {
					t.Fatalf("round %d row %d: Cancel returned nil, and the row is %+v", round, id, st)
				}
			case errors.Is(err, rowactor.ErrFinished):
				if st.processedAt == nil || raced {
					t.Fatalf("round %d row %d: Cancel returned %v, and the row is %+v", round, id, err, st)
				}
			default:
				t.Fatalf("round %d row %d: Cancel returned %v, row %+v\nlogs:\n%s", round, id, err, st, h.logs.String())
			}
		}
		ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := b.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		stop()
	drain:
		for {
			select {
			case <-h.settled:
			default:
				break drain
			}
		}
	}
}

func init() {
	outcomeScenarios = append(outcomeScenarios, scenario{
		name:      "review bc cancel then pause",
		forms:     rowLockOnly,
		plainOnly: true,
		shapes:    []tableShape{withProcessedAt, withError},
		run:       reviewBCPause,
	})
}

// reviewBCPause: a Pause while a batch with a cancelled row is in work lets the batch
// settle as usual: the row ends cancelled, Cancel returns nil, the other row is acked.
func reviewBCPause(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	ids := h.publish(b, 2)
	got := make(chan heldBatch, 1)
	stuck, open := h.gate()
	sub := h.subscribeBatch(b, 2, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		got <- heldBatch{ctx, ds}
		<-stuck
		return acks(len(ds))
	})
	held := h.waitBatch(got, 2)
	done := h.startCancel(b, ids[1], "paused")
	waitFor(t, func() bool { return held.ds[held.indexOf(t, ids[1])].Cancelled() != nil })
	ctx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	if err := sub.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	open()
	if err := h.cancelReturned(done); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	h.wantCancelledRow(ids[1], "paused", 1)
	ss := byID(t, h.waitSettled(2))
	wantCancelledSettlement(t, ss[ids[1]])
	if s := ss[ids[0]]; s.Err != nil || s.Step != "ack" {
		t.Fatalf("the other row: %+v", s)
	}
	h.quiet(200 * time.Millisecond)
}
