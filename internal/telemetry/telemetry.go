// Package telemetry is rowactor's OpenTelemetry: a producer span per publish, a consumer
// span per delivery with its settlement as a child, and metrics per table and queue.
//
// Everything goes through the caller's TracerProvider and MeterProvider (the otel globals
// when none is given); rowactor never sets a global. Metric attributes have low
// cardinality only (table, queue, form, outcome); ids go on spans.
package telemetry

import (
	"context"
	"reflect"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Scope is the instrumentation scope name of rowactor's spans and metrics.
const Scope = "github.com/rowactor/rowactor"

// PublishedAtHeader carries the publish time (RFC 3339, nanoseconds) in a row's headers,
// so the wait in the table can be measured when the row is claimed.
const PublishedAtHeader = "rowactor-published-at"

// Attribute keys, after the OpenTelemetry messaging semantic conventions where they have
// one.
const (
	System          = attribute.Key("messaging.system")
	Destination     = attribute.Key("messaging.destination.name")
	ConsumerGroup   = attribute.Key("messaging.consumer.group.name")
	OperationType   = attribute.Key("messaging.operation.type")
	OperationName   = attribute.Key("messaging.operation.name")
	MessageID       = attribute.Key("messaging.message.id")
	DeliveryAttempt = attribute.Key("rowactor.delivery.attempt")
	Queue           = attribute.Key("rowactor.queue")
	Form            = attribute.Key("rowactor.claim.form")
	Outcome         = attribute.Key("rowactor.outcome")
	Fault           = attribute.Key("rowactor.fault")
	Step            = attribute.Key("rowactor.settlement.step")
	DBSystem        = attribute.Key("db.system.name")
)

// Telemetry holds a broker's tracer and instruments.
type Telemetry struct {
	Tracer     trace.Tracer
	Propagator propagation.TextMapPropagator

	deliveries  metric.Int64Counter
	handlerDur  metric.Float64Histogram
	claimDur    metric.Float64Histogram
	claimRows   metric.Int64Histogram
	inWork      metric.Int64UpDownCounter
	queueWait   metric.Float64Histogram
	extensions  metric.Int64Counter
	leasesLost  metric.Int64Counter
	deadLetters metric.Int64Counter
	abandoned   metric.Int64Counter
	restarts    metric.Int64Counter
	published   metric.Int64Counter
	retained    metric.Int64Counter

	db string
	// global is otel's global provider as New found it when nothing had been set: its
	// tracer records nothing until a program sets one (see Tracing).
	global trace.TracerProvider
}

// New creates the tracer and instruments for a broker on database db.
func New(tp trace.TracerProvider, mp metric.MeterProvider, db string) (*Telemetry, error) {
	m := mp.Meter(Scope)
	t := &Telemetry{Tracer: tp.Tracer(Scope), Propagator: propagation.TraceContext{}, db: db}
	if isUnsetGlobal(tp) {
		t.global = tp
	}
	var err error
	seconds := metric.WithUnit("s")
	if t.deliveries, err = m.Int64Counter("rowactor.deliveries", metric.WithDescription("Deliveries settled, by outcome.")); err != nil {
		return nil, err
	}
	if t.handlerDur, err = m.Float64Histogram("rowactor.handler.duration", seconds, metric.WithDescription("How long handlers ran.")); err != nil {
		return nil, err
	}
	if t.claimDur, err = m.Float64Histogram("rowactor.claim.duration", seconds, metric.WithDescription("How long claims took.")); err != nil {
		return nil, err
	}
	if t.claimRows, err = m.Int64Histogram("rowactor.claim.rows", metric.WithDescription("Rows taken per claim.")); err != nil {
		return nil, err
	}
	if t.inWork, err = m.Int64UpDownCounter("rowactor.deliveries.in_work", metric.WithDescription("Deliveries claimed and not yet settled.")); err != nil {
		return nil, err
	}
	if t.queueWait, err = m.Float64Histogram("rowactor.queue.wait", seconds, metric.WithDescription("Time from publish to claim, when the publish time is known.")); err != nil {
		return nil, err
	}
	if t.extensions, err = m.Int64Counter("rowactor.lease.extensions", metric.WithDescription("Leases extended by the renewer.")); err != nil {
		return nil, err
	}
	if t.leasesLost, err = m.Int64Counter("rowactor.leases.lost", metric.WithDescription("Leases found held by another token.")); err != nil {
		return nil, err
	}
	if t.deadLetters, err = m.Int64Counter("rowactor.dead_letters", metric.WithDescription("Rows moved to their dead letter.")); err != nil {
		return nil, err
	}
	if t.abandoned, err = m.Int64Counter("rowactor.deliveries.abandoned",
		metric.WithDescription("Deliveries whose handler ran past its deadline and its grace: given up on, their rows released.")); err != nil {
		return nil, err
	}
	if t.restarts, err = m.Int64Counter("rowactor.restarts", metric.WithDescription("Claimers and renewers restarted after a failure.")); err != nil {
		return nil, err
	}
	if t.published, err = m.Int64Counter("rowactor.published", metric.WithDescription("Rows published.")); err != nil {
		return nil, err
	}
	if t.retained, err = m.Int64Counter("rowactor.retention.deleted", metric.WithDescription("Finished rows, and dead letters of a dead-letter group (by rowactor.queue), deleted by retention.")); err != nil {
		return nil, err
	}
	return t, nil
}

// Sub is one subscription's view: its attributes are computed once, so recording costs
// no allocation for them.
type Sub struct {
	t     *Telemetry
	table string
	queue string
	form  string
	base  metric.MeasurementOption
	spanA []attribute.KeyValue
	// Span names, built once.
	processName, settleName string
	// byOutcome caches the attribute set per outcome name.
	byOutcome map[string][]metric.AddOption
	addOpts   []metric.AddOption
	recOpts   []metric.RecordOption
}

// Subscription returns the view of a subscription to table's queue in the given form.
func (t *Telemetry) Subscription(table, queue, form string) *Sub {
	s := &Sub{t: t, table: table, queue: queue, form: form, byOutcome: map[string][]metric.AddOption{}}
	s.base = metric.WithAttributeSet(attribute.NewSet(Destination.String(table), Queue.String(queue), Form.String(form)))
	s.addOpts, s.recOpts = []metric.AddOption{s.base}, []metric.RecordOption{s.base}
	s.processName, s.settleName = "process "+table, "settle "+table
	for _, o := range []string{"ack", "drop", "retry", "retry_after", "unsettled"} {
		s.byOutcome[o] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(Destination.String(table), Queue.String(queue), Form.String(form), Outcome.String(o)))}
	}
	s.spanA = []attribute.KeyValue{System.String("rowactor"), DBSystem.String(t.db), Destination.String(table),
		Queue.String(queue), ConsumerGroup.String(queue), Form.String(form),
		OperationType.String("process"), OperationName.String("process")}
	return s
}

// adds and recs are the subscription's attributes as the option lists Add and Record take:
// built once, because a list made at each call (the variadic argument of an interface
// method) is an allocation a message.
func (s *Sub) adds() []metric.AddOption    { return s.addOpts }
func (s *Sub) recs() []metric.RecordOption { return s.recOpts }

// Claimed records one claim.
func (s *Sub) Claimed(ctx context.Context, took time.Duration, rows int) {
	s.t.claimDur.Record(ctx, took.Seconds(), s.recs()...)
	s.t.claimRows.Record(ctx, int64(rows), s.recs()...)
	if rows > 0 {
		s.t.inWork.Add(ctx, int64(rows), s.adds()...)
	}
}

// Waited records the time a row waited in the table, from publish to claim.
func (s *Sub) Waited(ctx context.Context, d time.Duration) {
	s.t.queueWait.Record(ctx, d.Seconds(), s.recs()...)
}

// Settled records a delivery's end.
func (s *Sub) Settled(ctx context.Context, outcome string, handler time.Duration, deadLetter bool) {
	o, ok := s.byOutcome[outcome]
	if !ok {
		o = []metric.AddOption{metric.WithAttributes(Destination.String(s.table), Queue.String(s.queue), Form.String(s.form), Outcome.String(outcome))}
	}
	s.t.deliveries.Add(ctx, 1, o...)
	s.t.handlerDur.Record(ctx, handler.Seconds(), s.recs()...)
	s.t.inWork.Add(ctx, -1, s.adds()...)
	if deadLetter {
		s.t.deadLetters.Add(ctx, 1, s.adds()...)
	}
}

// Abandoned records deliveries given up on past their deadline (rows: a batch's).
func (s *Sub) Abandoned(ctx context.Context, rows int) {
	s.t.abandoned.Add(ctx, int64(rows), s.adds()...)
}

// Renewed records a lease renewal round.
func (s *Sub) Renewed(ctx context.Context, extended, lost int) {
	if extended > 0 {
		s.t.extensions.Add(ctx, int64(extended), s.adds()...)
	}
	if lost > 0 {
		s.t.leasesLost.Add(ctx, int64(lost), s.adds()...)
	}
}

// LeaseLost records a settlement that found its lease gone.
func (s *Sub) LeaseLost(ctx context.Context) { s.t.leasesLost.Add(ctx, 1, s.adds()...) }

// Restarted records a claimer or renewer restart, with the fault behind it ("connection",
// "contention", "schema", "unknown": a closed set, so the attribute stays cheap).
func (s *Sub) Restarted(ctx context.Context, fault string) {
	s.t.restarts.Add(ctx, 1, metric.WithAttributes(Destination.String(s.table), Queue.String(s.queue), Form.String(s.form), Fault.String(fault)))
}

// SpanAttributes are the consumer span's fixed attributes.
func (s *Sub) SpanAttributes() []attribute.KeyValue { return s.spanA }

// Published records a publish into table's queue.
func (t *Telemetry) Published(ctx context.Context, table, queue string) {
	t.published.Add(ctx, 1, metric.WithAttributes(Destination.String(table), Queue.String(queue)))
}

// RetentionDeleted records n rows of table deleted by retention: finished rows, or with a
// group the dead letters of that group (counted under its queue attribute).
func (t *Telemetry) RetentionDeleted(ctx context.Context, table, group string, n int64) {
	if group == "" {
		t.retained.Add(ctx, n, metric.WithAttributes(Destination.String(table)))
		return
	}
	t.retained.Add(ctx, n, metric.WithAttributes(Destination.String(table), Queue.String(group)))
}

// DB is the database's name, for span attributes.
func (t *Telemetry) DB() string { return t.db }

// Tracing says whether the subscription's spans can be recorded. They cannot while the
// tracer is otel's global one and no program set a provider: every span would then be a
// non-recording one that carries nothing, and a delivery skips making it (its span
// options, contexts and attributes cost a dozen allocations a message). Once a provider
// is set, otel.GetTracerProvider returns it, and spans are made again.
func (s *Sub) Tracing() bool {
	return s.t.global == nil || otel.GetTracerProvider() != s.t.global
}

// isUnsetGlobal says whether tp is otel's global provider with nothing set: the type
// otel's internal/global package returns until SetTracerProvider is called.
func isUnsetGlobal(tp trace.TracerProvider) bool {
	return tp == otel.GetTracerProvider() && reflect.TypeOf(tp).String() == "*global.tracerProvider"
}

// Tracer is the subscription's tracer.
func (s *Sub) Tracer() trace.Tracer { return s.t.Tracer }

// Propagator is how span contexts travel in the headers column.
func (s *Sub) Propagator() propagation.TextMapPropagator { return s.t.Propagator }

// Table is the subscription's table.
func (s *Sub) Table() string { return s.table }

// ProcessName and SettleName are the delivery and settlement span names.
func (s *Sub) ProcessName() string { return s.processName }

// SettleName is the settlement span's name.
func (s *Sub) SettleName() string { return s.settleName }
