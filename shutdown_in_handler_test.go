package rowactor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

func init() {
	for _, v := range []struct {
		name string
		ctx  func(handler context.Context) context.Context
	}{
		{"its own context", func(h context.Context) context.Context { return h }},
		{"a background context", func(context.Context) context.Context { return context.Background() }},
	} {
		scenarios = append(scenarios, scenario{
			name: "shutdown called from a handler with " + v.name + " returns at once and the delivery settles",
			run: func(t *testing.T, h *harness, _ rowactor.Form) {
				shutdownInHandlerScenario(t, h, v.ctx)
			},
		})
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
