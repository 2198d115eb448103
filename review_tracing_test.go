package rowactor_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/rowactor/rowactor"
)

// The tracing tests depend on otel's global tracer provider being unset, and one of them
// sets it: they run in a child process of their own so the rest of the package never sees
// the global they set.
const review16Child = "ROWACTOR_REVIEW16_TRACING_CHILD"

func TestReview16Tracing(t *testing.T) {
	if os.Getenv(review16Child) != "" {
		t.Skip("the parent runs the children")
	}
	for _, name := range []string{"TestReview16ChildPassThrough", "TestReview16ChildProviderSetLater", "TestReview16ChildQueueWait"} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), review16Child+"=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s failed: %v\n%s", name, err, out)
			}
			t.Logf("%s", out)
		})
	}
}

func review16ChildOnly(t *testing.T) {
	if os.Getenv(review16Child) == "" {
		t.Skip("run through TestReview16Tracing")
	}
}

// remoteParent is a context carrying a sampled remote span context, as a service's
// incoming request would with an otel propagator and no SDK of its own.
func remoteParent() (context.Context, trace.SpanContext) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
		Remote:     true,
	})
	return trace.ContextWithRemoteSpanContext(context.Background(), sc), sc
}

// TestReview16ChildPassThrough: with no tracer provider set anywhere, OpenTelemetry's API
// still propagates a span context (a non-recording span carries its parent's). rowactor
// always injects and extracts the W3C traceparent itself (propagation.TraceContext): a
// publish made in a traced request writes the request's traceparent into the headers
// column, and the first delivery's handler context used to carry that span context, so a
// handler's logs, its outgoing calls and what it publishes stay in the caller's trace.
func TestReview16ChildPassThrough(t *testing.T) {
	review16ChildOnly(t)
	for _, db := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(db, func(t *testing.T) {
			h := newHarness(t, driverNamed(t, db), rowactor.FormLease)
			b := h.broker()
			got := make(chan trace.SpanContext, 1)
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				got <- trace.SpanContextFromContext(ctx)
				return rowactor.Ack()
			})
			ctx, sc := remoteParent()
			if _, err := b.Publish(ctx, h.table, h.queue, []byte("x")); err != nil {
				t.Fatal(err)
			}
			h.waitSettled(1)
			if in := <-got; in.TraceID() != sc.TraceID() {
				t.Fatalf("the handler's context carries trace %v; want the publisher's %v (the traceparent in the row's headers)", in.TraceID(), sc.TraceID())
			}
		})
	}
}

// TestReview16ChildProviderSetLater: a broker made while the global provider is unset
// makes spans once a program sets one.
func TestReview16ChildProviderSetLater(t *testing.T) {
	review16ChildOnly(t)
	h := newHarness(t, driverNamed(t, "postgres"), rowactor.FormLease)
	b := h.broker()
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	h.publish(b, 1)
	h.waitSettled(1)

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	otel.SetTracerProvider(tp)
	defer func() { _ = tp.Shutdown(context.Background()) }()
	h.publish(b, 1)
	h.waitSettled(1)
	deadline := time.Now().Add(5 * time.Second)
	for {
		var process, settle, publish int
		for _, s := range rec.Ended() {
			switch n := s.Name(); {
			case len(n) > 8 && n[:8] == "process ":
				process++
			case len(n) > 7 && n[:7] == "settle ":
				settle++
			case len(n) > 8 && n[:8] == "publish ":
				publish++
			}
		}
		if process == 1 && settle == 1 && publish == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after otel.SetTracerProvider: %d publish, %d process, %d settle spans; want 1 each", publish, process, settle)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReview16ChildQueueWait: with no tracer set, the queue wait is still measured.
func TestReview16ChildQueueWait(t *testing.T) {
	review16ChildOnly(t)
	for _, db := range []string{"postgres", "sqlite"} {
		t.Run(db, func(t *testing.T) {
			h := newHarness(t, driverNamed(t, db), rowactor.FormLease)
			tel := newTelemetry(t)
			b := h.broker(rowactor.WithMeterProvider(tel.mp))
			h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
			h.publish(b, 3)
			h.waitSettled(3)
			if n := tel.sum(t, "rowactor.queue.wait"); n != 3 {
				t.Fatalf("queue waits recorded %d, want 3", n)
			}
			if n := tel.sum(t, "rowactor.deliveries"); n != 3 {
				t.Fatalf("deliveries counted %d, want 3", n)
			}
		})
	}
}
