package main

import (
	"context"
	"errors"
	"sync/atomic"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/rowactor/rowactor"
)

// telemetryOn is the OpenTelemetry SDK one traced drain runs with: every span sampled and
// batched (the SDK's default batch span processor) to an exporter that only counts them,
// and a meter provider whose manual reader is read once, after the drain.
type telemetryOn struct {
	exp    *discardExporter
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newTelemetry() *telemetryOn {
	t := &telemetryOn{exp: &discardExporter{}, reader: sdkmetric.NewManualReader()}
	t.tp = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(t.exp))
	t.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(t.reader))
	return t
}

func (t *telemetryOn) options() []rowactor.Option {
	return []rowactor.Option{rowactor.WithTracerProvider(t.tp), rowactor.WithMeterProvider(t.mp)}
}

// observed is what a traced drain's telemetry recorded.
type observed struct {
	spans int64 // spans exported
	// deliveries is the rowactor.deliveries counter: a check that telemetry was on.
	deliveries int64
	// claims, claimedRows and claimTime come from the rowactor.claim.rows and
	// rowactor.claim.duration histograms: how rowactor batched its claims.
	claims, claimedRows int64
	claimTime           float64 // seconds
}

// finish flushes and shuts both providers down, after the timed window, and returns what
// they recorded.
func (t *telemetryOn) finish(ctx context.Context) (o observed, err error) {
	var rm metricdata.ResourceMetrics
	err = t.reader.Collect(ctx, &rm)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name == "rowactor.deliveries" {
					for _, dp := range data.DataPoints {
						o.deliveries += dp.Value
					}
				}
			case metricdata.Histogram[int64]:
				if m.Name == "rowactor.claim.rows" {
					for _, dp := range data.DataPoints {
						o.claims += int64(dp.Count)
						o.claimedRows += dp.Sum
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name == "rowactor.claim.duration" {
					for _, dp := range data.DataPoints {
						o.claimTime += dp.Sum
					}
				}
			}
		}
	}
	err = errors.Join(err, t.tp.Shutdown(ctx), t.mp.Shutdown(ctx))
	o.spans = t.exp.spans.Load()
	return o, err
}

// discardExporter receives batches of spans and drops them.
type discardExporter struct{ spans atomic.Int64 }

func (e *discardExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.spans.Add(int64(len(spans)))
	return nil
}

func (e *discardExporter) Shutdown(context.Context) error { return nil }
