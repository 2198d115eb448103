package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// DedupeTable describes a consumer's dedupe table: its primary key holds the ids of the
// outbox records whose effect happened. Ids are unique within one outbox table, so keep
// one dedupe table per outbox a consumer reads from.
//
//	seen := outbox.DedupeTable{Name: "order_events_seen", ID: "record_id", SeenAt: "seen_at"}
type DedupeTable = dialects.DedupeTable

// DedupeSchema renders the CREATE TABLE of a dedupe table in the dialect's column types.
func DedupeSchema(d dialects.Dialect, t DedupeTable) (string, error) {
	od, err := outboxDialect(d)
	if err != nil {
		return "", err
	}
	return od.DedupeSchema(t)
}

// Dedupe makes a consumer's effect happen once per outbox record, however often the
// record is delivered: Once, in the transaction that makes the effect, inserts the
// record's id, and reports false when it was there already.
type Dedupe struct {
	t     DedupeTable
	store dialects.DedupeStore
	now   func() time.Time
}

// NewDedupe checks the dedupe table on the consumer's database (d) and prepares its
// insert.
func NewDedupe(ctx context.Context, d dialects.Dialect, t DedupeTable) (*Dedupe, error) {
	od, err := outboxDialect(d)
	if err != nil {
		return nil, err
	}
	store, err := od.OpenDedupe(ctx, t)
	if err != nil {
		return nil, err
	}
	return &Dedupe{t: t, store: store, now: time.Now}, nil
}

// Once inserts the record id inside tx (pgx.Tx on PostgreSQL, *sql.Tx on MySQL and
// SQLite: the consumer's transaction, e.g. a transactional delivery's d.Tx()) and reports
// whether this is the first time: make the effect in the same transaction when it is, and
// skip it when it is not. The id then commits or rolls back with the effect. A
// transaction inserting the same id concurrently makes Once wait for that one's end, so
// two copies of a record in work at once still make one effect.
func (d *Dedupe) Once(ctx context.Context, tx any, id int64) (first bool, err error) {
	if tx == nil {
		return false, fmt.Errorf("rowactor/outbox: dedupe in %s needs the consumer's transaction: the id must commit with the effect", d.t.Name)
	}
	first, err = d.store.Once(ctx, tx, id, d.now())
	if err != nil {
		return false, fmt.Errorf("rowactor/outbox: dedupe record %d in %s: %w", id, d.t.Name, err)
	}
	return first, nil
}

// Close releases the dedupe table's statements.
func (d *Dedupe) Close() error { return d.store.Close() }
