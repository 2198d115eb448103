package rowactor_test

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// TestBrokerDoneClosesWhenShutdownBegins: Done stays open while the broker runs and
// closes as Shutdown begins, while it still waits for rows in work, so that work a
// service runs beside the broker (the dashboard's background counts) ends before the
// pool is closed rather than holding Shutdown up.
func TestBrokerDoneClosesWhenShutdownBegins(t *testing.T) {
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
