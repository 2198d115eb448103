package rowactor_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// blockUntilCancelled subscribes a handler that holds its row until its context ends, and
// returns once n rows are in work.
func blockUntilCancelled(t *testing.T, h *harness, b *rowactor.Broker, n int) {
	t.Helper()
	started := make(chan struct{}, n)
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- struct{}{}
		<-ctx.Done() // Shutdown cancels it once it stops waiting
		return rowactor.Ack()
	}, rowactor.Workers(n), rowactor.Lease(time.Hour))
	h.publish(b, n)
	for range n {
		select {
		case <-started:
		case <-time.After(15 * time.Second):
			t.Fatalf("%d rows were not in work within 15 s", n)
		}
	}
}

// TestShutdownTellsWhetherItDrained: a Shutdown whose context ends with rows in work
// returns its report and an error matching ErrNotDrained and what ended the context (a
// deadline, a cancel, or a second Shutdown's context), saying how many rows it released;
// a Shutdown that drained returns nil, even under a context that had already ended when
// nothing was in work. (goleak in TestMain checks that nothing is left running.)
func TestShutdownTellsWhetherItDrained(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()

			t.Run("deadline", func(t *testing.T) {
				h := newHarness(t, drv, rowactor.FormLease)
				b := h.broker()
				blockUntilCancelled(t, h, b, 3)
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				rep, err := b.Shutdown(ctx)
				if rep.Drained || rep.Released != 3 {
					t.Fatalf("report %+v, want not drained and 3 rows released", rep)
				}
				if !errors.Is(err, rowactor.ErrNotDrained) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
					t.Fatalf("Shutdown: %v, want ErrNotDrained and context.DeadlineExceeded", err)
				}
				if want := "rowactor: shutdown did not drain: 3 rows released: context deadline exceeded"; err.Error() != want {
					t.Fatalf("Shutdown: %q, want %q", err, want)
				}
				h.waitSettled(3)
			})

			t.Run("cancel", func(t *testing.T) {
				h := newHarness(t, drv, rowactor.FormLease)
				b := h.broker()
				blockUntilCancelled(t, h, b, 1)
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(100*time.Millisecond, cancel)
				rep, err := b.Shutdown(ctx)
				if rep.Drained || rep.Released != 1 {
					t.Fatalf("report %+v, want not drained and 1 row released", rep)
				}
				if !errors.Is(err, rowactor.ErrNotDrained) || !errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
					err.Error() != "rowactor: shutdown did not drain: 1 row released: context canceled" {
					t.Fatalf("Shutdown: %v, want ErrNotDrained and context.Canceled", err)
				}
				h.waitSettled(1)
			})

			t.Run("ended by a second Shutdown", func(t *testing.T) {
				h := newHarness(t, drv, rowactor.FormLease)
				b := h.broker()
				blockUntilCancelled(t, h, b, 1)
				type result struct {
					rep rowactor.ShutdownReport
					err error
				}
				first := make(chan result, 1)
				go func() {
					rep, err := b.Shutdown(context.Background())
					first <- result{rep, err}
				}()
				time.Sleep(100 * time.Millisecond) // the first Shutdown is draining
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				if _, err := b.Shutdown(ctx); !errors.Is(err, rowactor.ErrClosed) {
					t.Fatalf("second Shutdown: %v, want ErrClosed", err)
				}
				r := <-first
				if r.rep.Drained || r.rep.Released != 1 || !errors.Is(r.err, rowactor.ErrNotDrained) ||
					!errors.Is(r.err, context.DeadlineExceeded) || !strings.Contains(r.err.Error(), "a second Shutdown's context ended") {
					t.Fatalf("first Shutdown: %+v, %v; want not drained, 1 row released, and the second Shutdown's deadline named", r.rep, r.err)
				}
				h.waitSettled(1)
			})

			t.Run("drained", func(t *testing.T) {
				h := newHarness(t, drv, rowactor.FormLease)
				b := h.broker()
				h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
				h.publish(b, 2)
				h.waitSettled(2)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if rep, err := b.Shutdown(ctx); err != nil || !rep.Drained || rep.Released != 0 {
					t.Fatalf("Shutdown after every row settled: %+v, %v; want drained and nil", rep, err)
				}
			})

			t.Run("nothing in work under an ended context", func(t *testing.T) {
				h := newHarness(t, drv, rowactor.FormLease)
				b := h.broker()
				h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				if rep, err := b.Shutdown(ctx); err != nil || !rep.Drained {
					t.Fatalf("Shutdown with nothing in work under a cancelled context: %+v, %v; want drained and nil", rep, err)
				}
			})
		})
	}
}

// TestShutdownDoesNotCountRowsGivenBackBeforeIt: a row the measured room gave back while
// the broker ran (its process's workers all stuck; strand.go) is not a row Shutdown
// released, even when its release commits while Shutdown runs: the report counts only
// the rows Shutdown itself gave back, here the two whose handlers ignore its context.
// testhook.BeforeGiveBack holds the give-backs until Shutdown has begun.
func TestShutdownDoesNotCountRowsGivenBackBeforeIt(t *testing.T) {
	t.Parallel()
	eachDriverAndForm(t, []rowactor.Form{rowactor.FormLease}, func(t *testing.T, h *harness) {
		b := h.broker()
		gate := make(chan struct{})
		stuck, _ := stickAndGiveBack(t, h, b, func(int64) { <-gate })
		time.AfterFunc(200*time.Millisecond, func() { close(gate) })
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		rep, err := b.Shutdown(ctx)
		stuck.unblock()
		if !errors.Is(err, rowactor.ErrNotDrained) {
			t.Fatalf("Shutdown with two handlers ignoring its context: %+v, %v; want ErrNotDrained", rep, err)
		}
		// Shutdown released the two stuck rows, and any row of the room no give-back had
		// reached yet (on a loaded machine some had not waited long enough): each is
		// reported released with ErrClosed. A row given back is reported without an error.
		byShutdown, givenBack := 0, 0
		for quiet := false; !quiet; {
			select {
			case s := <-h.settled:
				switch {
				case s.Released && errors.Is(s.Err, rowactor.ErrClosed):
					byShutdown++
				case s.Step == "release" && s.Err == nil:
					givenBack++
				}
			case <-time.After(500 * time.Millisecond):
				quiet = true
			}
		}
		if rep.Released != byShutdown || byShutdown < len(stuck.slow) {
			t.Fatalf("Shutdown reported %d rows released; it released %d (at least the %d stuck), and %d were given back "+
				"before it: only its own count", rep.Released, byShutdown, len(stuck.slow), givenBack)
		}
	})
}
