package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/rowactor/rowactor/dialects"
)

// Publisher checks t for publishing and builds its INSERT. Any form may be published to,
// including a description SQLite could not consume from.
func (d *Dialect) Publisher(ctx context.Context, t dialects.Table) (dialects.Publisher, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return nil, err
	}
	f, err := d.fileEntry(ctx)
	if err != nil {
		return nil, err
	}
	p := &publisher{
		d:             d,
		f:             f,
		name:          t.Name,
		hasGroup:      t.Group != "",
		hasRetryAfter: t.RetryAfter != "",
		hasPriority:   t.Priority != "",
	}
	cols := []string{quote(t.Payload)}
	vals := []string{":payload"}
	if t.Group != "" {
		cols, vals = append(cols, quote(t.Group)), append(vals, ":group")
	}
	if t.RetryAfter != "" {
		cols, vals = append(cols, quote(t.RetryAfter)), append(vals, ":not_before")
	}
	if t.Priority != "" {
		cols, vals = append(cols, quote(t.Priority)), append(vals, ":priority")
	}
	p.insert = insertText(t, cols, vals)
	p.insertHeaders = p.insert
	if t.Headers != "" {
		// A message without headers leaves the column to its default rather than
		// writing NULL into a column that may refuse it.
		p.insertHeaders = insertText(t, append(cols, quote(t.Headers)), append(vals, ":headers"))
	}
	if err := d.prepareAll(ctx, p.insert, p.insertHeaders); err != nil {
		return nil, p.errorf(err)
	}
	return p, nil
}

func insertText(t dialects.Table, cols, vals []string) string {
	s := "INSERT INTO " + quote(t.Name) + " ("
	for i, c := range cols {
		if i > 0 {
			s += ", "
		}
		s += c
	}
	s += ") VALUES ("
	for i, v := range vals {
		if i > 0 {
			s += ", "
		}
		s += v
	}
	return s + ") RETURNING " + quote(t.ID)
}

type publisher struct {
	d             *Dialect
	f             *file
	name          string
	hasGroup      bool
	hasRetryAfter bool
	hasPriority   bool
	insert        string
	insertHeaders string
}

// Publish inserts m. tx is nil for the dialect's pool, or a *sql.Tx of the same
// database: the row then exists only if the caller commits.
func (p *publisher) Publish(ctx context.Context, tx any, m dialects.Message) (int64, error) {
	if m.Group != "" && !p.hasGroup {
		return 0, p.errorf(fmt.Errorf("the table has no group column for Message.Group %q", m.Group))
	}
	if m.Priority != 0 && !p.hasPriority {
		return 0, p.errorf(fmt.Errorf("Message.Priority %d needs a priority column, and the table has none", m.Priority))
	}
	if !m.NotBefore.IsZero() && !p.hasRetryAfter {
		return 0, p.errorf(errors.New("Message.NotBefore needs a retry_after column, and the table has none"))
	}
	payload := m.Payload
	if payload == nil {
		payload = []byte{} // the driver binds a nil slice as NULL
	}
	var notBefore any
	if !m.NotBefore.IsZero() {
		notBefore = formatTime(m.NotBefore)
	}
	text := p.insert
	args := []any{sql.Named("payload", payload), sql.Named("group", m.Group), sql.Named("not_before", notBefore),
		sql.Named("priority", m.Priority)}
	if m.Headers != nil && p.insertHeaders != p.insert {
		text = p.insertHeaders
		// As text, so SQLite's JSON functions read the object (a blob would be taken
		// for JSONB).
		args = append(args, sql.Named("headers", string(m.Headers)))
	}
	if x, ok := tx.(*sql.Tx); ok && x == nil {
		tx = nil
	}
	var id int64
	switch x := tx.(type) {
	case nil:
		s, err := p.d.stmt(ctx, text)
		if err != nil {
			return 0, p.errorf(err)
		}
		if err := p.f.lockWriter(ctx); err != nil {
			return 0, p.errorf(err)
		}
		defer p.f.unlockWriter()
		if err := s.QueryRowContext(ctx, args...).Scan(&id); err != nil {
			return 0, p.errorf(err)
		}
	case *sql.Tx:
		// Outside this process's writer turn: the caller's transaction holds SQLite's
		// write lock, or waits for it itself, and a writer of ours could be waiting on
		// that very transaction. As text, because the transaction may come from another
		// pool on the same file, which the dialect's prepared statement cannot serve.
		if err := x.QueryRowContext(ctx, text, args...).Scan(&id); err != nil {
			return 0, p.errorf(err)
		}
	default:
		return 0, fmt.Errorf("sqlite: PublishTx needs a *sql.Tx, got %T", tx)
	}
	return id, nil
}

func (p *publisher) errorf(err error) error {
	return fmt.Errorf("sqlite: publish on table %s: %w", p.name, err)
}
