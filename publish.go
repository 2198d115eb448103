package rowactor

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// PublishOption configures one publish.
type PublishOption func(*dialects.Message) error

// WithHeaders stores headers in the table's headers column as a JSON object.
func WithHeaders(h map[string]string) PublishOption {
	return func(m *dialects.Message) error {
		if len(h) == 0 {
			return nil
		}
		b, err := json.Marshal(h)
		if err != nil {
			return err
		}
		m.Headers = b
		return nil
	}
}

// After makes the row due only after d (needs the table's retry_after column).
func After(d time.Duration) PublishOption {
	return func(m *dialects.Message) error {
		m.NotBefore = time.Now().Add(d)
		return nil
	}
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

func (b *Broker) publish(ctx context.Context, tx any, t Table, queue string, payload []byte, opts []PublishOption) (int64, error) {
	if b.closed.Load() {
		return 0, ErrClosed
	}
	p, err := b.publisher(ctx, t)
	if err != nil {
		return 0, err
	}
	m := dialects.Message{Payload: payload}
	if t.Group != "" {
		m.Group = queue // without groups the queue name is only a label
	}
	for _, o := range opts {
		if err := o(&m); err != nil {
			return 0, fmt.Errorf("rowactor: publish to %s: %w", t.Name, err)
		}
	}
	if !m.NotBefore.IsZero() && t.RetryAfter == "" {
		return 0, &ConfigError{Table: t.Name, Option: "After", Reason: "a delayed publish needs the table's retry_after column", Fix: "set Table.RetryAfter, or publish without After"}
	}
	id, err := p.Publish(ctx, tx, m)
	if err != nil {
		return 0, fmt.Errorf("rowactor: publish to %s: %w", t.Name, err)
	}
	return id, nil
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
