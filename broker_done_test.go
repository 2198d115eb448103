package rowactor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// TestBrokerDoneClosesWhenShutdownBegins: Done stays open while the broker runs and
// closes as Shutdown begins, while it still waits for rows in work, so that work a
// service runs beside the broker (the dashboard's background counts) ends before the
// pool is closed rather than holding Shutdown up.
func TestBrokerDoneClosesWhenShutdownBegins(t *testing.T) {
	t.Parallel()
	h := newHarness(t, drivers[0], rowactor.FormLease)
	b := h.broker()
	select {
	case <-b.Done():
		t.Fatal("Done is closed before Shutdown")
	default:
	}
	blockUntilCancelled(t, h, b, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		_, _ = b.Shutdown(ctx) // waits for the row in work until ctx ends
	}()
	select {
	case <-b.Done():
	case <-ended:
		t.Fatal("Done was not closed while Shutdown waited for the row in work")
	case <-time.After(10 * time.Second):
		t.Fatal("Done was not closed after Shutdown began")
	}
	select {
	case <-ended:
		t.Fatal("Shutdown ended before its context: the test did not see Done close while it ran")
	default:
	}
	<-ended
	h.waitSettled(1)
}

// TestBrokerDoneClosesOnShutdownFromAHandlerAndStaysClosed: Done is closed before a
// Shutdown called from a handler returns, and a second Shutdown leaves it closed.
func TestBrokerDoneClosesOnShutdownFromAHandlerAndStaysClosed(t *testing.T) {
	t.Parallel()
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
