package dialects

import (
	"context"
	"time"
)

// The transactional outbox of package outbox keeps its records in a table of the
// service's own, written in the service's transaction, and a relay sends them on.
//
// A dialect that can keep one implements OutboxDialect. Package outbox finds it by type
// assertion on the Dialect, and never switches on the database's name. Every statement
// is built, and prepared against the live table, once per outbox or dedupe table, never
// per record.

// OutboxDialect is a dialect that can keep transactional outboxes and dedupe tables.
type OutboxDialect interface {
	// OutboxSchema renders the CREATE TABLE of an outbox table and its indexes.
	OutboxSchema(t OutboxTable) (string, error)
	// OpenOutbox checks an outbox table against the live database, and builds and
	// prepares its statements. Every named column must exist, with a type the dialect can
	// bind. A description that cannot work is refused with a *ConfigError.
	OpenOutbox(ctx context.Context, t OutboxTable) (OutboxStore, error)
	// DedupeSchema renders the CREATE TABLE of a dedupe table.
	DedupeSchema(t DedupeTable) (string, error)
	// OpenDedupe checks a dedupe table against the live database and builds its insert.
	OpenDedupe(ctx context.Context, t DedupeTable) (DedupeStore, error)
}

// OutboxTable describes an outbox table. Column names are the table's own; every field
// but Headers is required.
type OutboxTable struct {
	// Name is the table's name: one identifier, without a dot.
	Name string
	// ID is the record's integer primary key. The database assigns it in increasing
	// order and never reuses it: an identity, AUTO_INCREMENT, or SQLite AUTOINCREMENT
	// column. Consumers recognise a record sent twice by its id.
	ID string
	// Topic is what the record is about, e.g. "order.created". A sink routes by it: the
	// queue sink publishes into the queue of that name.
	Topic string
	// Payload holds the record's bytes.
	Payload string
	// Headers, when set, holds the record's headers as a JSON object of strings.
	Headers string
	// SentAt is set when the relay handed the record to its sink.
	SentAt string
	// ProcessedAt is set when the consumer's handler acked or dropped the record. Until
	// then the record is sent again at each relay start.
	ProcessedAt string
}

// Columns returns every column the description names, each with its role, in a fixed
// order.
func (t OutboxTable) Columns() []NamedColumn {
	var cols []NamedColumn
	add := func(role, name string) {
		if name != "" {
			cols = append(cols, NamedColumn{Role: role, Name: name})
		}
	}
	add("ID", t.ID)
	add("Topic", t.Topic)
	add("Payload", t.Payload)
	add("Headers", t.Headers)
	add("SentAt", t.SentAt)
	add("ProcessedAt", t.ProcessedAt)
	return cols
}

// DedupeTable describes a consumer's dedupe table: one row per outbox record whose effect
// happened, keyed by the record's id. Record ids are unique within one outbox table, so a
// consumer keeps one dedupe table per outbox it reads from.
type DedupeTable struct {
	// Name is the table's name: one identifier, without a dot.
	Name string
	// ID is the primary key holding the record's id.
	ID string
	// SeenAt, when set, is stamped with the time the record was first seen, so old rows
	// can be pruned.
	SeenAt string
}

// Columns returns every column the description names, each with its role.
func (t DedupeTable) Columns() []NamedColumn {
	cols := []NamedColumn{{Role: "ID", Name: t.ID}}
	if t.SeenAt != "" {
		cols = append(cols, NamedColumn{Role: "SeenAt", Name: t.SeenAt})
	}
	return cols
}

// OutboxRecord is one outbox record as stored.
type OutboxRecord struct {
	ID      int64
	Topic   string
	Payload []byte
	// Headers is the raw headers column, a JSON object; nil when absent or NULL.
	Headers []byte
}

// OutboxState is what a record's row says of it; a zero time means not yet.
type OutboxState struct {
	// Exists is false when no row has the id.
	Exists      bool
	SentAt      time.Time
	ProcessedAt time.Time
}

// OutboxStore is one outbox table's prepared statements.
type OutboxStore interface {
	// Record inserts a record inside the caller's transaction and returns its id. The
	// transaction is a pgx.Tx on PostgreSQL and a *sql.Tx on MySQL and SQLite. The record
	// exists only if the caller commits.
	Record(ctx context.Context, tx any, r OutboxRecord) (int64, error)
	// Unsent returns up to limit records neither sent nor processed, in id order. It
	// always reads from the start: a transaction that took a lower id may commit after a
	// higher one, so a cursor could pass over it.
	Unsent(ctx context.Context, limit int) ([]OutboxRecord, error)
	// Unprocessed returns up to limit unprocessed records, sent or not, with an id above
	// after, in id order: the relay's start-up pass.
	Unprocessed(ctx context.Context, after int64, limit int) ([]OutboxRecord, error)
	// MarkSent stamps the record's sent_at with now.
	MarkSent(ctx context.Context, id int64, now time.Time) error
	// MarkProcessed stamps processed_at with now unless it is set already, and reports
	// whether it changed the row. It also stamps sent_at with now if it is not set: the
	// relay died between its send and its stamp.
	MarkProcessed(ctx context.Context, id int64, now time.Time) (bool, error)
	// State reads the record's sent_at and processed_at.
	State(ctx context.Context, id int64) (OutboxState, error)
	// Close releases what the store prepared.
	Close() error
}

// DedupeStore is one dedupe table's prepared insert.
type DedupeStore interface {
	// Once inserts id inside the caller's transaction unless a row holds it already, and
	// reports whether it inserted: true the first time, false for a record seen before.
	// It runs INSERT … ON CONFLICT DO NOTHING, or the database's equivalent. A concurrent
	// transaction inserting the same id makes it wait for that one's end.
	Once(ctx context.Context, tx any, id int64, now time.Time) (bool, error)
	// Close releases what the store prepared.
	Close() error
}
