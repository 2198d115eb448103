package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/outbox"
)

// orderTrace is the span context of an order service's request: a sampled remote parent,
// as an incoming request carries it.
func orderTrace(first byte) trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{first, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, first},
		TraceFlags: trace.FlagsSampled,
		Remote:     true,
	})
}

// The order service's trace reaches the consumer through the outbox: the consumer's span
// is in the trace of the request that recorded the record, whether the record carries its
// own traceparent header or Record took it from the caller's context, though the relay's
// broker traces its publish (which used to write the relay's own new trace over it).
func TestConsumerSpanIsInTheTraceOfTheRequestThatRecorded(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, db)
			ob := e.newOutbox()
			q := e.queueTable()
			spans := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			b, err := rowactor.New(e.conD, rowactor.WithTracerProvider(tp), rowactor.WithLogger(testLogger(t)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = b.Shutdown(context.Background()) })

			var (
				mu     sync.Mutex
				traced = map[int64]trace.TraceID{} // record id -> the handler's trace
			)
			if _, err := b.Subscribe(context.Background(), q, "orders", ob.Handler(func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				id, _ := outbox.RecordID(d)
				mu.Lock()
				traced[id] = trace.SpanContextFromContext(ctx).TraceID()
				mu.Unlock()
				return rowactor.Ack()
			}), rowactor.Lease(time.Minute)); err != nil {
				t.Fatal(err)
			}

			// One record carries the request's traceparent in its own headers; the other is
			// recorded in the request's context and carries none of its own.
			inHeader, inContext := orderTrace(0x4b), orderTrace(0x5c)
			record := func(ctx context.Context, headers map[string]string) int64 {
				t.Helper()
				tx, commit, rollback := e.db.begin(t, e.obD)
				id, err := ob.Record(ctx, tx, "orders", []byte("order"), headers)
				if err != nil {
					_ = rollback()
					t.Fatal(err)
				}
				if err := commit(); err != nil {
					t.Fatal(err)
				}
				return id
			}
			byHeader := record(context.Background(), map[string]string{
				"traceparent": "00-" + inHeader.TraceID().String() + "-" + inHeader.SpanID().String() + "-01"})
			byContext := record(trace.ContextWithRemoteSpanContext(context.Background(), inContext), nil)

			sink, err := outbox.NewQueueSink(b, q, "orders")
			if err != nil {
				t.Fatal(err)
			}
			r, err := ob.StartRelay(sink, outbox.PollInterval(50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			stopAtCleanup(t, r)
			eventually(t, 30*time.Second, "both records handled and stamped processed", func() bool {
				rows := e.rows(ob)
				return len(rows) == 2 && rows[0].processed && rows[1].processed
			})

			mu.Lock()
			defer mu.Unlock()
			for id, want := range map[int64]trace.TraceID{byHeader: inHeader.TraceID(), byContext: inContext.TraceID()} {
				if got := traced[id]; got != want {
					t.Errorf("record %d was handled in trace %s; want the order request's trace %s", id, got, want)
				}
			}
			// The consumer's span, as recorded, is in the request's trace too (it ends once
			// the delivery settled, after the record's stamp).
			consumers := func() map[trace.TraceID]bool {
				in := map[trace.TraceID]bool{}
				for _, s := range spans.Ended() {
					if s.SpanKind() == trace.SpanKindConsumer {
						in[s.SpanContext().TraceID()] = true
					}
				}
				return in
			}
			deadline := time.Now().Add(30 * time.Second)
			for in := consumers(); !in[inHeader.TraceID()] || !in[inContext.TraceID()]; in = consumers() {
				if time.Now().After(deadline) {
					t.Fatalf("consumer spans in traces %v; want %s and %s", in, inHeader.TraceID(), inContext.TraceID())
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
