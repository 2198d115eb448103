package rowactor

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/telemetry"
)

// PublishOption configures one publish.
type PublishOption func(*publishing)

// publishing is a message being built by its options.
type publishing struct {
	headers     map[string]string
	delay       time.Duration
	delaySet    bool
	priority    int
	prioritySet bool
	unique      string
	uniqueSet   bool
}

// WithHeaders stores headers in the table's headers column as a JSON object. rowactor adds
// the W3C traceparent (and tracestate) of the publishing span, and the publish time. A
// table described without a headers column refuses headers with a *ConfigError (only
// rowactor's own are skipped there).
func WithHeaders(h map[string]string) PublishOption {
	return func(p *publishing) {
		for k, v := range h {
			if p.headers == nil {
				p.headers = make(map[string]string, len(h)+3)
			}
			p.headers[k] = v
		}
	}
}

// After makes the row due only after d (needs the table's retry_after column).
func After(d time.Duration) PublishOption {
	return func(p *publishing) { p.delay, p.delaySet = d, true }
}

// Unique publishes the row with a unique key (needs the table's UniqueKey column): when a
// row of the table holds the key already (queued, in work, in a dead-letter group, or
// kept finished with ProcessedAt unless Table.ClearUniqueKeyAtAck), Publish inserts
// nothing and returns that row's id. Publishes racing with one key, from
// any number of processes, leave one row. A deleted row frees its key.
func Unique(key string) PublishOption {
	return func(p *publishing) { p.unique, p.uniqueSet = key, true }
}

// Priority publishes the row with priority n (needs the table's Priority column): claims
// take the due rows of the lowest number first, and rows of one priority in id order. A
// publish without it writes 0, so Priority(1) and above run after the default and
// negative numbers before it.
func Priority(n int) PublishOption {
	return func(p *publishing) { p.priority, p.prioritySet = n, true }
}

// Publish inserts a row into table t for queue (its group, in a table with groups) and
// wakes this process's subscriptions to that queue at once. It returns the row's id.
func (b *Broker) Publish(ctx context.Context, t Table, queue string, payload []byte, opts ...PublishOption) (int64, error) {
	id, err := b.publish(ctx, nil, t, queue, payload, opts)
	if err == nil {
		b.wake(t, queue)
	}
	return id, err
}

// PublishTx inserts a row inside the caller's transaction (pgx.Tx on PostgreSQL, *sql.Tx on
// MySQL and SQLite), so it exists only if the caller commits: the transactional outbox
// pattern. Subscribers wake once it commits: on PostgreSQL through NOTIFY, delivered at the
// commit; through a transactional delivery's Tx, after its Ack commits; otherwise call Wake
// after your commit, or they find the row at their next poll.
func (b *Broker) PublishTx(ctx context.Context, tx any, t Table, queue string, payload []byte, opts ...PublishOption) (int64, error) {
	if tx == nil {
		return 0, fmt.Errorf("rowactor: PublishTx to %s needs the caller's transaction; use Publish without one", t.Name)
	}
	id, err := b.publish(ctx, tx, t, queue, payload, opts)
	if err == nil {
		if d, ok := ctx.Value(deliveryKey{}).(*Delivery); ok && d.tx == tx {
			d.publishedTo(t, queue)
		}
	}
	return id, err
}

// Wake tells this process's subscriptions to a table's queue to claim now: call it after
// committing a transaction that published with PublishTx.
func (b *Broker) Wake(t Table, queue string) { b.wake(t, queue) }

// publish inserts the row inside a producer span whose context, with the publish time,
// rides in the headers column to the consumer.
func (b *Broker) publish(ctx context.Context, tx any, t Table, queue string, payload []byte, opts []PublishOption) (id int64, err error) {
	// Shutdown waits for publishes under way before it closes what they use, and refuses
	// those that come later.
	if !b.enterPublish() {
		return 0, ErrClosed
	}
	defer b.leavePublish()
	var pub publishing
	for _, o := range opts {
		o(&pub)
	}
	if pub.delaySet && t.RetryAfter == "" {
		return 0, &ConfigError{Table: t.Name, Option: "After", Reason: "a delayed publish needs the table's retry_after column", Fix: "set Table.RetryAfter, or publish without After"}
	}
	if pub.uniqueSet && t.UniqueKey == "" {
		return 0, &ConfigError{Table: t.Name, Option: "Unique", Reason: "a publish with a unique key needs the table's unique key column",
			Fix: "set Table.UniqueKey (a nullable text column under a unique index; rowactor.Schema renders both), or publish without Unique"}
	}
	if pub.uniqueSet && pub.unique == "" {
		return 0, &ConfigError{Table: t.Name, Option: "Unique", Reason: "the unique key is empty", Fix: "give Unique a non-empty key, or publish without it"}
	}
	if pub.prioritySet && t.Priority == "" {
		return 0, &ConfigError{Table: t.Name, Option: "Priority", Reason: "a publish with a priority needs the table's priority column",
			Fix: "set Table.Priority (an integer column; rowactor.Schema renders it), or publish without Priority"}
	}
	if len(pub.headers) > 0 && t.Headers == "" {
		// Only the headers rowactor adds itself (traceparent, publish time) are skipped
		// without a headers column; the caller's are never dropped.
		return 0, &ConfigError{Table: t.Name, Option: "WithHeaders", Reason: "headers need the table's headers column, and the description has none",
			Fix: "set Table.Headers (a jsonb / JSON / TEXT column; rowactor.Schema renders it), or publish without WithHeaders"}
	}
	p, err := b.publisher(ctx, t)
	if err != nil {
		return 0, b.closedUnder(t, err)
	}
	ctx, span := b.tel.Tracer.Start(ctx, "publish "+t.Name, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(telemetry.System.String("rowactor"), telemetry.DBSystem.String(b.tel.DB()),
			telemetry.Destination.String(t.Name), telemetry.Queue.String(queue),
			telemetry.OperationType.String("send"), telemetry.OperationName.String("publish")))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else {
			span.SetAttributes(telemetry.MessageID.String(strconv.FormatInt(id, 10)))
		}
		span.End()
	}()
	m := dialects.Message{Payload: payload, Priority: pub.priority, UniqueKey: pub.unique}
	if pub.delaySet {
		m.NotBefore = b.now().Add(pub.delay) // the broker's clock (WithClock)
	}
	if t.Group != "" {
		m.Group = queue // without groups the queue name is only a label
	}
	if t.Headers != "" {
		if pub.headers == nil {
			pub.headers = make(map[string]string, 3)
		}
		b.tel.Propagator.Inject(ctx, propagation.MapCarrier(pub.headers))
		pub.headers[telemetry.PublishedAtHeader] = time.Now().UTC().Format(time.RFC3339Nano)
	}
	if len(pub.headers) > 0 {
		if m.Headers, err = json.Marshal(pub.headers); err != nil {
			return 0, fmt.Errorf("rowactor: publish to %s: headers: %w", t.Name, err)
		}
	}
	id, err = p.Publish(ctx, tx, m)
	if err != nil {
		return 0, b.closedUnder(t, fmt.Errorf("rowactor: publish to %s: %w", t.Name, err))
	}
	b.tel.Published(ctx, t.Name, queue)
	return id, nil
}

// closedUnder is a database error of a publish, or ErrClosed when Shutdown closed the
// statements or pool under the publish (its context ended before the publish did):
// whatever the driver said then, the broker is closed.
func (b *Broker) closedUnder(t Table, err error) error {
	if b.closing.Load() {
		return fmt.Errorf("rowactor: publish to %s: the broker shut down under it: %w", t.Name, ErrClosed)
	}
	return err
}

// publisher returns the table's publisher, checking the table and building its INSERT
// once per broker.
func (b *Broker) publisher(ctx context.Context, t Table) (dialects.Publisher, error) {
	b.mu.Lock()
	p, ok := b.pubs[t]
	b.mu.Unlock()
	if ok {
		return p, nil
	}
	p, err := b.d.Publisher(ctx, t)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.pubs[t] = p
	b.mu.Unlock()
	return p, nil
}

// wake tells this broker's subscriptions to t's queue to claim now.
func (b *Broker) wake(t Table, queue string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.subs {
		if s.table.Name == t.Name && (t.Group == "" || s.queue == queue) {
			s.run.Wake()
		}
	}
}
