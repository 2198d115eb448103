package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
	"github.com/rowactor/rowactor/dialects/sqlstmt"
)

var _ dialects.OutboxDialect = (*Dialect)(nil)

// OutboxSchema renders an outbox table. Its AUTO_INCREMENT id is never handed out twice
// by InnoDB on MySQL 8.0+ and MariaDB 10.6+, which keep the counter across restarts
// (consumers dedupe by id; OpenOutbox refuses a table that could reuse ids). MySQL has no partial indexes: the relay's poll (unsent records in id
// order) and its start-up pass (unprocessed ones) each seek an index led by their time
// column, whose NULLs are the records in flight.
func (d *Dialect) OutboxSchema(t dialects.OutboxTable) (string, error) {
	if err := tablecheck.CheckOutboxDescription(t); err != nil {
		return "", err
	}
	if err := checkOutboxNames(t.Name, "outbox.Table.", t.Columns()); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("CREATE TABLE IF NOT EXISTS " + quote(t.Name) + " (\n")
	b.WriteString("  " + quote(t.ID) + " BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,\n")
	b.WriteString("  " + quote(t.Topic) + " VARCHAR(191) NOT NULL,\n")
	b.WriteString("  " + quote(t.Payload) + " LONGBLOB NOT NULL,\n")
	if t.Headers != "" {
		b.WriteString("  " + quote(t.Headers) + " JSON NULL,\n")
	}
	b.WriteString("  " + quote(t.SentAt) + " DATETIME(6) NULL,\n")
	b.WriteString("  " + quote(t.ProcessedAt) + " DATETIME(6) NULL,\n")
	b.WriteString("  INDEX " + quote(indexNameFor(t.Name, "_unsent")) + " (" + quote(t.SentAt) + ", " + quote(t.ID) + "),\n")
	b.WriteString("  INDEX " + quote(indexNameFor(t.Name, "_unprocessed")) + " (" + quote(t.ProcessedAt) + ", " + quote(t.ID) + ")\n")
	b.WriteString(") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;\n")
	return b.String(), nil
}

// indexNameFor is table+suffix, or "rowactor"+suffix when that passes MySQL's limit (index
// names are per table, so a fixed name cannot collide).
func indexNameFor(table, suffix string) string {
	if name := table + suffix; utf8.RuneCountInString(name) <= maxIdentifier {
		return name
	}
	return "rowactor" + suffix
}

// DedupeSchema renders a dedupe table: the record id is the primary key.
func (d *Dialect) DedupeSchema(t dialects.DedupeTable) (string, error) {
	if err := tablecheck.CheckDedupeDescription(t); err != nil {
		return "", err
	}
	if err := checkOutboxNames(t.Name, "outbox.DedupeTable.", t.Columns()); err != nil {
		return "", err
	}
	s := "CREATE TABLE IF NOT EXISTS " + quote(t.Name) + " (\n  " + quote(t.ID) + " BIGINT NOT NULL PRIMARY KEY"
	if t.SeenAt != "" {
		s += ",\n  " + quote(t.SeenAt) + " DATETIME(6) NULL"
	}
	return s + "\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;\n", nil
}

// checkOutboxNames refuses identifiers MySQL would refuse for their length.
func checkOutboxNames(table, prefix string, cols []dialects.NamedColumn) error {
	if utf8.RuneCountInString(table) > maxIdentifier {
		return &dialects.ConfigError{Table: table, Option: prefix + "Name",
			Reason: fmt.Sprintf("MySQL names are at most %d characters", maxIdentifier), Fix: "rename the table"}
	}
	for _, c := range cols {
		if utf8.RuneCountInString(c.Name) > maxIdentifier {
			return &dialects.ConfigError{Table: table, Column: c.Name, Option: prefix + c.Role,
				Reason: fmt.Sprintf("MySQL names are at most %d characters", maxIdentifier), Fix: "rename the column"}
		}
	}
	return nil
}

// checkLive refuses a described table the live one cannot serve, after the server checks
// (version floor; DATETIME scanned into UTC time.Time).
func (d *Dialect) checkLive(ctx context.Context, table, prefix, schemaFunc string, cols []dialects.NamedColumn) error {
	if d.isClosed() {
		return fmt.Errorf("mysql: table %s: %w", table, errClosed)
	}
	if err := checkOutboxNames(table, prefix, cols); err != nil {
		return err
	}
	if err := d.checkServer(ctx, table); err != nil {
		return err
	}
	have, err := d.columnsOf(ctx, table)
	if err != nil {
		return err
	}
	// MySQL compares column names without case.
	return tablecheck.CheckNamedColumns(table, prefix, schemaFunc, cols, have, true)
}

// OpenOutbox checks the outbox table and prepares its statements.
func (d *Dialect) OpenOutbox(ctx context.Context, t dialects.OutboxTable) (dialects.OutboxStore, error) {
	if err := tablecheck.CheckOutboxDescription(t); err != nil {
		return nil, err
	}
	if err := d.checkLive(ctx, t.Name, "outbox.Table.", "outbox.Schema", t.Columns()); err != nil {
		return nil, err
	}
	if err := d.checkOutboxIDs(ctx, t); err != nil {
		return nil, err
	}
	q := sqlstmt.NewOutboxSQL(t, quote)
	s := &outboxStore{d: d, name: t.Name, hasHeaders: t.Headers != ""}
	s.record = q.Insert + ") VALUES (?, ?)"
	s.recordHeaders = s.record
	if t.Headers != "" {
		s.recordHeaders = q.Insert + ", " + quote(t.Headers) + ") VALUES (?, ?, ?)"
	}
	s.unsent, s.unprocessed, s.markSent, s.markProcessed, s.state = q.Unsent, q.Unprocessed, q.MarkSent, q.MarkProcessed, q.State
	if err := d.prepareAll(ctx, s.record, s.recordHeaders, s.unsent, s.unprocessed, s.markSent, s.markProcessed, s.state); err != nil {
		return nil, s.errorf("prepare", err)
	}
	return s, nil
}

type outboxStore struct {
	d          *Dialect
	name       string
	hasHeaders bool

	record, recordHeaders, unsent, unprocessed, markSent, markProcessed, state string
}

func (s *outboxStore) errorf(op string, err error) error {
	return fmt.Errorf("mysql: outbox %s on table %s: %w", op, s.name, err)
}

// Record inserts r in the caller's *sql.Tx and returns LAST_INSERT_ID. As text: the
// transaction may come from another pool, which the dialect's prepared statement cannot
// serve.
func (s *outboxStore) Record(ctx context.Context, tx any, r dialects.OutboxRecord) (int64, error) {
	x, ok := tx.(*sql.Tx)
	if !ok || x == nil {
		return 0, fmt.Errorf("mysql: outbox record on table %s needs a *sql.Tx, got %T", s.name, tx)
	}
	payload := r.Payload
	if payload == nil {
		payload = []byte{} // the driver binds a nil slice as NULL
	}
	text, args := s.record, []any{r.Topic, payload}
	if r.Headers != nil && s.hasHeaders {
		// As text: MySQL refuses to read JSON from a binary string.
		text, args = s.recordHeaders, append(args, string(r.Headers))
	}
	res, err := x.ExecContext(ctx, text, args...)
	if err != nil {
		return 0, s.errorf("record", err)
	}
	id, err := res.LastInsertId()
	if err != nil {
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
			headers []byte
		)
		dest := []any{&r.ID, &r.Topic, &r.Payload}
		if s.hasHeaders {
			dest = append(dest, &headers)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, s.errorf(op, err)
		}
		if len(headers) > 0 {
			r.Headers = headers
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf(op, err)
	}
	return out, nil
}

func (s *outboxStore) exec(ctx context.Context, op, text string, args ...any) (int64, error) {
	st, err := s.d.stmt(ctx, text)
	if err != nil {
		return 0, s.errorf(op, err)
	}
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
	_, err := s.exec(ctx, "mark sent", s.markSent, dbTime(now), id)
	return err
}

// MarkProcessed reports a change by the rows the UPDATE changed (the driver's default,
// without clientFoundRows); its condition on processed_at makes matched and changed agree.
func (s *outboxStore) MarkProcessed(ctx context.Context, id int64, now time.Time) (bool, error) {
	n, err := s.exec(ctx, "mark processed", s.markProcessed, dbTime(now), dbTime(now), id)
	return n > 0, err
}

func (s *outboxStore) State(ctx context.Context, id int64) (dialects.OutboxState, error) {
	var st dialects.OutboxState
	q, err := s.d.stmt(ctx, s.state)
	if err != nil {
		return st, s.errorf("read state", err)
	}
	var sent, processed sql.NullTime
	err = q.QueryRowContext(ctx, id).Scan(&sent, &processed)
	if errors.Is(err, sql.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, s.errorf("read state", err)
	}
	st.Exists = true
	if sent.Valid {
		st.SentAt = sent.Time
	}
	if processed.Valid {
		st.ProcessedAt = processed.Time
	}
	return st, nil
}

// Close is a no-op: the statements live in the dialect's cache, closed with the dialect.
func (s *outboxStore) Close() error { return nil }

// OpenDedupe checks the dedupe table and prepares its insert.
func (d *Dialect) OpenDedupe(ctx context.Context, t dialects.DedupeTable) (dialects.DedupeStore, error) {
	if err := tablecheck.CheckDedupeDescription(t); err != nil {
		return nil, err
	}
	if err := d.checkLive(ctx, t.Name, "outbox.DedupeTable.", "outbox.DedupeSchema", t.Columns()); err != nil {
		return nil, err
	}
	// INSERT IGNORE reports 0 rows for a duplicate key whatever the DSN's clientFoundRows
	// (ON DUPLICATE KEY UPDATE would report 1 under it). IGNORE also turns bad values into
	// warnings, but the values bound here (an id, a UTC time) are never bad for the
	// columns DedupeSchema renders.
	s := &sqlstmt.Dedupe{DB: "mysql", Table: t.Name, Stamp: t.SeenAt != "", Time: func(t time.Time) any { return dbTime(t) }}
	if s.Stamp {
		s.Insert = "INSERT IGNORE INTO " + quote(t.Name) + " (" + quote(t.ID) + ", " + quote(t.SeenAt) + ") VALUES (?, ?)"
	} else {
		s.Insert = "INSERT IGNORE INTO " + quote(t.Name) + " (" + quote(t.ID) + ") VALUES (?)"
	}
	if err := d.prepareAll(ctx, s.Insert); err != nil {
		return nil, fmt.Errorf("mysql: dedupe on table %s: prepare: %w", t.Name, err)
	}
	return s, nil
}
