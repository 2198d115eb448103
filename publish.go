package rowactor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
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

// WithHeaders stores headers in the table's headers column as a JSON object. rowactor
// adds the W3C traceparent and tracestate of the publishing span, and the publish time.
// A table described without a headers column refuses headers with a *ConfigError; only
// rowactor's own are skipped there.
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

// After makes the row due only after d. It needs the table's retry_after column.
func After(d time.Duration) PublishOption {
	return func(p *publishing) { p.delay, p.delaySet = d, true }
}

// Unique publishes the row with a unique key. It needs the table's UniqueKey column.
//
// When a row of the table holds the key already, Publish inserts nothing and returns that
// row's id with an error matching ErrDuplicate, so the caller can tell. A row holds its key while it is queued, in work, in a dead-letter group, or
// kept finished with ProcessedAt unless Table.ClearUniqueKeyAtAck. A deleted row frees
// its key. Publishes racing with one key, from any number of processes, leave one row.
//
// In PublishTx the id is the row holding the key when the publish runs, even in a
// transaction whose snapshot is older than that row. MySQL reads it with a locking read.
// PostgreSQL at repeatable read or serializable, and SQLite, refuse such a publish
// instead, with a serialization failure: SQLSTATE 40001 or SQLITE_BUSY_SNAPSHOT. Retry
// the transaction then.
func Unique(key string) PublishOption {
	return func(p *publishing) { p.unique, p.uniqueSet = key, true }
}

// Priority publishes the row with priority n. It needs the table's Priority column.
// Claims take the due rows of the lowest number first, and rows of one priority in id
// order. A publish without it writes 0, so 1 and above run after the default and
// negative numbers before it.
func Priority(n int) PublishOption {
	return func(p *publishing) { p.priority, p.prioritySet = n, true }
}

// Publish inserts a row into table t for queue, and wakes this process's subscriptions
// to that queue at once. It returns the row's id. In a table with groups, queue is the
// row's group.
func (b *Broker) Publish(ctx context.Context, t Table, queue string, payload []byte, opts ...PublishOption) (int64, error) {
	id, err := b.publish(ctx, nil, t, queue, payload, opts)
	if err == nil {
		b.wake(t, queue)
	}
	return id, err
}

// PublishTx inserts a row inside the caller's transaction tx, so it exists only if the
// caller commits: the transactional outbox pattern. tx is a *sql.Tx on every database
// (begin it on DB, or on your own *sql.DB), or a pgx.Tx on PostgreSQL. It returns the
// row's id.
//
// This process's subscribers see the row soon after the commit, with no call of yours:
// on PostgreSQL NOTIFY wakes them at the commit; elsewhere their table's idle poll
// hurries for two seconds after a PublishTx, probing every few milliseconds, so a commit
// within that window is seen at once, and a later one at the next poll (call Wake after
// such a commit). Through a transactional delivery's Tx, they wake after its Ack
// commits. See docs/outbox.md.
func (b *Broker) PublishTx(ctx context.Context, tx any, t Table, queue string, payload []byte, opts ...PublishOption) (int64, error) {
	if tx == nil {
		return 0, fmt.Errorf("rowactor: PublishTx to %s needs the caller's transaction; use Publish without one", t.Name)
	}
	id, err := b.publish(ctx, tx, t, queue, payload, opts)
	if err == nil {
		if d, ok := ctx.Value(deliveryKey{}).(*Delivery); ok && d.lends(tx) {
			d.publishedTo(t, queue) // woken after the delivery's Ack commits
		} else if !b.notified.Load() {
			b.hurry(t)
		}
	}
	return id, err
}

// publishTxHurry is how long a table's idle polls hurry after a PublishTx: a service's
// transaction commits within milliseconds of its last statement, as a rule.
const publishTxHurry = 2 * time.Second

// hurry makes the idle polls of t's subscriptions in this broker probe every few
// milliseconds for publishTxHurry: a row published in a caller's transaction is seen soon
// after its commit, which nothing else tells this process without NOTIFY.
func (b *Broker) hurry(t Table) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for key, p := range b.idlePolls {
		if key.table.Name == t.Name {
			p.Hurry(publishTxHurry)
		}
	}
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
		if errors.Is(err, ErrDuplicate) {
			// Not a failure: the key's holder is the answer.
			span.SetAttributes(telemetry.MessageID.String(strconv.FormatInt(id, 10)), attribute.Bool("rowactor.duplicate", true))
		} else if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else {
			span.SetAttributes(telemetry.MessageID.String(strconv.FormatInt(id, 10)))
		}
		span.End()
	}()
	m := dialects.Message{Payload: payload, Priority: pub.priority, UniqueKey: pub.unique}
	if pub.delaySet {
		m.NotBefore = b.now().Add(pub.delay) // the broker's clock, which WithClock may set
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
	if errors.Is(err, ErrDuplicate) {
		return id, fmt.Errorf("rowactor: publish to %s: %w", t.Name, err)
	}
	if err != nil {
		return 0, b.closedUnder(t, fmt.Errorf("rowactor: publish to %s: %w", t.Name, err))
	}
	b.tel.Published(ctx, t.Name, queue)
	return id, nil
}

// closedUnder is a database error of a publish, or ErrClosed when Shutdown closed the
// statements or pool under the publish because its context ended first. Whatever the
// driver said then, the broker is closed.
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
