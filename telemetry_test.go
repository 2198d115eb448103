package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/rowactor/rowactor"
)

// telemetryBundle records a broker's spans and metrics.
type telemetryBundle struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newTelemetry(t *testing.T) *telemetryBundle {
	tb := &telemetryBundle{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tb.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tb.spans))
	tb.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tb.reader))
	t.Cleanup(func() { _ = tb.tp.Shutdown(context.Background()); _ = tb.mp.Shutdown(context.Background()) })
	return tb
}

// newDeltaTelemetry is newTelemetry whose metrics each Collect reads anew: a test reads
// one phase's values by collecting once at its start and once at its end.
func newDeltaTelemetry(t *testing.T) *telemetryBundle {
	tb := newTelemetry(t)
	tb.reader = sdkmetric.NewManualReader(sdkmetric.WithTemporalitySelector(func(sdkmetric.InstrumentKind) metricdata.Temporality {
		return metricdata.DeltaTemporality
	}))
	tb.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tb.reader))
	t.Cleanup(func() { _ = tb.mp.Shutdown(context.Background()) })
	return tb
}

// slowestSeconds reads the largest value a float64 histogram (seconds) recorded.
func (tb *telemetryBundle) slowestSeconds(t *testing.T, name string) float64 {
	t.Helper()
	return histogramMaxOf[float64](t, tb, name)
}

func (tb *telemetryBundle) options() []rowactor.Option {
	return []rowactor.Option{rowactor.WithTracerProvider(tb.tp), rowactor.WithMeterProvider(tb.mp)}
}

func (tb *telemetryBundle) named(prefix string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tb.spans.Ended() {
		if strings.HasPrefix(s.Name(), prefix) {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// sum reads a counter's value for the data points whose attributes include want.
func (tb *telemetryBundle) sum(t *testing.T, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tb.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					if hasAll(dp.Attributes, want) {
						total += dp.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					if hasAll(dp.Attributes, want) {
						total += int64(dp.Count)
					}
				}
			case metricdata.Histogram[int64]:
				for _, dp := range data.DataPoints {
					if hasAll(dp.Attributes, want) {
						total += dp.Sum
					}
				}
			}
		}
	}
	return total
}

func hasAll(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

var telemetryScenarios = []scenario{
	{name: "a trace runs from publish to settlement; a redelivery links to it", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		tel := newTelemetry(t)
		b := h.broker(tel.options()...)
		handlerSpans := make(chan trace.SpanContext, 2)
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			_, own := tel.tp.Tracer("service").Start(ctx, "service work")
			handlerSpans <- own.SpanContext()
			own.End()
			if d.Attempt() <= 1 && len(handlerSpans) == 1 {
				return rowactor.Retry()
			}
			return rowactor.Ack()
		})
		ctx, request := tel.tp.Tracer("service").Start(context.Background(), "http request")
		id, err := b.Publish(ctx, h.table, h.queue, []byte("traced"))
		if err != nil {
			t.Fatal(err)
		}
		request.End()
		h.waitSettled(2)
		waitFor(t, func() bool { return len(tel.named("process ")) == 2 && len(tel.named("settle ")) == 2 })

		pub := tel.named("publish ")
		if len(pub) != 1 || pub[0].SpanKind() != trace.SpanKindProducer || pub[0].Parent().SpanID() != request.SpanContext().SpanID() {
			t.Fatalf("producer spans %v", pub)
		}
		if got := attr(pub[0], "messaging.message.id").AsString(); got != fmt.Sprint(id) {
			t.Fatalf("producer message id %q, want %d", got, id)
		}
		process := tel.named("process ")
		first, second := process[0], process[1]
		if attr(first, "rowactor.delivery.attempt").AsInt64() > attr(second, "rowactor.delivery.attempt").AsInt64() {
			first, second = second, first
		}
		if first.SpanKind() != trace.SpanKindConsumer || first.Parent().SpanID() != pub[0].SpanContext().SpanID() ||
			first.SpanContext().TraceID() != request.SpanContext().TraceID() {
			t.Fatalf("first delivery span is not the publisher's child: parent %v", first.Parent())
		}
		if attr(first, "rowactor.outcome").AsString() != "retry" || attr(second, "rowactor.outcome").AsString() != "ack" {
			t.Fatalf("outcomes %q, %q", attr(first, "rowactor.outcome").AsString(), attr(second, "rowactor.outcome").AsString())
		}
		for k, want := range map[string]string{"messaging.system": "rowactor", "messaging.destination.name": h.table.Name,
			"rowactor.queue": h.queue, "messaging.operation.type": "process", "messaging.message.id": fmt.Sprint(id),
			"rowactor.claim.form": h.table.Form().String()} {
			if got := attr(first, k).AsString(); got != want {
				t.Fatalf("consumer span %s = %q, want %q", k, got, want)
			}
		}
		// The redelivery starts a trace of its own, linked to the publisher's.
		if second.SpanContext().TraceID() == request.SpanContext().TraceID() || len(second.Links()) != 1 ||
			second.Links()[0].SpanContext.SpanID() != pub[0].SpanContext().SpanID() {
			t.Fatalf("redelivery span: trace %v links %v", second.SpanContext().TraceID(), second.Links())
		}
		for _, s := range tel.named("settle ") {
			if s.Parent().SpanID() != first.SpanContext().SpanID() && s.Parent().SpanID() != second.SpanContext().SpanID() {
				t.Fatalf("settle span's parent %v is no delivery span", s.Parent())
			}
		}
		own := <-handlerSpans
		if own.TraceID() != first.SpanContext().TraceID() {
			t.Fatal("the handler's own span is not in the delivery's trace")
		}
		outcome := func(o string) attribute.KeyValue { return attribute.String("rowactor.outcome", o) }
		table := attribute.String("messaging.destination.name", h.table.Name)
		if r, a := tel.sum(t, "rowactor.deliveries", table, outcome("retry")), tel.sum(t, "rowactor.deliveries", table, outcome("ack")); r != 1 || a != 1 {
			t.Fatalf("deliveries retry=%d ack=%d, want 1 and 1", r, a)
		}
		if n := tel.sum(t, "rowactor.handler.duration", table); n != 2 {
			t.Fatalf("handler durations recorded %d, want 2", n)
		}
		if n := tel.sum(t, "rowactor.claim.rows", table); n != 2 {
			t.Fatalf("rows claimed %d, want 2", n)
		}
		if n := tel.sum(t, "rowactor.deliveries.in_work", table); n != 0 {
			t.Fatalf("in work %d after every delivery settled", n)
		}
		if n := tel.sum(t, "rowactor.queue.wait", table); n != 1 {
			t.Fatalf("queue waits recorded %d, want 1 (the first claim)", n)
		}
		if n := tel.sum(t, "rowactor.published", table); n != 1 {
			t.Fatalf("published %d", n)
		}
	}},
	{name: "lease lost, panics and dead letters are span errors and metrics", forms: []rowactor.Form{rowactor.FormLease}, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		tel := newTelemetry(t)
		b := h.broker(tel.options()...)
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			switch string(d.Payload()) {
			case "job-0":
				h.exec(fmt.Sprintf("UPDATE %s SET locked_until = ? WHERE id = ?", h.table.Name), h.drv.timeValue(time.Now().Add(time.Hour).Truncate(time.Second)), d.ID())
				return rowactor.Ack()
			case "job-1":
				if d.Attempt() == 1 {
					panic("boom")
				}
			}
			return rowactor.Retry()
		}, rowactor.MaxAttempts(2), rowactor.DeadLetterGroup("dead"))
		h.publish(b, 2)
		got := h.waitSettled(3) // lease lost; panic; dead letter
		lost := 0
		for _, s := range got {
			if errors.Is(s.Err, rowactor.ErrLeaseLost) {
				lost++
			}
		}
		if lost != 1 {
			t.Fatalf("settlements %+v", got)
		}
		waitFor(t, func() bool { return len(tel.named("process ")) == 3 })
		errs := 0
		for _, s := range tel.named("process ") {
			if s.Status().Code == codes.Error {
				errs++
			}
		}
		if errs != 2 {
			t.Fatalf("%d delivery spans with an error status, want 2 (lease lost, panic)", errs)
		}
		table := attribute.String("messaging.destination.name", h.table.Name)
		if n := tel.sum(t, "rowactor.leases.lost", table); n < 1 {
			t.Fatal("no lost lease counted")
		}
		if n := tel.sum(t, "rowactor.dead_letters", table); n != 1 {
			t.Fatalf("dead letters %d, want 1", n)
		}
	}},
	{name: "a failed delivery's span records the handler's error",
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			tel := newTelemetry(t)
			b := h.broker(tel.options()...)
			h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Fail(errBoom) },
				rowactor.RetryPolicy(func(int, error) time.Duration { return time.Hour }))
			h.publish(b, 1)
			if s := h.waitSettled(1)[0]; s.Err != nil || !errors.Is(s.HandlerErr, errBoom) {
				t.Fatalf("settlement %+v", s)
			}
			waitFor(t, func() bool { return len(tel.named("process ")) == 1 })
			span := tel.named("process ")[0]
			if span.Status().Code != codes.Error || span.Status().Description != errBoom.Error() {
				t.Fatalf("span status %+v, want Error with the handler's error", span.Status())
			}
			if got := attr(span, "rowactor.outcome").AsString(); got != "fail" {
				t.Fatalf("span outcome %q", got)
			}
			exceptions := 0
			for _, e := range span.Events() {
				if e.Name != "exception" {
					continue
				}
				for _, kv := range e.Attributes {
					if kv.Key == "exception.message" && kv.Value.AsString() == errBoom.Error() {
						exceptions++
					}
				}
			}
			if exceptions != 1 {
				t.Fatalf("span events %+v, want one exception event with the handler's error", span.Events())
			}
		}},
}

func TestTelemetry(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			for _, sc := range telemetryScenarios {
				if sc.forms != nil && !hasForm(sc.forms, form) {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/%s", drv.name, form, sc.name), func(t *testing.T) {
					t.Parallel()
					sc.run(t, newHarness(t, drv, form), form)
				})
			}
		}
	}
}

// The tracing tests depend on otel's global tracer provider being unset, and one of them
// sets it: they run in a child process of their own so the rest of the package never sees
// the global they set.
const tracingChildEnv = "ROWACTOR_TRACING_CHILD"

// TestTracingWithNoGlobalProvider runs the tracing children, each in a process of its own.
func TestTracingWithNoGlobalProvider(t *testing.T) {
	t.Parallel()
	if os.Getenv(tracingChildEnv) != "" {
		t.Skip("the parent runs the children")
	}
	for _, name := range []string{"TestTracingChildHandlerContextCarriesThePublishersTrace", "TestTracingChildSpansOnceAProviderIsSetLater", "TestTracingChildQueueWaitMeasuredWithoutATracer"} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), tracingChildEnv+"=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s failed: %v\n%s", name, err, out)
			}
			t.Logf("%s", out)
		})
	}
}

func tracingChildOnly(t *testing.T) {
	if os.Getenv(tracingChildEnv) == "" {
		t.Skip("run through TestTracingWithNoGlobalProvider")
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

// TestTracingChildHandlerContextCarriesThePublishersTrace: with no tracer provider set
// anywhere, OpenTelemetry's API still propagates a span context (a non-recording span
// carries its parent's). rowactor always injects and extracts the W3C traceparent itself
// (propagation.TraceContext): a publish made in a traced request writes the request's
// traceparent into the headers column, and the first delivery's handler context carries
// that span context, so a handler's logs, its outgoing calls and what it publishes stay
// in the caller's trace.
func TestTracingChildHandlerContextCarriesThePublishersTrace(t *testing.T) {
	tracingChildOnly(t)
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

// TestTracingChildSpansOnceAProviderIsSetLater: a broker made while the global provider
// is unset makes spans once a program sets one.
func TestTracingChildSpansOnceAProviderIsSetLater(t *testing.T) {
	tracingChildOnly(t)
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

// TestTracingChildQueueWaitMeasuredWithoutATracer: with no tracer set, the queue wait is
// still measured.
func TestTracingChildQueueWaitMeasuredWithoutATracer(t *testing.T) {
	tracingChildOnly(t)
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
