package rowactor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// Broker.Done (b0e90d3): closed when a Shutdown called from a handler begins (the
// ErrShutdownInHandler path, which returns at once), before that call returns; a second
// Shutdown neither panics on a second close nor reopens it. Kept as a regression.
func TestReview2DoneFromHandlerAndTwice(t *testing.T) {
	h := newHarness(t, drivers[0], rowactor.FormLease)
	b := h.broker()
	type res struct {
		err    error
		closed bool
	}
	got := make(chan res, 1)
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		_, err := b.Shutdown(ctx)
		r := res{err: err}
		select {
		case <-b.Done():
			r.closed = true
		default:
		}
		got <- r
		return rowactor.Ack()
	})
	h.publish(b, 1)
	var r res
	select {
	case r = <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("no delivery")
	}
	if !errors.Is(r.err, rowactor.ErrShutdownInHandler) || !r.closed {
		t.Fatalf("Shutdown from a handler: %v, Done closed when it returned: %v", r.err, r.closed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.Shutdown(ctx); !errors.Is(err, rowactor.ErrClosed) {
		t.Errorf("second Shutdown: %v, want ErrClosed", err)
	}
	select {
	case <-b.Done():
	default:
		t.Error("Done open after two Shutdowns")
	}
}
