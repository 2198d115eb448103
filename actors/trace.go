package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/rowactor/rowactor/dialects"
	rowheaders "github.com/rowactor/rowactor/internal/headers"
	"github.com/rowactor/rowactor/internal/telemetry"
	"github.com/rowactor/rowactor/settler"
)

// startSpan opens the delivery's consumer span when its actor starts. The publisher's span
// context rides in the headers column: the first delivery is its child; a redelivery
// starts a trace of its own, linked to it, so retries do not stretch the publisher's trace.
//
// A headers column that is not a JSON object of strings is read as far as it can be (see
// internal/headers) and, when the row goes to its handler (handing), logged: once per
// delivery, here, rather than at each Delivery.Headers call.
func (d *delivery) startSpan(handing bool) {
	tel := d.sub.cfg.Telemetry
	row := d.claim.Row
	headers, err := rowheaders.Decode(row.Headers)
	if err != nil && handing {
		d.sub.cfg.Log.Warn("rowactor: a row's headers column is malformed; the delivery reads what it can",
			slog.String("table", d.sub.cfg.Table), slog.String("queue", d.sub.cfg.QueueName), slog.Int64("id", row.ID),
			slog.Any("error", err))
	}
	first := row.Attempt <= 1
	if !tel.Tracing() {
		d.spanCtx, d.span = context.Background(), noSpan
		if headers != nil && first {
			// No span is made, but the publisher's span context still reaches the handler,
			// as a non-recording span would have carried it: its logs, calls and publishes
			// stay in the caller's trace.
			parent := tel.Propagator().Extract(d.spanCtx, propagation.MapCarrier(headers))
			if trace.SpanContextFromContext(parent).IsValid() {
				d.spanCtx = parent
			}
			if at, err := time.Parse(time.RFC3339Nano, headers[telemetry.PublishedAtHeader]); err == nil {
				tel.Waited(d.spanCtx, time.Since(at))
			}
		}
		return
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(tel.SpanAttributes()...),
		trace.WithAttributes(telemetry.MessageID.String(strconv.FormatInt(row.ID, 10)), telemetry.DeliveryAttempt.Int(row.Attempt)),
	}
	base := context.Background()
	if headers != nil {
		parent := tel.Propagator().Extract(base, propagation.MapCarrier(headers))
		if psc := trace.SpanContextFromContext(parent); psc.IsValid() {
			if first {
				base = parent
			} else {
				opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: psc}))
			}
		}
		if at, err := time.Parse(time.RFC3339Nano, headers[telemetry.PublishedAtHeader]); err == nil && first {
			tel.Waited(base, time.Since(at))
		}
	}
	d.spanCtx, d.span = tel.Tracer().Start(base, tel.ProcessName(), opts...)
	d.span.AddEvent("claimed")
}

// noSpan is the span of a delivery made while nothing records spans (Tracing).
var noSpan = trace.SpanFromContext(context.Background())

// settleTraced runs the settlement in a child span of the delivery's.
func (d *delivery) settleTraced() Result {
	if d.span == noSpan {
		return d.settle()
	}
	_, span := d.sub.cfg.Telemetry.Tracer().Start(d.spanCtx, d.sub.cfg.Telemetry.SettleName())
	r := d.settle()
	span.SetAttributes(telemetry.Step.String(r.Step.String()))
	if r.Err != nil {
		span.RecordError(r.Err)
		span.SetStatus(codes.Error, r.Err.Error())
	}
	span.End()
	return r
}

// finishSpan records what became of the delivery on its span and in the metrics, and ends
// the span.
func (d *delivery) finishSpan(r Result, handlerTook time.Duration) {
	tel := d.sub.cfg.Telemetry
	outcome := r.Outcome.Verdict.String()
	if d.span == noSpan {
		if errors.Is(r.Err, settler.ErrLeaseLost) {
			tel.LeaseLost(d.spanCtx)
		}
		tel.Settled(d.spanCtx, outcome, handlerTook, r.Step == dialects.StepDeadLetter && r.Err == nil)
		return
	}
	d.span.SetAttributes(telemetry.Outcome.String(outcome), telemetry.Step.String(r.Step.String()))
	if r.Outcome.Err != nil {
		// The handler's own error (Fail, WithError): an exception event, and the span's
		// status unless the settlement failed too.
		d.span.RecordError(r.Outcome.Err)
		d.span.SetStatus(codes.Error, r.Outcome.Err.Error())
	}
	switch {
	case r.Panic != nil:
		err := fmt.Errorf("handler panicked: %v", r.Panic)
		d.span.RecordError(err)
		d.span.SetStatus(codes.Error, err.Error())
	case r.Err != nil:
		d.span.RecordError(r.Err)
		d.span.SetStatus(codes.Error, r.Err.Error())
	}
	if errors.Is(r.Err, settler.ErrLeaseLost) {
		tel.LeaseLost(d.spanCtx)
	}
	tel.Settled(d.spanCtx, outcome, handlerTook, r.Step == dialects.StepDeadLetter && r.Err == nil)
	d.span.End()
}
