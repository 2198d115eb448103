package rowactor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// Review 18: adversarial tests of Cancel of a row in work.

var review18CancelScenarios = []scenario{
	{
		name:   "review18: Cancel cut short by Shutdown does not report a cancel that never took effect",
		shapes: []tableShape{withProcessedAt, withError},
		run:    review18CancelShutdownScenario,
	},
}

func TestReview18Cancel(t *testing.T) { runModeMatrix(t, review18CancelScenarios) }

// review18CancelShutdownScenario: a handler that ignores its cancelled context (and has
// no deadline) is still running when Shutdown's drain ends; Shutdown gives its row back
// to the queue. The Cancel waiting for that delivery must then not return nil (nil means
// the row ended as cancelled): either the row is cancelled, or Cancel says it was not.
func review18CancelShutdownScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	id := h.publish(b, 1)[0]
	started, sawCancel, stuck := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- struct{}{}
		<-ctx.Done()
		sawCancel <- struct{}{}
		<-stuck // ignores its context
		return rowactor.Ack()
	}, leaseOptions(form, time.Minute)...)
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatalf("the row was not delivered\nlogs:\n%s", h.logs.String())
	}
	cancelled := make(chan error, 1)
	go func() {
		bounded, stop := context.WithTimeout(ctx, 20*time.Second)
		defer stop()
		cancelled <- b.Cancel(bounded, h.table, id, "customer left")
	}()
	select {
	case <-sawCancel:
	case <-time.After(15 * time.Second):
		t.Fatal("the handler's context was not cancelled")
	}
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		sctx, stop := context.WithTimeout(ctx, 500*time.Millisecond)
		defer stop()
		_, _ = b.Shutdown(sctx)
	}()
	var err error
	select {
	case err = <-cancelled:
	case <-time.After(15 * time.Second):
		close(stuck)
		t.Fatal("Cancel did not return after Shutdown")
	}
	close(stuck) // the late handler's return changes nothing
	<-shut
	st := h.row(id)
	cancelledRow := st.processedAt != nil && st.lastError != nil && *st.lastError == "customer left"
	if err == nil && !cancelledRow {
		t.Fatalf("Cancel returned nil, and the row is %+v (not cancelled: Shutdown gave it back)", st)
	}
	if err != nil && !errors.Is(err, rowactor.ErrClosed) && !cancelledRow {
		t.Fatalf("Cancel cut short by Shutdown: %v, want ErrClosed", err)
	}
}

func init() {
	review18CancelScenarios = append(review18CancelScenarios, scenario{
		name:   "review18: Cancel racing this broker's own claim never answers ErrInWork",
		shapes: []tableShape{withProcessedAt, withError},
		run:    review18CancelRacesClaimScenario,
	})
}

// review18CancelRacesClaimScenario: only this broker consumes the table, so a row is
// never in work under another holder; a Cancel issued right after each publish (while
// the subscription's claim takes the row, hands it over, starts it or settles it) must
// end the row (nil) or find it finished (ErrFinished), never refuse it as another's.
func review18CancelRacesClaimScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	opts := append(leaseOptions(form, time.Minute), rowactor.Workers(2))
	if form == rowactor.FormLease {
		opts = append(opts, rowactor.Prefetch(2))
	}
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
		}
		return rowactor.Ack()
	}, opts...)
	const n = 60
	for i := 0; i < n; i++ {
		id := h.publish(b, 1)[0]
		if i%3 == 1 {
			time.Sleep(time.Duration(i%7) * 100 * time.Microsecond)
		}
		bounded, stop := context.WithTimeout(ctx, 15*time.Second)
		err := b.Cancel(bounded, h.table, id, "raced the claim")
		stop()
		if err != nil && !errors.Is(err, rowactor.ErrFinished) {
			t.Fatalf("Cancel of row %d (#%d) right after its publish: %v", id, i, err)
		}
	}
}
