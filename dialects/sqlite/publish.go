package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
)

// Publisher checks t for publishing and builds its INSERT. Any form may be published to,
// including a description SQLite could not consume from.
func (d *Dialect) Publisher(ctx context.Context, t dialects.Table) (dialects.Publisher, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return nil, err
	}
	if err := d.checkUniqueIndex(ctx, t); err != nil {
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
		hasUnique:     t.UniqueKey != "",
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
	if t.UniqueKey != "" {
		cols, vals = append(cols, quote(t.UniqueKey)), append(vals, ":unique_key")
		p.lookup = "SELECT " + quote(t.ID) + " FROM " + quote(t.Name) + " WHERE " + quote(t.UniqueKey) + " = :unique_key"
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
	s += ")"
	if t.UniqueKey != "" {
		// A key a row holds already: no row, Publish looks it up. The target names the
		// key's column (see the PostgreSQL dialect): another unique index's conflict stays
		// an error, and a key without a unique index fails instead of taking duplicates.
		s += " ON CONFLICT (" + quote(t.UniqueKey) + ") DO NOTHING"
	}
	return s + " RETURNING " + quote(t.ID)
}

type publisher struct {
	d             *Dialect
	f             *file
	name          string
	hasGroup      bool
	hasRetryAfter bool
	hasPriority   bool
	hasUnique     bool
	lookup        string // :unique_key: the id of the row holding it
	insert        string
	insertHeaders string
}

// Publish inserts m. tx is nil for the dialect's pool, or a *sql.Tx of the same
// database: the row then exists only if the caller commits.
func (p *publisher) Publish(ctx context.Context, tx any, m dialects.Message) (int64, error) {
	if err := p.check(m); err != nil {
		return 0, err
	}
	text, args := p.statement(m)
	if x, ok := tx.(*sql.Tx); ok && x == nil {
		tx = nil
	}
	run, release, err := p.runner(ctx, tx)
	if err != nil {
		return 0, err
	}
	defer release()
	return p.insertOrFind(run, text, args, m.UniqueKey)
}

// check refuses a message that sets a field the table has no column for.
func (p *publisher) check(m dialects.Message) error {
	has := tablecheck.Columns{Group: p.hasGroup, UniqueKey: p.hasUnique, Priority: p.hasPriority, RetryAfter: p.hasRetryAfter}
	if err := tablecheck.MessageFits(m, has); err != nil {
		return p.errorf(err)
	}
	return nil
}

// statement returns the insert m needs and its named arguments.
func (p *publisher) statement(m dialects.Message) (string, []any) {
	payload := m.Payload
	if payload == nil {
		payload = []byte{} // the driver binds a nil slice as NULL
	}
	var notBefore any
	if !m.NotBefore.IsZero() {
		notBefore = formatTime(m.NotBefore)
	}
	args := []any{sql.Named("payload", payload), sql.Named("group", m.Group), sql.Named("not_before", notBefore),
		sql.Named("priority", m.Priority), sql.Named("unique_key", nullText(m.UniqueKey))}
	if m.Headers != nil && p.insertHeaders != p.insert {
		// As text, so SQLite's JSON functions read the object (a blob would be taken
		// for JSONB).
		return p.insertHeaders, append(args, sql.Named("headers", string(m.Headers)))
	}
	return p.insert, args
}

// runFunc runs a statement that returns one id (sql.ErrNoRows when none).
type runFunc func(text string, args ...any) (int64, error)

// runner returns how Publish runs its statements, and what to call when it is done.
// Through the pool (tx nil) they run in this process's writer turn, which release ends.
func (p *publisher) runner(ctx context.Context, tx any) (run runFunc, release func(), err error) {
	switch x := tx.(type) {
	case nil:
		if err := p.f.lockWriter(ctx); err != nil {
			return nil, nil, p.errorf(err)
		}
		run = func(text string, args ...any) (id int64, err error) {
			s, err := p.d.stmt(ctx, text)
			if err != nil {
				return 0, err
			}
			err = s.QueryRowContext(ctx, args...).Scan(&id)
			return id, err
		}
		return run, p.f.unlockWriter, nil
	case *sql.Tx:
		// Outside this process's writer turn: the caller's transaction holds SQLite's
		// write lock, or waits for it itself, and a writer of ours could be waiting on
		// that very transaction. As text, because the transaction may come from another
		// pool on the same file, which the dialect's prepared statement cannot serve.
		run = func(text string, args ...any) (id int64, err error) {
			err = x.QueryRowContext(ctx, text, args...).Scan(&id)
			return id, err
		}
		return run, func() {}, nil
	default:
		return nil, nil, fmt.Errorf("sqlite: PublishTx needs a *sql.Tx, got %T", tx)
	}
}

// insertOrFind runs the insert and returns the new row's id. When the unique key is held,
// the row holding it is the answer; a row deleted between the insert and the lookup frees
// the key, and the insert is tried again, three times at most.
func (p *publisher) insertOrFind(run runFunc, text string, args []any, key string) (int64, error) {
	for try := 0; ; try++ {
		id, err := run(text, args...)
		if err == nil {
			return id, nil
		}
		if !errors.Is(err, sql.ErrNoRows) || key == "" {
			return 0, p.errorf(err)
		}
		id, err = run(p.lookup, sql.Named("unique_key", key))
		if err == nil {
			return id, p.errorf(dialects.Duplicate(key, id))
		}
		if !errors.Is(err, sql.ErrNoRows) || try == 2 {
			return 0, p.errorf(fmt.Errorf("look up the row holding unique key %q: %w", key, err))
		}
	}
}

func (p *publisher) errorf(err error) error {
	return fmt.Errorf("sqlite: publish on table %s: %w", p.name, err)
}

// nullText binds "" as NULL.
func nullText(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// checkUniqueIndex refuses a unique key column that no unique index covers alone: ON
// CONFLICT (key) needs one.
func (d *Dialect) checkUniqueIndex(ctx context.Context, t dialects.Table) error {
	if t.UniqueKey == "" {
		return nil
	}
	var n int
	err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM pragma_index_list(?) AS il WHERE il."unique" = 1 AND il.partial = 0
		AND (SELECT count(*) FROM pragma_index_info(il.name)) = 1 AND (SELECT name FROM pragma_index_info(il.name)) = ?`,
		t.Name, t.UniqueKey).Scan(&n)
	if err != nil {
		return adminErr("read the unique key's index", t.Name, err)
	}
	if n == 0 {
		return tablecheck.NoUniqueIndex(t, "CREATE UNIQUE INDEX "+quote(t.Name+"_unique")+" ON "+quote(t.Name)+" ("+quote(t.UniqueKey)+")")
	}
	return nil
}
