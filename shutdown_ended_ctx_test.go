package rowactor_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// TestShutdownWithAnEndedContextEndsTheDrain runs on each database, one at a time and
// never beside another test: it sets GOMAXPROCS to 1 for its rounds, which would slow
// every test running beside it, and two runs setting and restoring it side by side could
// leave the whole package on one processor.
func TestShutdownWithAnEndedContextEndsTheDrain(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			endedCtxShutdownEndsTheDrainScenario(t, newHarness(t, drv, rowactor.FormLease), rowactor.FormLease)
		})
	}
}

// endedCtxShutdownEndsTheDrainScenario proves that a Shutdown whose ctx has already ended
// ends the drain a handler's Shutdown began, even when it runs right after it.
// Handler A waits for its context (a well-behaved handler that returns when cancelled).
// Handler B calls Shutdown(context.Background()), which runs in the background with no
// deadline, and at once a Shutdown whose ctx has already ended is called from another
// goroutine. That second Shutdown must end the drain (so A is cancelled and returns) and
// return, even if it runs before the background shutdown stored its cancelDrain.
func endedCtxShutdownEndsTheDrainScenario(t *testing.T, h *harness, _ rowactor.Form) {
	prev := runtime.GOMAXPROCS(1) // the goroutine spawned last runs first
	defer runtime.GOMAXPROCS(prev)
	for round := 0; round < 20 && !t.Failed(); round++ {
		endedCtxShutdownRound(t, h, round)
	}
}

func endedCtxShutdownRound(t *testing.T, h *harness, round int) {
	b := h.broker()
	release := make(chan struct{})
	defer close(release)
	aIn := make(chan struct{})
	second := make(chan error, 1)
	first := make(chan error, 1)
	var n atomic.Int32
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		k := n.Add(1)
		if k > 2 {
			return rowactor.Ack() // a row left over from an earlier round
		}
		if k == 1 {
			close(aIn)
			// handler A: wait for the drain to end (or the test to give up)
			select {
			case <-ctx.Done():
			case <-release:
			}
			return rowactor.Ack()
		}
		// handler B
		_, err := b.Shutdown(context.Background())
		first <- err
		go func() {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := b.Shutdown(ctx)
			second <- err
		}()
		return rowactor.Ack()
	}, rowactor.Workers(2))
	for i := 0; i < 2; i++ {
		// a row left over from an earlier round may be handler A or B: then this publish
		// may find the broker closed already
		if _, err := b.Publish(context.Background(), h.table, h.queue, []byte("x")); err != nil && !errors.Is(err, rowactor.ErrClosed) {
			t.Fatalf("Publish: %v", err)
		}
	}
	select {
	case <-time.After(10 * time.Second):
		t.Fatal("handler A did not start")
	case <-aIn:
	}
	select {
	case err := <-first:
		if !errors.Is(err, rowactor.ErrShutdownInHandler) {
			t.Fatalf("handler's Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("handler B's Shutdown did not return")
	}
	select {
	case err := <-second:
		if !errors.Is(err, rowactor.ErrClosed) {
			t.Fatalf("second Shutdown: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("round %d: ", round)
		t.Fatal("a Shutdown whose ctx had ended was still blocked 5 s later: its endDrain ran before the background shutdown set cancelDrain, and the drain (no deadline) waits for a handler that waits for its ctx")
	}
}
