package outbox

import (
	"context"
	"fmt"

	"github.com/rowactor/rowactor"
)

// Record is an outbox record as the relay hands it to a sink.
type Record struct {
	ID      int64
	Topic   string
	Payload []byte
	// Headers are the record's own headers plus IDHeader and TableHeader. The sink must
	// carry IDHeader to the consumer: Outbox.Handler settles the record by it.
	Headers map[string]string
}

// Sink is where a relay sends records. Send returns nil only once the record is in the
// sink's keeping (committed, acknowledged by a broker): the relay then stamps it sent. An
// error leaves it unsent; the relay stops its round and tries again after a backoff, from
// the first record still unsent, so records leave in id order. A record the sink can
// never take blocks those after it: handle it (e.g. dead-letter it) and return nil.
//
// Send must return when ctx ends: the relay's Stop cancels it. ctx carries the record's
// trace context (from its traceparent header) as its remote parent span, so that what
// Send traces (a rowactor publish) joins the trace of the request that recorded it.
type Sink interface {
	Send(ctx context.Context, r Record) error
}

// SinkFunc adapts a function to a Sink.
type SinkFunc func(ctx context.Context, r Record) error

// Send calls f.
func (f SinkFunc) Send(ctx context.Context, r Record) error { return f(ctx, r) }

// QueueSink publishes records into a rowactor queue table through a broker, on the
// outbox's database or any other. Each record becomes a row of queue Queue (or, when Queue
// is empty, of the queue named by the record's topic) with the record's headers in the
// table's headers column; the broker wakes its local subscribers at once.
type QueueSink struct {
	b     *rowactor.Broker
	t     rowactor.Table
	queue string
}

// NewQueueSink returns a sink publishing into table t through b. queue names the queue
// every record goes to; empty means the queue named by each record's topic (a group, in a
// table with groups). The table needs a Headers column: the record's id rides in it.
func NewQueueSink(b *rowactor.Broker, t rowactor.Table, queue string) (*QueueSink, error) {
	if b == nil {
		return nil, fmt.Errorf("rowactor/outbox: NewQueueSink needs a broker")
	}
	if t.Headers == "" {
		return nil, &rowactor.ConfigError{Table: t.Name, Option: "Table.Headers",
			Reason: "an outbox record's id travels in the headers column, and the queue table names none",
			Fix:    "add a headers column (rowactor.Schema renders it) and set Table.Headers"}
	}
	return &QueueSink{b: b, t: t, queue: queue}, nil
}

// Send publishes r.
func (s *QueueSink) Send(ctx context.Context, r Record) error {
	queue := s.queue
	if queue == "" {
		queue = r.Topic
	}
	if _, err := s.b.Publish(ctx, s.t, queue, r.Payload, rowactor.WithHeaders(r.Headers)); err != nil {
		return fmt.Errorf("rowactor/outbox: send record %d to %s/%s: %w", r.ID, s.t.Name, queue, err)
	}
	return nil
}
