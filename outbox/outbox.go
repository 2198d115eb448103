package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/rowactor/rowactor/dialects"
)

// Table describes an outbox table: which of its columns play which role. Every field but
// Headers is required.
//
//	orders := outbox.Table{
//		Name: "order_outbox", ID: "id", Topic: "topic", Payload: "payload",
//		Headers: "headers", SentAt: "sent_at", ProcessedAt: "processed_at",
//	}
type Table = dialects.OutboxTable

// The headers the relay adds to every record it sends. A record's own headers may not use
// these names.
const (
	// IDHeader carries the record's id (decimal): the consumer settles the record by it,
	// and dedupes by it.
	IDHeader = "rowactor-outbox-id"
	// TableHeader carries the outbox table's name, so a consumer settles only records of
	// its own outbox.
	TableHeader = "rowactor-outbox-table"
)

// ErrUnsupported reports a dialect that keeps no outbox.
var ErrUnsupported = errors.New("rowactor/outbox: the dialect keeps no outbox")

// Schema renders the CREATE TABLE of an outbox table and its indexes in the dialect's
// column types.
func Schema(d dialects.Dialect, t Table) (string, error) {
	od, err := outboxDialect(d)
	if err != nil {
		return "", err
	}
	return od.OutboxSchema(t)
}

func outboxDialect(d dialects.Dialect) (dialects.OutboxDialect, error) {
	od, ok := d.(dialects.OutboxDialect)
	if !ok {
		name := "nil"
		if d != nil {
			name = d.Name()
		}
		return nil, fmt.Errorf("%w (%s)", ErrUnsupported, name)
	}
	return od, nil
}

// Option configures an Outbox.
type Option func(*config)

type config struct {
	log        *slog.Logger
	now        func() time.Time
	fetchRetry time.Duration
}

// WithLogger sends the outbox's logs (its relays' and its consumer wrappers') to l.
// Defaults to slog.Default() at warn and above: the outbox is quiet unless something is
// wrong.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithClock makes now the source of sent_at and processed_at. Defaults to time.Now.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// FetchRetry sets the delay Outbox.Handler retries a delivery after when it cannot read
// the record from the outbox's database (without running the handler), so a consumer
// whose outbox database is down does not spin on its queue. The queue table needs a
// retry_after column for the delay; without one rowactor retries at once. Defaults to 1 s.
func FetchRetry(d time.Duration) Option { return func(c *config) { c.fetchRetry = d } }

// Outbox is one outbox table on one database: it records messages in callers'
// transactions, runs relays, and settles records for consumers. It is safe for concurrent
// use.
type Outbox struct {
	d     dialects.Dialect
	t     Table
	store dialects.OutboxStore
	cfg   config

	mu     sync.Mutex
	relays map[*Relay]struct{}

	// own is the consumer side behind Outbox.Handler and Outbox.Settled (consumer.go).
	own *Consumer
}

// New checks the outbox table against the live database (every described column exists,
// with a type the dialect can bind) and prepares its statements. A description that cannot
// work is refused with a *rowactor.ConfigError naming the table, the column and the fix.
// The caller keeps owning the dialect.
func New(ctx context.Context, d dialects.Dialect, t Table, opts ...Option) (*Outbox, error) {
	od, err := outboxDialect(d)
	if err != nil {
		return nil, err
	}
	cfg := config{now: time.Now, fetchRetry: time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.log == nil {
		cfg.log = slog.New(warnOnly{slog.Default().Handler()})
	}
	if cfg.fetchRetry <= 0 {
		return nil, &dialects.ConfigError{Table: t.Name, Option: "FetchRetry",
			Reason: fmt.Sprintf("FetchRetry(%v) is not a positive delay", cfg.fetchRetry), Fix: "use a positive duration such as time.Second"}
	}
	store, err := od.OpenOutbox(ctx, t)
	if err != nil {
		return nil, err
	}
	o := &Outbox{d: d, t: t, store: store, cfg: cfg, relays: make(map[*Relay]struct{})}
	o.own = o.Consumer()
	return o, nil
}

// Table is the outbox's table description.
func (o *Outbox) Table() Table { return o.t }

// Record inserts a record inside the caller's transaction tx (pgx.Tx on PostgreSQL,
// *sql.Tx on MySQL and SQLite) and returns its id. The record exists only if the caller
// commits, and no relay sees it before: call Wake after the commit to have it sent at
// once rather than at the relay's next poll. headers may be nil; they need the table's
// Headers column.
//
// With a headers column, Record also keeps the trace context of ctx's span (the W3C
// traceparent and tracestate headers) unless headers carry a traceparent of their own:
// the relay sends the record in that trace, so the consumer's span joins the trace of the
// request that recorded it.
func (o *Outbox) Record(ctx context.Context, tx any, topic string, payload []byte, headers map[string]string) (int64, error) {
	if tx == nil {
		return 0, fmt.Errorf("rowactor/outbox: record in %s needs the caller's transaction: the record must commit with the business change", o.t.Name)
	}
	if topic == "" {
		return 0, fmt.Errorf("rowactor/outbox: record in %s: the topic is empty", o.t.Name)
	}
	r := dialects.OutboxRecord{Topic: topic, Payload: payload}
	headers = withTraceContext(ctx, o.t, headers)
	if len(headers) > 0 {
		if o.t.Headers == "" {
			return 0, &dialects.ConfigError{Table: o.t.Name, Option: "outbox.Table.Headers",
				Reason: "the record has headers, and the outbox table names no headers column to keep them",
				Fix:    "add a headers column (outbox.Schema renders it) and set Table.Headers, or record without headers"}
		}
		for _, k := range []string{IDHeader, TableHeader} {
			if _, ok := headers[k]; ok {
				return 0, fmt.Errorf("rowactor/outbox: record in %s: header %q is the relay's own; name yours otherwise", o.t.Name, k)
			}
		}
		b, err := json.Marshal(headers)
		if err != nil {
			return 0, fmt.Errorf("rowactor/outbox: record in %s: headers: %w", o.t.Name, err)
		}
		r.Headers = b
	}
	id, err := o.store.Record(ctx, tx, r)
	if err != nil {
		return 0, fmt.Errorf("rowactor/outbox: record in %s: %w", o.t.Name, err)
	}
	return id, nil
}

// traceparentHeader is the W3C trace context header a record carries its trace in.
const traceparentHeader = "traceparent"

// withTraceContext adds the trace context of ctx's span (W3C traceparent and tracestate)
// to a record's headers, so the consumer's span joins the trace of the request that
// recorded it; headers that carry a traceparent of their own keep it, and a table without
// a headers column records none (as rowactor's publish skips its own headers there). It
// returns a new map and never changes the caller's.
func withTraceContext(ctx context.Context, t Table, headers map[string]string) map[string]string {
	if t.Headers == "" || !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	if _, own := headers[traceparentHeader]; own {
		return headers
	}
	out := make(map[string]string, len(headers)+2)
	propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(out))
	maps.Copy(out, headers)
	return out
}

// Status is what a record's row says of it.
type Status struct {
	// Exists is false when the outbox holds no record with the id.
	Exists bool
	// SentAt is when the relay last sent the record; zero when it was never sent.
	SentAt time.Time
	// ProcessedAt is when a consumer acked or dropped it; zero while unprocessed.
	ProcessedAt time.Time
}

// Sent reports whether the relay sent the record.
func (s Status) Sent() bool { return !s.SentAt.IsZero() }

// Processed reports whether a consumer acked or dropped the record.
func (s Status) Processed() bool { return !s.ProcessedAt.IsZero() }

// Status reads a record's row.
func (o *Outbox) Status(ctx context.Context, id int64) (Status, error) {
	st, err := o.store.State(ctx, id)
	if err != nil {
		return Status{}, fmt.Errorf("rowactor/outbox: status of record %d in %s: %w", id, o.t.Name, err)
	}
	return Status{Exists: st.Exists, SentAt: st.SentAt, ProcessedAt: st.ProcessedAt}, nil
}

// Wake tells the relays running on this outbox to look for unsent records now: call it
// after committing a transaction that recorded one.
func (o *Outbox) Wake() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for r := range o.relays {
		r.Wake()
	}
}

// Close releases the outbox's statements. Stop its relays first.
func (o *Outbox) Close() error { return o.store.Close() }

// warnOnly keeps a handler's records at warn and above.
type warnOnly struct{ slog.Handler }

func (w warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && w.Handler.Enabled(ctx, l)
}
func (w warnOnly) WithAttrs(a []slog.Attr) slog.Handler { return warnOnly{w.Handler.WithAttrs(a)} }
func (w warnOnly) WithGroup(n string) slog.Handler      { return warnOnly{w.Handler.WithGroup(n)} }
