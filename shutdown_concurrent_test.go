package rowactor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// Review findings on Shutdown called from handlers (change 5). Each scenario fails on the
// current code; see the report on the review branch.

func init() {
	scenarios = append(scenarios,
		scenario{
			name:  "shutdown from a handler while a Shutdown drains returns at once",
			forms: []rowactor.Form{rowactor.FormLease, rowactor.FormRowLock},
			run:   reviewShutdownDuringShutdownScenario,
		},
		scenario{
			name:  "two handlers calling Shutdown at once both return at once",
			forms: []rowactor.Form{rowactor.FormLease, rowactor.FormRowLock},
			run:   reviewTwoHandlersShutdownScenario,
		},
	)
}

type shutdownCall struct {
	id   int64
	err  error
	took time.Duration
}

// handlerShutdown is a handler that waits for gate, then calls b.Shutdown with its own
// context (as a service would), and reports what the call returned and how long it took.
// unstick ends the call's context, so that a test that found it blocked can clean up.
func handlerShutdown(b **rowactor.Broker, entered chan<- int64, gate <-chan struct{}, unstick context.Context, calls chan<- shutdownCall) rowactor.Handler {
	return func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		entered <- d.ID()
		<-gate
		sctx, cancel := context.WithCancel(ctx)
		context.AfterFunc(unstick, cancel) // only to clean up after a blocked call
		start := time.Now()
		_, err := (*b).Shutdown(sctx)
		calls <- shutdownCall{id: d.ID(), err: err, took: time.Since(start)}
		return rowactor.Ack()
	}
}

// reviewShutdownDuringShutdownScenario: the service's main goroutine calls Shutdown (a
// SIGTERM) while a handler runs; the handler, on its own, decides to shut the broker down
// too. Shutdown's doc: "Called from a handler ..., Shutdown cannot wait for the delivery
// that called it: it returns ErrShutdownInHandler at once". But the handler's call is the
// second call, which "waits for the first to finish" -- and the first waits (drains) for
// that very handler. With the handler's own context, and a main Shutdown without a
// deadline, this never ends; here the main call has 20 s.
func reviewShutdownDuringShutdownScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	entered := make(chan int64, 8)
	gate := make(chan struct{})
	calls := make(chan shutdownCall, 8)
	unstick, cancelUnstick := context.WithCancel(context.Background())
	defer cancelUnstick()
	h.subscribe(b, handlerShutdown(&b, entered, gate, unstick, calls))
	h.publish(b, 1)
	select {
	case <-entered:
	case <-time.After(15 * time.Second):
		t.Fatal("the row was not delivered in 15 s")
	}
	type outerResult struct {
		rep rowactor.ShutdownReport
		err error
	}
	outer := make(chan outerResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		rep, err := b.Shutdown(ctx)
		outer <- outerResult{rep, err}
	}()
	time.Sleep(300 * time.Millisecond) // the main Shutdown is draining, waiting for the handler
	close(gate)
	select {
	case c := <-calls:
		if c.took > 2*time.Second || !(errors.Is(c.err, rowactor.ErrShutdownInHandler) || errors.Is(c.err, rowactor.ErrClosed)) {
			t.Errorf("Shutdown from the handler returned %v after %v", c.err, c.took)
		}
	case <-time.After(5 * time.Second):
		cancelUnstick()
		c := <-calls
		t.Errorf("Shutdown called from a handler while another Shutdown drained blocked: still waiting after 5 s "+
			"(returned %v after %v only once the test cancelled its context); the broker's own Shutdown waits for this "+
			"handler, the handler for that Shutdown: with context.Background() in main this is a permanent deadlock", c.err, c.took)
	}
	o := <-outer
	if o.err != nil || !o.rep.Drained {
		t.Errorf("the main Shutdown: %+v, %v; want drained, the handler having returned", o.rep, o.err)
	}
	if s := h.waitSettled(1)[0]; s.Err != nil || s.Step != "ack" {
		t.Errorf("the handler's Ack did not settle: %+v", s)
	}
}

// reviewTwoHandlersShutdownScenario: two handlers in work each decide to shut the broker
// down (a fatal condition both see). The first call returns ErrShutdownInHandler and shuts
// down in the background, draining: it waits for the second handler. The second call
// (made from a handler too) is "a second Shutdown" and waits for the first: each waits for
// the other. With the handlers' own contexts (ended only when Shutdown stops the
// subscription, after the drain) nothing ever returns.
func reviewTwoHandlersShutdownScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	entered := make(chan int64, 8)
	gate := make(chan struct{})
	calls := make(chan shutdownCall, 8)
	unstick, cancelUnstick := context.WithCancel(context.Background())
	defer cancelUnstick()
	h.subscribe(b, handlerShutdown(&b, entered, gate, unstick, calls), rowactor.Workers(2))
	h.publish(b, 2)
	for range 2 {
		select {
		case <-entered:
		case <-time.After(15 * time.Second):
			t.Fatal("both rows were not in work within 15 s")
		}
	}
	close(gate)
	var got []shutdownCall
	timeout := time.After(5 * time.Second)
	for len(got) < 2 {
		select {
		case c := <-calls:
			got = append(got, c)
		case <-timeout:
			cancelUnstick()
			for len(got) < 2 {
				got = append(got, <-calls)
			}
			t.Errorf("two handlers called Shutdown: after 5 s only %d of the calls had returned; the rest returned only "+
				"once the test cancelled their contexts: %+v", countQuick(got), got)
		}
	}
	for _, c := range got {
		if c.took > 2*time.Second {
			t.Errorf("handler of row %d: Shutdown returned %v after %v, want ErrShutdownInHandler (or ErrClosed) at once", c.id, c.err, c.took)
		}
	}
	for _, s := range h.waitSettled(2) {
		if s.Err != nil || s.Step != "ack" {
			t.Errorf("a handler's Ack did not settle: %+v", s)
		}
	}
}

func countQuick(cs []shutdownCall) int {
	n := 0
	for _, c := range cs {
		if c.took <= 2*time.Second {
			n++
		}
	}
	return n
}
