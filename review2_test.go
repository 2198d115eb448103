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

// Review 2 findings on the late changes. Each scenario fails on the current code.

func init() {
	scenarios = append(scenarios, scenario{
		name:  "a Shutdown whose ctx ended right after a handler's Shutdown still ends the drain",
		forms: []rowactor.Form{rowactor.FormLease},
		run:   review2SecondShutdownRaceScenario,
	})
}

// review2SecondShutdownRaceScenario: handler A waits for its context (a well-behaved handler
// that returns when cancelled). Handler B calls Shutdown(context.Background()) – it runs in
// the background with no deadline – and at once a Shutdown whose ctx has already ended is
// called from another goroutine. That second Shutdown must end the drain (so A is cancelled
// and returns) and return. If it runs before the background shutdown stored its
// cancelDrain, endDrain is a no-op and it waits forever for a drain nobody can end.
func review2SecondShutdownRaceScenario(t *testing.T, h *harness, _ rowactor.Form) {
	prev := runtime.GOMAXPROCS(1) // the goroutine spawned last runs first
	defer runtime.GOMAXPROCS(prev)
	for round := 0; round < 20 && !t.Failed(); round++ {
		review2SecondShutdownRound(t, h, round)
	}
}

func review2SecondShutdownRound(t *testing.T, h *harness, round int) {
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

// TestReview2MySQLPoolLimitedAfterSubscribe: BudgetSized follows a pool resized while a
// subscription runs, but only a pool that had a limit when the subscription subscribed:
// Limits returns no Budget for an unlimited pool, and newShare then gives the
// subscription a budget of MaxInt for good. A pool limited later (db.SetMaxOpenConns(4))
// is not followed: an advisory subscription with Workers(7) takes every connection of
// the pool in sessions, and nothing is left for a Publish.
func TestReview2MySQLPoolLimitedAfterSubscribe(t *testing.T) {
	h := newHarness(t, driverNamed(t, "mysql"), rowactor.FormAdvisory)
	d, _ := sizedDialect(t, h, 0) // unlimited
	b := h.brokerOn(d, rowactor.WithPollOnly())
	hold := make(chan struct{})
	defer close(hold)
	h.subscribe(b, func(ctx context.Context, _ *rowactor.Delivery) rowactor.Outcome {
		select {
		case <-hold:
		case <-ctx.Done():
		}
		return rowactor.Ack()
	}, rowactor.Workers(7), rowactor.PollInterval(200*time.Millisecond))
	db := mysqlDB(d)
	db.SetMaxOpenConns(4) // a budget of 3 from now on, were it followed
	for i := range 8 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		_, err := b.Publish(ctx, h.table, h.queue, []byte("x"))
		cancel()
		if err != nil {
			t.Fatalf("publish %d after the unlimited pool was limited to 4: %v after %v; pool %+v",
				i, err, time.Since(start).Round(time.Millisecond), db.Stats())
		}
		time.Sleep(300 * time.Millisecond)
	}
}
