package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
	"github.com/rowactor/rowactor/dialects/sqlstmt"
)

var _ dialects.OutboxDialect = (*Dialect)(nil)

// OutboxSchema renders an outbox table: AUTOINCREMENT ids, so an id is never handed out
// twice even after the highest record is deleted (consumers dedupe by id); times as TEXT
// in TimeLayout; one partial index for the relay's poll (unsent records) and one for its
// start-up pass (unprocessed ones), each holding only the records still in flight.
func (d *Dialect) OutboxSchema(t dialects.OutboxTable) (string, error) {
	if err := tablecheck.CheckOutboxDescription(t); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("CREATE TABLE IF NOT EXISTS " + quote(t.Name) + " (\n")
	b.WriteString("  " + quote(t.ID) + " INTEGER PRIMARY KEY AUTOINCREMENT,\n")
	b.WriteString("  " + quote(t.Topic) + " TEXT NOT NULL,\n")
	b.WriteString("  " + quote(t.Payload) + " BLOB NOT NULL,\n")
	if t.Headers != "" {
		b.WriteString("  " + quote(t.Headers) + " TEXT,\n")
	}
	b.WriteString("  " + quote(t.SentAt) + " TEXT,\n")
	b.WriteString("  " + quote(t.ProcessedAt) + " TEXT\n);\n")
	b.WriteString("CREATE INDEX IF NOT EXISTS " + quote(t.Name+"_unsent") + " ON " + quote(t.Name) +
		" (" + quote(t.ID) + ") WHERE " + quote(t.SentAt) + " IS NULL;\n")
	b.WriteString("CREATE INDEX IF NOT EXISTS " + quote(t.Name+"_unprocessed") + " ON " + quote(t.Name) +
		" (" + quote(t.ID) + ") WHERE " + quote(t.ProcessedAt) + " IS NULL;\n")
	return b.String(), nil
}

// DedupeSchema renders a dedupe table: the record id is the primary key.
func (d *Dialect) DedupeSchema(t dialects.DedupeTable) (string, error) {
	if err := tablecheck.CheckDedupeDescription(t); err != nil {
		return "", err
	}
	s := "CREATE TABLE IF NOT EXISTS " + quote(t.Name) + " (\n  " + quote(t.ID) + " INTEGER NOT NULL PRIMARY KEY"
	if t.SeenAt != "" {
		s += ",\n  " + quote(t.SeenAt) + " TEXT"
	}
	return s + "\n);\n", nil
}

// OpenOutbox checks the outbox table and prepares its statements.
func (d *Dialect) OpenOutbox(ctx context.Context, t dialects.OutboxTable) (dialects.OutboxStore, error) {
	if err := tablecheck.CheckOutboxDescription(t); err != nil {
		return nil, err
	}
	have, err := d.columnsOf(ctx, t.Name)
	if err != nil {
		return nil, err
	}
	// SQLite folds ASCII case in names.
	if err := tablecheck.CheckNamedColumns(t.Name, "outbox.Table.", "outbox.Schema", t.Columns(), have, true); err != nil {
		return nil, err
	}
	if err := d.checkOutboxIDs(ctx, t); err != nil {
		return nil, err
	}
	f, err := d.fileEntry(ctx)
	if err != nil {
		return nil, err
	}
	q := sqlstmt.NewOutboxSQL(t, quote)
	s := &outboxStore{d: d, f: f, name: t.Name, hasHeaders: t.Headers != ""}
	s.record = q.Insert + ") VALUES (?, ?) RETURNING " + quote(t.ID)
	s.recordHeaders = s.record
	if t.Headers != "" {
		s.recordHeaders = q.Insert + ", " + quote(t.Headers) + ") VALUES (?, ?, ?) RETURNING " + quote(t.ID)
	}
	s.unsent, s.unprocessed, s.markSent, s.markProcessed, s.state = q.Unsent, q.Unprocessed, q.MarkSent, q.MarkProcessed, q.State
	if err := d.prepareAll(ctx, s.record, s.recordHeaders, s.unsent, s.unprocessed, s.markSent, s.markProcessed, s.state); err != nil {
		return nil, s.errorf("prepare", err)
	}
	return s, nil
}

type outboxStore struct {
	d          *Dialect
	f          *file
	name       string
	hasHeaders bool

	record, recordHeaders, unsent, unprocessed, markSent, markProcessed, state string
}

func (s *outboxStore) errorf(op string, err error) error {
	return fmt.Errorf("sqlite: outbox %s on table %s: %w", op, s.name, err)
}

// Record inserts r in the caller's *sql.Tx, outside this process's writer turn: the
// caller's transaction may hold SQLite's write lock already, and a writer of ours waiting
// on it would stall both. As text, because the transaction may come from another pool on
// the same file, which the dialect's prepared statement cannot serve.
func (s *outboxStore) Record(ctx context.Context, tx any, r dialects.OutboxRecord) (int64, error) {
	x, ok := tx.(*sql.Tx)
	if !ok || x == nil {
		return 0, fmt.Errorf("sqlite: outbox record on table %s needs a *sql.Tx, got %T", s.name, tx)
	}
	payload := r.Payload
	if payload == nil {
		payload = []byte{} // the driver binds a nil slice as NULL
	}
	text, args := s.record, []any{r.Topic, payload}
	if r.Headers != nil && s.hasHeaders {
		// As text, so SQLite's JSON functions read the object (a blob would be taken for JSONB).
		text, args = s.recordHeaders, append(args, string(r.Headers))
	}
	var id int64
	if err := x.QueryRowContext(ctx, text, args...).Scan(&id); err != nil {
		return 0, s.errorf("record", err)
	}
	return id, nil
}

func (s *outboxStore) Unsent(ctx context.Context, limit int) ([]dialects.OutboxRecord, error) {
	return s.read(ctx, "read unsent", s.unsent, limit)
}

func (s *outboxStore) Unprocessed(ctx context.Context, after int64, limit int) ([]dialects.OutboxRecord, error) {
	return s.read(ctx, "read unprocessed", s.unprocessed, after, limit)
}

func (s *outboxStore) read(ctx context.Context, op, text string, args ...any) ([]dialects.OutboxRecord, error) {
	st, err := s.d.stmt(ctx, text)
	if err != nil {
		return nil, s.errorf(op, err)
	}
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return nil, s.errorf(op, err)
	}
	defer rows.Close()
	var out []dialects.OutboxRecord
	for rows.Next() {
		var (
			r       dialects.OutboxRecord
			headers sql.NullString
		)
		dest := []any{&r.ID, &r.Topic, &r.Payload}
		if s.hasHeaders {
			dest = append(dest, &headers)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, s.errorf(op, err)
		}
		if headers.Valid && headers.String != "" {
			r.Headers = []byte(headers.String)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf(op, err)
	}
	return out, nil
}

// write runs an UPDATE on the pool in this process's writer turn, so the process's own
// writers queue here rather than spin in SQLite's busy handler.
func (s *outboxStore) write(ctx context.Context, op, text string, args ...any) (int64, error) {
	st, err := s.d.stmt(ctx, text)
	if err != nil {
		return 0, s.errorf(op, err)
	}
	if err := s.f.lockWriter(ctx); err != nil {
		return 0, s.errorf(op, err)
	}
	defer s.f.unlockWriter()
	res, err := st.ExecContext(ctx, args...)
	if err != nil {
		return 0, s.errorf(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, s.errorf(op, err)
	}
	return n, nil
}

func (s *outboxStore) MarkSent(ctx context.Context, id int64, now time.Time) error {
	_, err := s.write(ctx, "mark sent", s.markSent, formatTime(now), id)
	return err
}

func (s *outboxStore) MarkProcessed(ctx context.Context, id int64, now time.Time) (bool, error) {
	n, err := s.write(ctx, "mark processed", s.markProcessed, formatTime(now), formatTime(now), id)
	return n > 0, err
}

func (s *outboxStore) State(ctx context.Context, id int64) (dialects.OutboxState, error) {
	var st dialects.OutboxState
	q, err := s.d.stmt(ctx, s.state)
	if err != nil {
		return st, s.errorf("read state", err)
	}
	var sent, processed sql.NullString
	err = q.QueryRowContext(ctx, id).Scan(&sent, &processed)
	if errors.Is(err, sql.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, s.errorf("read state", err)
	}
	st.Exists = true
	if st.SentAt, err = parseTime(sent); err != nil {
		return st, s.errorf("read state", err)
	}
	if st.ProcessedAt, err = parseTime(processed); err != nil {
		return st, s.errorf("read state", err)
	}
	return st, nil
}

// parseTime reads a time column written in TimeLayout, or in RFC 3339 by other code; NULL
// reads as the zero time.
func parseTime(v sql.NullString) (time.Time, error) {
	if !v.Valid || v.String == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(TimeLayout, v.String); err == nil {
		return t, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v.String)
	if err != nil {
		return time.Time{}, fmt.Errorf("time %q is neither in TimeLayout nor RFC 3339", v.String)
	}
	return t.UTC(), nil
}

// Close is a no-op: the statements live in the dialect's cache, closed with the dialect.
func (s *outboxStore) Close() error { return nil }

// OpenDedupe checks the dedupe table and prepares its insert.
func (d *Dialect) OpenDedupe(ctx context.Context, t dialects.DedupeTable) (dialects.DedupeStore, error) {
	if err := tablecheck.CheckDedupeDescription(t); err != nil {
		return nil, err
	}
	have, err := d.columnsOf(ctx, t.Name)
	if err != nil {
		return nil, err
	}
	if err := tablecheck.CheckNamedColumns(t.Name, "outbox.DedupeTable.", "outbox.DedupeSchema", t.Columns(), have, true); err != nil {
		return nil, err
	}
	// ON CONFLICT DO NOTHING rather than INSERT OR IGNORE: OR IGNORE would also swallow a
	// NOT NULL or CHECK failure and report it as a record seen before.
	s := &sqlstmt.Dedupe{DB: "sqlite", Table: t.Name, Stamp: t.SeenAt != "", Time: func(t time.Time) any { return formatTime(t) }}
	if s.Stamp {
		s.Insert = "INSERT INTO " + quote(t.Name) + " (" + quote(t.ID) + ", " + quote(t.SeenAt) + ") VALUES (?, ?) ON CONFLICT DO NOTHING"
	} else {
		s.Insert = "INSERT INTO " + quote(t.Name) + " (" + quote(t.ID) + ") VALUES (?) ON CONFLICT DO NOTHING"
	}
	if err := d.prepareAll(ctx, s.Insert); err != nil {
		return nil, fmt.Errorf("sqlite: dedupe on table %s: prepare: %w", t.Name, err)
	}
	return s, nil
}
