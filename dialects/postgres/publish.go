package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
)

// Publisher checks t for publishing and builds its INSERT once. Any form may be published
// to. The insert and the notification are one statement, so a publish in a caller's
// transaction notifies when that transaction commits, and never when it rolls back.
func (d *Dialect) Publisher(ctx context.Context, t dialects.Table) (dialects.Publisher, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return nil, err
	}
	if err := d.checkUniqueIndex(ctx, t); err != nil {
		return nil, err
	}
	p := &publisher{
		d:             d,
		name:          t.Name,
		hasGroup:      t.Group != "",
		hasRetryAfter: t.RetryAfter != "",
		hasPriority:   t.Priority != "",
		hasUnique:     t.UniqueKey != "",
	}
	// $1 payload, $2 the notification's payload, then group, not_before, headers when
	// present.
	cols := []string{quote(t.Payload)}
	n := 2
	next := func() string { n++; return "$" + strconv.Itoa(n) }
	vals := []string{"$1"}
	if t.Group != "" {
		cols, vals = append(cols, quote(t.Group)), append(vals, next())
	}
	if t.RetryAfter != "" {
		cols, vals = append(cols, quote(t.RetryAfter)), append(vals, next())
	}
	if t.Priority != "" {
		cols, vals = append(cols, quote(t.Priority)), append(vals, next())
	}
	if t.Priority != "" {
		have, err := d.columnsOf(ctx, t.Name)
		if err != nil {
			return nil, err
		}
		for _, c := range have {
			if c.name == t.Priority {
				p.prioType = c.typ
				p.prioMin, p.prioMax = intRange(c.typ)
			}
		}
	}
	if t.UniqueKey != "" {
		cols, vals = append(cols, quote(t.UniqueKey)), append(vals, next())
		p.lookup = "SELECT " + quote(t.ID) + " FROM " + quote(t.Name) + " WHERE " + quote(t.UniqueKey) + " = $1"
	}
	p.insert = insertText(t, cols, vals)
	p.insertHeaders = p.insert
	if t.Headers != "" {
		// A message without headers leaves the column to its default rather than
		// writing NULL into a column that may refuse it.
		p.insertHeaders = insertText(t, append(cols, quote(t.Headers)), append(vals, next()))
	}
	if err := d.prepare(ctx, t.Name, []stmt{{text: p.insert}, {text: p.insertHeaders}, {text: p.lookup}}); err != nil {
		return nil, err
	}
	return p, nil
}

// insertText inserts one row and notifies Channel with $2, "<table>\t<group>", in the same
// statement. The payload is bound, never rendered: its text cannot depend on the session's
// settings.
func insertText(t dialects.Table, cols, vals []string) string {
	conflict := ""
	if t.UniqueKey != "" {
		// A key a row holds already: nothing is inserted, nor notified (Publish looks the
		// row up). The target names the key's column, so a conflict on another unique
		// index of the table is the error it is, never a silent "held already"; and a
		// table without a unique index on the key fails here instead of taking
		// duplicates.
		conflict = " ON CONFLICT (" + quote(t.UniqueKey) + ") DO NOTHING"
	}
	return "WITH ins AS (INSERT INTO " + quote(t.Name) + " (" + strings.Join(cols, ", ") + ") VALUES (" +
		strings.Join(vals, ", ") + ")" + conflict + " RETURNING " + quote(t.ID) + " AS id) SELECT id, pg_notify(" +
		literal(Channel) + ", $2::text)::text FROM ins"
}

type publisher struct {
	d             *Dialect
	name          string
	hasGroup      bool
	hasRetryAfter bool
	hasPriority   bool
	// prioMin and prioMax bound what the priority column (of type prioType) holds.
	prioMin, prioMax int64
	prioType         string
	hasUnique        bool
	lookup           string // $1 the unique key: the id of the row holding it
	insert           string
	insertHeaders    string
}

// Publish inserts m. tx is nil for the dialect's pool, or the caller's transaction on the
// same database: a pgx.Tx (from any pool or connection), or a *sql.Tx (from SQLDB or
// any database/sql handle on pgx's stdlib driver). The row then exists, and the
// notification is sent, only if the caller commits.
func (p *publisher) Publish(ctx context.Context, tx any, m dialects.Message) (int64, error) {
	if err := p.check(m); err != nil {
		return 0, err
	}
	text, args := p.statement(m)
	var q firstID
	switch x := tx.(type) {
	case nil:
		q = pgxFirstID(p.d.pool)
	case pgx.Tx:
		q = pgxFirstID(x)
	case *sql.Tx:
		q = sqlFirstID(x)
	default:
		return 0, fmt.Errorf("postgres: PublishTx needs a *sql.Tx or a pgx.Tx, got %T", tx)
	}
	return p.insertOrFind(ctx, q, text, args, m.UniqueKey)
}

// firstID runs a statement and reads its first row's first column as an id; found is
// false when it returned no row. The columns after the first are read and dropped.
type firstID func(ctx context.Context, text string, args []any) (id int64, found bool, err error)

// pgxFirstID is firstID on a pgx pool or transaction.
func pgxFirstID(db querier) firstID {
	return func(ctx context.Context, text string, args []any) (int64, bool, error) {
		rows, err := db.Query(ctx, text, args...)
		if err != nil {
			return 0, false, err
		}
		defer rows.Close()
		if !rows.Next() {
			return 0, false, rows.Err()
		}
		var id int64
		dst := make([]any, len(rows.FieldDescriptions())) // pgx skips a nil destination
		dst[0] = &id
		if err := rows.Scan(dst...); err != nil {
			return 0, false, err
		}
		rows.Close()
		return id, true, rows.Err()
	}
}

// sqlFirstID is firstID on a database/sql transaction.
func sqlFirstID(tx *sql.Tx) firstID {
	return func(ctx context.Context, text string, args []any) (int64, bool, error) {
		rows, err := tx.QueryContext(ctx, text, args...)
		if err != nil {
			return 0, false, err
		}
		defer rows.Close()
		if !rows.Next() {
			return 0, false, rows.Err()
		}
		cols, err := rows.Columns()
		if err != nil {
			return 0, false, err
		}
		var id int64
		dst := make([]any, len(cols))
		dst[0] = &id
		for i := 1; i < len(dst); i++ {
			dst[i] = new(any)
		}
		if err := rows.Scan(dst...); err != nil {
			return 0, false, err
		}
		return id, true, rows.Close()
	}
}

// check refuses a message the table cannot hold, before anything is sent.
func (p *publisher) check(m dialects.Message) error {
	has := tablecheck.Columns{Group: p.hasGroup, UniqueKey: p.hasUnique, Priority: p.hasPriority, RetryAfter: p.hasRetryAfter}
	if err := tablecheck.MessageFits(m, has); err != nil {
		return p.errorf(err)
	}
	if p.hasPriority {
		if err := tablecheck.CheckPriorityFits(m.Priority, p.prioMin, p.prioMax, p.prioType); err != nil {
			return p.errorf(err)
		}
	}
	return nil
}

// statement returns the insert m needs and its arguments, in the columns' order; the
// second is the notification's payload, the table and the group.
func (p *publisher) statement(m dialects.Message) (string, []any) {
	payload := m.Payload
	if payload == nil {
		payload = []byte{} // pgx binds a nil slice as NULL
	}
	args := []any{payload, p.name + "\t" + m.Group}
	if p.hasGroup {
		args = append(args, m.Group)
	}
	if p.hasRetryAfter {
		if m.NotBefore.IsZero() {
			args = append(args, nil)
		} else {
			args = append(args, m.NotBefore)
		}
	}
	if p.hasPriority {
		args = append(args, m.Priority)
	}
	if p.hasUnique {
		var key any
		if m.UniqueKey != "" {
			key = m.UniqueKey
		}
		args = append(args, key)
	}
	if m.Headers != nil && p.insertHeaders != p.insert {
		// As text: jsonb and json parse it, a text column keeps it.
		return p.insertHeaders, append(args, string(m.Headers))
	}
	return p.insert, args
}

// insertOrFind runs the insert and returns the new row's id. When the unique key is held,
// the row holding it is the answer; a row deleted between the insert and the lookup frees
// the key, and the insert is tried again, three times at most.
func (p *publisher) insertOrFind(ctx context.Context, q firstID, text string, args []any, key string) (int64, error) {
	for try := 0; ; try++ {
		id, inserted, err := q(ctx, text, args)
		if err != nil {
			return 0, p.errorf(err)
		}
		if inserted {
			return id, nil
		}
		if !p.hasUnique || key == "" {
			return 0, p.errorf(errors.New("the insert returned no id"))
		}
		id, found, err := q(ctx, p.lookup, []any{key})
		if err == nil && found {
			return id, p.errorf(dialects.Duplicate(key, id))
		}
		if err != nil || try == 2 {
			if err == nil {
				err = errors.New("no row holds it, three times over")
			}
			return 0, p.errorf(fmt.Errorf("look up the row holding unique key %q: %w", key, err))
		}
	}
}

func (p *publisher) errorf(err error) error {
	return fmt.Errorf("postgres: publish on table %s: %w", p.name, err)
}

// intRange is the range of an integer column type (checkColumns admits only these for a
// priority).
func intRange(typ string) (lo, hi int64) {
	switch typ {
	case "smallint":
		return math.MinInt16, math.MaxInt16
	case "integer":
		return math.MinInt32, math.MaxInt32
	}
	return math.MinInt64, math.MaxInt64
}

// checkUniqueIndex refuses a unique key column that no unique index covers alone: ON
// CONFLICT (key) needs one.
func (d *Dialect) checkUniqueIndex(ctx context.Context, t dialects.Table) error {
	if t.UniqueKey == "" {
		return nil
	}
	var ok bool
	err := d.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = $1::regclass AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = $2)`,
		quote(t.Name), t.UniqueKey).Scan(&ok)
	if err != nil {
		return adminErr("read the unique key's index", t.Name, err)
	}
	if !ok {
		return tablecheck.NoUniqueIndex(t, "CREATE UNIQUE INDEX ON "+quote(t.Name)+" ("+quote(t.UniqueKey)+")")
	}
	return nil
}
