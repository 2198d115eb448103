package rowactor_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

var shutdownInHandlerScenarios = []scenario{
	shutdownInHandlerWithContext("its own context", func(h context.Context) context.Context { return h }),
	shutdownInHandlerWithContext("a background context", func(context.Context) context.Context { return context.Background() }),
	{
		name:  "shutdown from a handler while a Shutdown drains returns at once",
		forms: []rowactor.Form{rowactor.FormLease, rowactor.FormRowLock},
		run:   shutdownFromHandlerWhileShutdownDrainsScenario,
	},
	{
		name:  "two handlers calling Shutdown at once both return at once",
		forms: []rowactor.Form{rowactor.FormLease, rowactor.FormRowLock},
		run:   twoHandlersShutdownAtOnceScenario,
	},
	{
		name:  "shutdown from a handler with a context it cancels on return still lets its delivery settle",
		forms: []rowactor.Form{rowactor.FormLease, rowactor.FormRowLock},
		run:   shutdownInHandlerScopedContextScenario,
	},
	{
		name:  "after a handler's Shutdown, a Shutdown from outside still ends the handlers in work by its ctx",
		forms: []rowactor.Form{rowactor.FormLease, rowactor.FormRowLock},
		run:   outerShutdownAfterHandlerShutdownScenario,
	},
	{
		name: "shutdown called from the WithOnSettled hook returns at once, says so, and the broker shuts down",
		run:  shutdownFromOnSettledHookScenario,
	},
}

// shutdownFromOnSettledHookScenario: the hook runs on the delivery it reports, so a
// Shutdown there cannot wait for it either: it returns ErrShutdownInHandler at once, whose
// text names the hook (a service reading "called from a handler" would look for a
// handler), and the broker shuts down in the background.
func shutdownFromOnSettledHookScenario(t *testing.T, h *harness, _ rowactor.Form) {
	type call struct {
		err  error
		took time.Duration
	}
	var (
		b     *rowactor.Broker
		ready = make(chan struct{})
		once  sync.Once
		calls = make(chan call, 1)
	)
	b = h.broker(rowactor.WithOnSettled(func(rowactor.Settlement) {
		<-ready
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			_, err := b.Shutdown(ctx)
			calls <- call{err, time.Since(start)}
		})
	}))
	close(ready)
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	h.publish(b, 1)
	select {
	case c := <-calls:
		if !errors.Is(c.err, rowactor.ErrShutdownInHandler) || c.took > 2*time.Second {
			t.Fatalf("Shutdown from the hook returned %v after %v; want ErrShutdownInHandler at once", c.err, c.took)
		}
		if !strings.Contains(c.err.Error(), "WithOnSettled") {
			t.Errorf("Shutdown from the hook says %q; want it to name the hook", c.err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the hook did not return from Shutdown in 15 s")
	}
	select {
	case <-b.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the broker did not shut down within 10 s of a Shutdown from its hook")
	}
}

// shutdownInHandlerWithContext is the scenario of a handler that calls Shutdown with the
// context ctx makes of its own.
func shutdownInHandlerWithContext(name string, ctx func(handler context.Context) context.Context) scenario {
	return scenario{
		name: "shutdown called from a handler with " + name + " returns at once and the delivery settles",
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			shutdownInHandlerScenario(t, h, ctx)
		},
	}
}

// shutdownInHandlerScenario: a handler decides the service must stop and calls Shutdown.
// Shutdown cannot wait for the delivery that called it: it must return at once with
// ErrShutdownInHandler, the delivery's Ack must still settle, and a Shutdown from outside
// must then wait for the broker to be down.
func shutdownInHandlerScenario(t *testing.T, h *harness, ctxOf func(context.Context) context.Context) {
	b := h.broker()
	returned := make(chan error, 1)
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		_, err := b.Shutdown(ctxOf(ctx))
		returned <- err
		return rowactor.Ack()
	})
	id := h.publish(b, 1)[0]
	select {
	case err := <-returned:
		if !errors.Is(err, rowactor.ErrShutdownInHandler) {
			t.Fatalf("Shutdown from a handler returned %v, want ErrShutdownInHandler", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown called from a handler did not return in 10 s")
	}
	if s := h.waitSettled(1)[0]; s.Err != nil || s.Step != "ack" {
		t.Fatalf("the calling delivery's settlement %+v", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.Shutdown(ctx); !errors.Is(err, rowactor.ErrClosed) || ctx.Err() != nil {
		t.Fatalf("second Shutdown: %v (ctx %v), want ErrClosed once the first finished", err, ctx.Err())
	}
	if h.row(id).exists {
		t.Fatal("the row outlived its ack")
	}
	if _, err := b.Publish(context.Background(), h.table, h.queue, []byte("x")); !errors.Is(err, rowactor.ErrClosed) {
		t.Fatalf("Publish after the shutdown: %v, want ErrClosed", err)
	}
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

// shutdownFromHandlerWhileShutdownDrainsScenario: a handler that calls Shutdown while a
// Shutdown from outside drains for it gets an answer at once, and its Ack settles.
func shutdownFromHandlerWhileShutdownDrainsScenario(t *testing.T, h *harness, _ rowactor.Form) {
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

// twoHandlersShutdownAtOnceScenario: two handlers in work that both call Shutdown with
// their own contexts both get an answer at once, and both Acks settle.
func twoHandlersShutdownAtOnceScenario(t *testing.T, h *harness, _ rowactor.Form) {
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

// shutdownInHandlerScopedContextScenario: a handler that calls Shutdown with a context it
// cancels on return (WithTimeout and defer cancel) does not cut the background drain short:
// both deliveries in work settle their Acks.
func shutdownInHandlerScopedContextScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	entered := make(chan int64, 8)
	gate := make(chan struct{})
	returned := make(chan error, 4)
	var caller atomic.Int64
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		entered <- d.ID()
		<-gate
		if caller.CompareAndSwap(0, d.ID()) {
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err := b.Shutdown(sctx)
			returned <- err
			return rowactor.Ack()
		}
		time.Sleep(300 * time.Millisecond) // finishing its work
		return rowactor.Ack()
	}, rowactor.Workers(2))
	h.publish(b, 2)
	for range 2 {
		select {
		case <-entered:
		case <-time.After(15 * time.Second):
			t.Fatal("both rows were not in work within 15 s")
		}
	}
	close(gate)
	select {
	case err := <-returned:
		if !errors.Is(err, rowactor.ErrShutdownInHandler) {
			t.Fatalf("Shutdown from a handler returned %v, want ErrShutdownInHandler", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown called from a handler did not return in 10 s")
	}
	got := h.waitSettled(2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = b.Shutdown(ctx)
	for _, s := range got {
		if s.Err != nil || s.Step != "ack" {
			t.Errorf("an Ack did not settle (calling handler's row: %d): %+v: the background shutdown ran on the "+
				"handler's context, which ended as the handler returned", caller.Load(), s)
		}
	}
}

// outerShutdownAfterHandlerShutdownScenario: after a handler's Shutdown, a Shutdown from
// outside with a 2 s context still cancels the context of a handler in work by then.
func outerShutdownAfterHandlerShutdownScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	entered := make(chan int64, 8)
	gate := make(chan struct{})
	cleanup := make(chan struct{})
	defer close(cleanup)
	var caller atomic.Int64
	cancelled := make(chan int64, 4)
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		entered <- d.ID()
		<-gate
		if caller.CompareAndSwap(0, d.ID()) {
			_, _ = b.Shutdown(ctx)
			return rowactor.Ack()
		}
		select { // a long job that honours its context
		case <-ctx.Done():
			cancelled <- d.ID()
			return rowactor.Retry()
		case <-cleanup:
			return rowactor.Retry()
		}
	}, rowactor.Workers(2))
	h.publish(b, 2)
	for range 2 {
		select {
		case <-entered:
		case <-time.After(15 * time.Second):
			t.Fatal("both rows were not in work within 15 s")
		}
	}
	close(gate)
	time.Sleep(300 * time.Millisecond) // the handler's Shutdown returned and drains in the background
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	rep, err := b.Shutdown(ctx)
	took := time.Since(start)
	select {
	case <-cancelled:
	case <-time.After(2 * time.Second): // the handler notices its context on its own goroutine
		t.Fatalf("main's Shutdown(2 s) returned (%+v, %v) after %v with the long handler's context never cancelled: "+
			"its row is still held and the broker still draining", rep, err, took.Round(time.Millisecond))
	}
}
