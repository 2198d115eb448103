package rowactor_test

import (
	"context"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/rowactor/rowactor"
)

// TestDeliveryActorsOnAServicesSystemCountInItsMetrics: on a service's own actor system
// with Proto.Actor's metrics on (WithActorSystem), every delivery actor that ends counts
// as stopped, as every one spawned counts as spawned: a stopped count left behind would
// read as a leak of actors on the service's dashboard.
func TestDeliveryActorsOnAServicesSystemCountInItsMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	otel.SetMeterProvider(mp) // Proto.Actor's metrics take the global meter provider
	sys := actor.NewActorSystem(actor.WithMetricProviders(mp))
	t.Cleanup(sys.Shutdown)

	h := newHarness(t, driverNamed(t, "sqlite"), rowactor.FormLease)
	b := h.broker(rowactor.WithActorSystem(sys))
	const rows = 20
	ids := h.publish(b, rows)
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }, rowactor.Workers(2))
	h.waitSettled(rows)
	for _, id := range ids {
		if s := h.row(id); s.exists && s.processedAt == nil {
			t.Fatalf("row %d not acked: %+v", id, s)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range s.DataPoints {
					got[m.Name] += dp.Value
				}
			}
		}
	}
	spawned, stopped := got["protoactor_actor_spawn_count"], got["protoactor_actor_stopped_count"]
	if spawned < rows || stopped < rows {
		t.Fatalf("after %d deliveries ended: %d actors spawned, %d stopped; want at least %d of each", rows, spawned, stopped, rows)
	}
}
