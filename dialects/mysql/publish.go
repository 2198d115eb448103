package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
)

// Publisher checks t for publishing and builds its INSERT. Any form may be published to.
func (d *Dialect) Publisher(ctx context.Context, t dialects.Table) (dialects.Publisher, error) {
	if d.isClosed() {
		return nil, fmt.Errorf("mysql: publish on table %s: %w", t.Name, errClosed)
	}
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
	cols := []string{quote(t.Payload)}
	if t.Group != "" {
		cols = append(cols, quote(t.Group))
	}
	if t.RetryAfter != "" {
		cols = append(cols, quote(t.RetryAfter))
	}
	if t.Priority != "" {
		cols = append(cols, quote(t.Priority))
	}
	if t.UniqueKey != "" {
		cols = append(cols, quote(t.UniqueKey))
	}
	if t.Priority != "" {
		var err error
		if p.prioMin, p.prioMax, p.prioType, err = d.priorityRange(ctx, t); err != nil {
			return nil, err
		}
	}
	if t.UniqueKey != "" {
		var err error
		if p.keyMax, p.keyBytes, p.keyType, err = d.uniqueKeyLength(ctx, t); err != nil {
			return nil, err
		}
	}
	p.insert = insertText(t, cols)
	if t.UniqueKey != "" {
		p.lookup = "SELECT " + quote(t.ID) + " FROM " + quote(t.Name) + " WHERE " + quote(t.UniqueKey) + " = ?"
		p.lookupLocked = p.lookup + " LOCK IN SHARE MODE"
	}
	p.insertHeaders = p.insert
	if t.Headers != "" {
		// A message without headers leaves the column to its default rather than
		// writing NULL into a column that may refuse it.
		p.insertHeaders = insertText(t, append(cols, quote(t.Headers)))
	}
	if err := d.prepareAll(ctx, p.insert, p.insertHeaders); err != nil {
		return nil, p.errorf(err)
	}
	// The server resets the connection on a packet over its max_allowed_packet (the
	// client sees "connection reset by peer" or a bare error 1153): read it once, and
	// refuse such messages before they are sent.
	if err := d.db.QueryRowContext(ctx, "SELECT @@max_allowed_packet").Scan(&p.maxPacket); err != nil {
		return nil, p.errorf(fmt.Errorf("read max_allowed_packet: %w", err))
	}
	return p, nil
}

// packetMargin is what a publish leaves in max_allowed_packet for the statement's own
// bytes beside the message's (the execute packet's header, types and lengths: a few dozen
// bytes).
const packetMargin = 1024

// insertText inserts one row. A unique key a row holds already fails it with
// ER_DUP_ENTRY (Publish then looks the row up): ON DUPLICATE KEY UPDATE would fire on any
// unique index of the table, and its update waits for the lock on the row that holds the
// key, which a row lock claim holds while its handler runs; the duplicate check of a plain
// insert reads the key's index only.
func insertText(t dialects.Table, cols []string) string {
	return "INSERT INTO " + quote(t.Name) + " (" + strings.Join(cols, ", ") + ") VALUES (" + placeholders(len(cols)) + ")"
}

type publisher struct {
	d             *Dialect
	name          string
	hasGroup      bool
	hasRetryAfter bool
	hasPriority   bool
	hasUnique     bool
	// prioMin and prioMax bound what the priority column holds (its COLUMN_TYPE is
	// prioType): a session without strict mode would store a value beyond them clamped.
	prioMin, prioMax int64
	prioType         string
	// keyMax is the longest unique key the column holds, in bytes when keyBytes, else in
	// characters (its COLUMN_TYPE is keyType); 0 when unbounded. A session without strict
	// mode would store a longer key cut, and two keys could then become one.
	keyMax        int64
	keyBytes      bool
	keyType       string
	insert        string
	insertHeaders string
	// lookup reads the id of the row holding a unique key, without locking (a consistent
	// read: it waits for no lock); lookupLocked reads the latest committed row, for a
	// caller's transaction, whose snapshot may predate it (holder).
	lookup, lookupLocked string
	maxPacket            int64 // the server's max_allowed_packet when the publisher was built
}

// Publish inserts m and returns its id (LAST_INSERT_ID). tx is nil for the dialect's pool,
// or a *sql.Tx on the same server: the row then exists only if the caller commits.
func (p *publisher) Publish(ctx context.Context, tx any, m dialects.Message) (int64, error) {
	if err := p.check(m); err != nil {
		return 0, err
	}
	if x, ok := tx.(*sql.Tx); ok && x == nil {
		tx = nil
	}
	text, args := p.statement(m)
	exec := p.execer(ctx, tx, text, args)
	res, err := p.insertNew(ctx, tx == nil, exec)
	if err != nil && m.UniqueKey != "" && isDuplicate(err) {
		var id int64
		var done bool
		id, done, res, err = p.keyHolder(ctx, tx, m.UniqueKey, exec, err)
		if done {
			return id, err
		}
	}
	if err != nil {
		return 0, p.errorf(err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, p.errorf(err)
	}
	return id, nil
}

// check refuses a message the table cannot hold, before anything is sent.
func (p *publisher) check(m dialects.Message) error {
	if err := p.checkColumns(m); err != nil {
		return err
	}
	if p.hasPriority {
		if err := tablecheck.CheckPriorityFits(m.Priority, p.prioMin, p.prioMax, p.prioType); err != nil {
			return p.errorf(err)
		}
	}
	if err := p.checkKeyLength(m.UniqueKey); err != nil {
		return err
	}
	return p.checkSize(m)
}

// checkColumns refuses a message that sets a field the table has no column for.
func (p *publisher) checkColumns(m dialects.Message) error {
	has := tablecheck.Columns{Group: p.hasGroup, UniqueKey: p.hasUnique, Priority: p.hasPriority, RetryAfter: p.hasRetryAfter}
	if err := tablecheck.MessageFits(m, has); err != nil {
		return p.errorf(err)
	}
	return nil
}

// checkKeyLength refuses a unique key longer than its column holds: a session without
// strict mode would store it cut.
func (p *publisher) checkKeyLength(key string) error {
	if key == "" || p.keyMax <= 0 {
		return nil
	}
	n := int64(utf8.RuneCountInString(key))
	unit := "characters"
	if p.keyBytes {
		n, unit = int64(len(key)), "bytes"
	}
	if n > p.keyMax {
		return p.errorf(fmt.Errorf("the unique key is %d %s and the unique key column (%s) holds %d; publish a shorter key "+
			"(a hash of a long one), or widen the column", n, unit, p.keyType, p.keyMax))
	}
	return nil
}

// statement returns the insert m needs and its arguments, in the columns' order.
func (p *publisher) statement(m dialects.Message) (string, []any) {
	payload := m.Payload
	if payload == nil {
		payload = []byte{} // the driver binds a nil slice as NULL
	}
	args := []any{payload}
	if p.hasGroup {
		args = append(args, m.Group)
	}
	if p.hasRetryAfter {
		var notBefore any
		if !m.NotBefore.IsZero() {
			notBefore = dbTime(m.NotBefore)
		}
		args = append(args, notBefore)
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
		// As text: MySQL refuses to read JSON from a binary string.
		return p.insertHeaders, append(args, string(m.Headers))
	}
	return p.insert, args
}

// execer returns the function that runs the insert once: through the dialect's prepared
// statement for the pool (tx nil), as text in a caller's *sql.Tx.
func (p *publisher) execer(ctx context.Context, tx any, text string, args []any) func() (sql.Result, error) {
	return func() (sql.Result, error) {
		switch x := tx.(type) {
		case nil:
			s, err := p.d.stmt(ctx, text)
			if err != nil {
				return nil, err
			}
			return s.ExecContext(ctx, args...)
		case *sql.Tx:
			// As text: the transaction may come from another pool, which the dialect's
			// prepared statement cannot serve.
			return x.ExecContext(ctx, text, args...)
		}
		return nil, fmt.Errorf("mysql: PublishTx on table %s needs a *sql.Tx, got %T", p.name, tx)
	}
}

// insertNew runs the insert, again when it failed on a duplicate of the primary key,
// which rowactor never sets: the id the server drew is taken. A Galera node draws ids
// with an offset it changes when nodes leave and join, and may draw one that a row from
// another node already has. InnoDB undid the statement alone; the next try draws a new
// id.
func (p *publisher) insertNew(ctx context.Context, pool bool, exec func() (sql.Result, error)) (sql.Result, error) {
	res, err := insert(ctx, pool, exec)
	for try := 0; err != nil && isDuplicatePrimary(err) && try < 3; try++ {
		res, err = insert(ctx, pool, exec)
	}
	return res, err
}

// keyHolder answers an insert that failed with dupErr, a duplicate of the unique key.
// When the key's row is found, or reading it failed, done is set and Publish returns id
// and err as they are. Otherwise res and err are those of the insert, which ran once
// more: a row gone between the two (acked, say) frees the key. Another unique index's
// conflict stays the error it is; InnoDB undoes the statement alone, and a caller's
// transaction goes on.
func (p *publisher) keyHolder(ctx context.Context, tx any, key string, exec func() (sql.Result, error), dupErr error) (id int64, done bool, res sql.Result, err error) {
	err = dupErr
	for try := 0; err != nil && isDuplicate(err) && try < 2; try++ {
		id, ok, lerr := p.holder(ctx, tx, key)
		switch {
		case lerr != nil:
			return 0, true, nil, p.errorf(fmt.Errorf("look up the row holding unique key %q: %w", key, lerr))
		case ok:
			return id, true, nil, p.errorf(dialects.Duplicate(key, id))
		case try == 0:
			res, err = insert(ctx, tx == nil, exec)
		}
	}
	return 0, false, res, err
}

// holder returns the id of the row holding key. Through the pool it is a consistent read,
// which waits for no lock, in a snapshot taken after the insert failed. In a caller's
// transaction it is a locking read, which reads the latest committed row: at REPEATABLE
// READ a consistent read answers from the transaction's snapshot, which may still show a
// row deleted since (the key's former holder) and not the row whose key failed the
// insert. LOCK IN SHARE MODE through the key's unique index, which holds the id, locks
// that index's entry alone, never the row (a row lock claim holds the row with FOR UPDATE
// while its handler runs, and FOR UPDATE would wait for it); the failed insert's
// duplicate check holds that entry's shared lock in the transaction already, so the read
// waits for nothing more.
func (p *publisher) holder(ctx context.Context, tx any, key string) (int64, bool, error) {
	var id int64
	var err error
	if x, ok := tx.(*sql.Tx); ok {
		err = x.QueryRowContext(ctx, p.lookupLocked, key).Scan(&id)
	} else {
		err = p.d.db.QueryRowContext(ctx, p.lookup, key).Scan(&id)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return id, err == nil, err
}

// insert runs exec, the insert. Through the pool (pool) it is a transaction of its own,
// so a deadlock (1213) undid it alone and it runs again: publishes of one key waiting for
// a transaction that inserted it and then rolled back take the freed key together, and
// InnoDB ends all but one of them with a deadlock. In a caller's transaction the deadlock
// rolled the whole transaction back: the error is the caller's.
func insert(ctx context.Context, pool bool, exec func() (sql.Result, error)) (sql.Result, error) {
	if pool {
		return withRetryIf(ctx, isDeadlock, exec)
	}
	return exec()
}

// isDuplicatePrimary reports ER_DUP_ENTRY on the primary key ("for key 'PRIMARY'",
// MySQL 8: "for key 'table.PRIMARY'").
func isDuplicatePrimary(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1062 && strings.HasSuffix(me.Message, "PRIMARY'")
}

// isDuplicate reports ER_DUP_ENTRY.
func isDuplicate(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1062
}

// priorityRange reads the priority column's type from the catalog and returns the range
// of values it holds; a column of a type that is not an integer gets the whole int64
// range (the server then judges the value).
func (d *Dialect) priorityRange(ctx context.Context, t dialects.Table) (lo, hi int64, typ string, err error) {
	var dataType string
	err = d.db.QueryRowContext(ctx, "SELECT DATA_TYPE, COLUMN_TYPE FROM information_schema.COLUMNS "+
		"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?", t.Name, t.Priority).Scan(&dataType, &typ)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, "", fmt.Errorf("mysql: table %s has no priority column %s", t.Name, t.Priority)
	}
	if err != nil {
		return 0, 0, "", fmt.Errorf("mysql: read the priority column's type of table %s: %w", t.Name, err)
	}
	switch strings.ToLower(dataType) {
	case "tinyint", "smallint", "mediumint", "int", "integer", "bigint":
	default:
		return math.MinInt64, math.MaxInt64, typ, nil
	}
	unsigned := strings.Contains(strings.ToLower(typ), "unsigned")
	hi = integerMax(dataType, unsigned)
	if !unsigned {
		lo = -hi - 1
	}
	return lo, hi, typ, nil
}

// uniqueKeyLength reads the unique key column's type from the catalog and returns the
// longest key it holds, in bytes for a binary type and in characters otherwise.
func (d *Dialect) uniqueKeyLength(ctx context.Context, t dialects.Table) (max int64, inBytes bool, typ string, err error) {
	var dataType string
	var length sql.NullInt64
	err = d.db.QueryRowContext(ctx, "SELECT DATA_TYPE, COLUMN_TYPE, CHARACTER_MAXIMUM_LENGTH FROM information_schema.COLUMNS "+
		"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?", t.Name, t.UniqueKey).Scan(&dataType, &typ, &length)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, "", fmt.Errorf("mysql: table %s has no unique key column %s", t.Name, t.UniqueKey)
	}
	if err != nil {
		return 0, false, "", fmt.Errorf("mysql: read the unique key column's type of table %s: %w", t.Name, err)
	}
	switch strings.ToLower(dataType) {
	case "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob":
		inBytes = true
	}
	return length.Int64, inBytes, typ, nil
}

// checkSize refuses a message the server would refuse for its max_allowed_packet.
func (p *publisher) checkSize(m dialects.Message) error {
	headers := 0
	if p.insertHeaders != p.insert {
		headers = len(m.Headers)
	}
	size := int64(len(m.Payload) + headers)
	if p.maxPacket <= 0 || size+int64(len(m.Group))+packetMargin <= p.maxPacket {
		return nil
	}
	return p.errorf(fmt.Errorf("the message is %d bytes (payload %d, headers %d) and the server's "+
		"max_allowed_packet is %d bytes, less %d for the statement: the server would drop the connection; "+
		"raise max_allowed_packet on the server (SET GLOBAL max_allowed_packet, and in its configuration, "+
		"for new connections), or keep large payloads outside the queue and publish a reference",
		size, len(m.Payload), headers, p.maxPacket, packetMargin))
}

func (p *publisher) errorf(err error) error {
	return fmt.Errorf("mysql: publish on table %s: %w", p.name, err)
}

// checkUniqueIndex refuses a unique key column that no unique index covers alone: the
// publish finds a key's row by the duplicate-key error, which only such an index raises.
func (d *Dialect) checkUniqueIndex(ctx context.Context, t dialects.Table) error {
	if t.UniqueKey == "" {
		return nil
	}
	var n int
	err := d.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM (SELECT INDEX_NAME FROM information_schema.STATISTICS "+
		"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? GROUP BY INDEX_NAME "+
		"HAVING COUNT(*) = 1 AND MAX(NON_UNIQUE) = 0 AND MAX(COLUMN_NAME) = ? AND MAX(SUB_PART) IS NULL) AS u", t.Name, t.UniqueKey).Scan(&n)
	if err != nil {
		return adminErr("read the unique key's index", t.Name, err)
	}
	if n == 0 {
		return tablecheck.NoUniqueIndex(t, "ALTER TABLE "+quote(t.Name)+" ADD UNIQUE INDEX ("+quote(t.UniqueKey)+")")
	}
	return nil
}
