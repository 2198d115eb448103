package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
)

// column is a live column: its name and its type, domains resolved to their base type,
// as format_type renders it ("bigint", "timestamp with time zone", ...).
type column struct {
	name string
	typ  string
}

// columnsQuery lists a table's columns. The table is resolved by to_regclass on its
// quoted name, exactly as the unqualified name in rowactor's statements resolves (the
// search_path, which starts with current_schema()); no rows when it does not exist.
const columnsQuery = `SELECT a.attname::text, format_type(COALESCE(NULLIF(ty.typbasetype, 0), a.atttypid), NULL)
FROM pg_attribute a JOIN pg_type ty ON ty.oid = a.atttypid
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`

func (d *Dialect) columnsOf(ctx context.Context, table string) ([]column, error) {
	rows, err := d.pool.Query(ctx, columnsQuery, quote(table))
	if err != nil {
		return nil, fmt.Errorf("postgres: read the columns of table %s: %w", table, err)
	}
	defer rows.Close()
	var cols []column
	for rows.Next() {
		var c column
		if err := rows.Scan(&c.name, &c.typ); err != nil {
			return nil, fmt.Errorf("postgres: read the columns of table %s: %w", table, err)
		}
		cols = append(cols, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres: read the columns of table %s: %w", table, err)
	}
	return cols, nil
}

func names(cols []column) []string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = c.name
	}
	return out
}

// checkNames refuses identifiers PostgreSQL would truncate.
func checkNames(t dialects.Table, deadLetterTable string) error {
	if len(t.Name) > maxIdent {
		return &dialects.ConfigError{Table: t.Name, Option: "Table.Name",
			Reason: fmt.Sprintf("the name is %d bytes; PostgreSQL truncates identifiers to %d", len(t.Name), maxIdent),
			Fix:    fmt.Sprintf("rename the table to at most %d bytes", maxIdent)}
	}
	for _, c := range t.Columns() {
		if len(c.Name) > maxIdent {
			return &dialects.ConfigError{Table: t.Name, Column: c.Name, Option: "Table." + c.Role,
				Reason: fmt.Sprintf("the column name is %d bytes; PostgreSQL truncates identifiers to %d", len(c.Name), maxIdent),
				Fix:    fmt.Sprintf("rename the column to at most %d bytes", maxIdent)}
		}
	}
	if len(t.CancelRequests) > maxIdent {
		return &dialects.ConfigError{Table: t.Name, Option: "Table.CancelRequests",
			Reason: fmt.Sprintf("the cancel-request table's name is %d bytes; PostgreSQL truncates identifiers to %d", len(t.CancelRequests), maxIdent),
			Fix:    fmt.Sprintf("rename the cancel-request table to at most %d bytes", maxIdent)}
	}
	if len(deadLetterTable) > maxIdent {
		return &dialects.ConfigError{Table: t.Name, Option: "DeadLetterTable",
			Reason: fmt.Sprintf("the dead-letter table's name is %d bytes; PostgreSQL truncates identifiers to %d", len(deadLetterTable), maxIdent),
			Fix:    fmt.Sprintf("rename the dead-letter table to at most %d bytes", maxIdent)}
	}
	return nil
}

// roleTypes are the column types each role may have. The time roles must be timestamptz:
// host times compared with a timestamp without time zone would depend on the session's
// TimeZone. Key placeholder columns may have any type.
var roleTypes = map[string][]string{
	"ID":          {"bigint", "integer", "smallint"},
	"Payload":     {"bytea", "text", "character varying", "json", "jsonb"},
	"Group":       {"text", "character varying"},
	"Attempt":     {"smallint", "integer", "bigint"},
	"RetryAfter":  {"timestamp with time zone"},
	"ProcessedAt": {"timestamp with time zone"},
	"LockedUntil": {"timestamp with time zone"},
	"DeadAt":      {"timestamp with time zone"},
	"Headers":     {"jsonb", "json", "text", "character varying"},
	"Error":       {"text", "character varying"},
	"Priority":    {"integer", "smallint", "bigint"},
	"UniqueKey":   {"text", "character varying"},
}

// checkColumns refuses a description the live table cannot serve: a missing table, a
// missing column (quoted names keep their case), a role column of a type rowactor cannot
// bind or read.
func checkColumns(t dialects.Table, have []column) error {
	if err := tablecheck.CheckColumns(t, names(have), false); err != nil {
		return err
	}
	for _, c := range t.Columns() {
		want := roleTypes[c.Role]
		if want == nil {
			continue
		}
		var typ string
		for _, h := range have {
			if h.name == c.Name {
				typ = h.typ
				break
			}
		}
		ok := false
		for _, w := range want {
			if typ == w {
				ok = true
				break
			}
		}
		if !ok {
			return &dialects.ConfigError{Table: t.Name, Column: c.Name, Option: "Table." + c.Role,
				Reason: fmt.Sprintf("the column is %s; the %s role needs %s", typ, c.Role, strings.Join(want, " or ")),
				Fix:    fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE %s (rowactor.Schema renders the recommended types)", quote(t.Name), quote(c.Name), want[0])}
		}
	}
	return nil
}

// checkTable runs the checks every use of a table shares (publishing included).
func (d *Dialect) checkTable(ctx context.Context, t dialects.Table) error {
	if err := dialects.CheckDescription(t); err != nil {
		return err
	}
	if err := checkNames(t, ""); err != nil {
		return err
	}
	have, err := d.columnsOf(ctx, t.Name)
	if err != nil {
		return err
	}
	return checkColumns(t, have)
}

// checkSpec refuses a subscription PostgreSQL cannot serve, before anything is claimed.
// It returns the columns a dead-letter move copies, when the dead letter is a table.
func (d *Dialect) checkSpec(ctx context.Context, spec dialects.QueueSpec) ([]adminsql.MoveColumn, error) {
	t := spec.Table
	if err := dialects.CheckDescription(t); err != nil {
		return nil, err
	}
	if err := tablecheck.CheckFIFO(t); err != nil {
		return nil, err
	}
	if err := checkNames(t, spec.DeadLetterTable); err != nil {
		return nil, err
	}
	if t.Isolation == dialects.ReadUncommitted {
		return nil, &dialects.ConfigError{Table: t.Name, Option: "Table.Isolation",
			Reason: "PostgreSQL runs read uncommitted as read committed, so it cannot open the level declared",
			Fix:    "declare ReadCommitted (or leave Isolation empty for the server's default)"}
	}
	if spec.Transactional && t.Form() == dialects.FormLease &&
		(t.Isolation == dialects.RepeatableRead || t.Isolation == dialects.Serializable) {
		return nil, &dialects.ConfigError{Table: t.Name, Option: "Table.Isolation",
			Reason: fmt.Sprintf("a transactional lease delivery's transaction at %s reads one snapshot, which would not see "+
				"the renewer's extended lease: a handler outliving half its lease would lose a lease it still holds, "+
				"and its writes would roll back", t.Isolation),
			Fix: "declare ReadCommitted or no isolation level for a transactional lease table, or drop Transactional"}
	}
	if spec.Transactional && t.Form() == dialects.FormLease && t.Isolation == "" {
		// Plain BEGIN opens at the session's default, which may be a snapshot level too,
		// set on the role or the database as well as in the server's configuration: read
		// on a pool connection, as the deliveries' connections will have it.
		if err := d.checkDefaultIsolation(ctx, t); err != nil {
			return nil, err
		}
	}
	if t.Mode != "" {
		return nil, &dialects.ConfigError{Table: t.Name, Option: "Table.Mode",
			Reason: fmt.Sprintf("Mode %q is how SQLite begins transactions; PostgreSQL has no such mode", t.Mode),
			Fix:    "drop Mode and declare Table.Isolation if a level is needed"}
	}
	if spec.DeadLetterGroup != "" && spec.DeadLetterTable != "" {
		return nil, &dialects.ConfigError{Table: t.Name, Option: "DeadLetterTable",
			Reason: "a dead letter is a group or a table, not both",
			Fix:    "keep DeadLetterGroup or DeadLetterTable"}
	}
	if spec.DeadLetterGroup != "" && t.Group == "" {
		return nil, &dialects.ConfigError{Table: t.Name, Option: "DeadLetterGroup",
			Reason: "a dead-letter group needs a group column, and the description names none",
			Fix:    "set Table.Group to the table's group column, or dead-letter to a table (DeadLetterTable)"}
	}
	have, err := d.columnsOf(ctx, t.Name)
	if err != nil {
		return nil, err
	}
	if err := checkColumns(t, have); err != nil {
		return nil, err
	}
	if spec.DeadLetterTable != "" {
		return d.deadLetterColumns(ctx, t, spec.DeadLetterTable, false)
	}
	return nil, nil
}

// checkDefaultIsolation refuses a transactional lease table declaring no level when a
// pool connection's default_transaction_isolation is repeatable read or serializable,
// naming where the default comes from (pg_settings.source) and how to undo it there.
func (d *Dialect) checkDefaultIsolation(ctx context.Context, t dialects.Table) error {
	var level, source, role, db string
	err := d.pool.QueryRow(ctx, "SELECT setting, source, session_user::text, current_database()::text FROM pg_settings"+
		" WHERE name = 'default_transaction_isolation'").Scan(&level, &source, &role, &db)
	if err != nil {
		return fmt.Errorf("postgres: read the default isolation level for table %s: %w", t.Name, err)
	}
	if level != string(dialects.RepeatableRead) && level != string(dialects.Serializable) {
		return nil
	}
	const setting = "default_transaction_isolation"
	var where, undo string
	switch source {
	case "user":
		where = fmt.Sprintf("set on the role %s", quote(role))
		undo = fmt.Sprintf("ALTER ROLE %s RESET %s", quote(role), setting)
	case "database user":
		where = fmt.Sprintf("set on the role %s in database %s", quote(role), quote(db))
		undo = fmt.Sprintf("ALTER ROLE %s IN DATABASE %s RESET %s", quote(role), quote(db), setting)
	case "database":
		where = fmt.Sprintf("set on the database %s", quote(db))
		undo = fmt.Sprintf("ALTER DATABASE %s RESET %s", quote(db), setting)
	case "client":
		where = "set by the connection's parameters"
		undo = "drop " + setting + " from the connection string (or the pool's RuntimeParams)"
	case "configuration file":
		where = "set in the server's configuration"
		undo = "set " + setting + " to 'read committed' in postgresql.conf (or ALTER SYSTEM RESET " + setting + ")"
	case "session":
		where = "set on each connection by a SET (the pool's connect hook)"
		undo = "stop setting " + setting + " when connections open"
	default:
		where = "whose source PostgreSQL reports as " + strconv.Quote(source)
		undo = "reset " + setting + " where it is set"
	}
	return &dialects.ConfigError{Table: t.Name, Option: "Table.Isolation",
		Reason: fmt.Sprintf("the connections' default isolation level (%s = %s, %s) applies to a transactional lease delivery "+
			"declaring no level; at %s its transaction reads one snapshot, which would not see the renewer's extended lease: "+
			"a handler outliving half its lease would lose a lease it still holds, and its writes would roll back",
			setting, level, where, level),
		Fix: "declare ReadCommitted on the table (Table.Isolation), or " + undo + ", or drop Transactional"}
}

// prepare parses and describes every statement on one connection (as the unnamed
// statement, outside pgx's statement cache), so a statement the live schema cannot run
// (a column of an incompatible type, a dead-letter table whose columns do not take the
// copy) fails when the subscription starts, not at its first settlement.
func (d *Dialect) prepare(ctx context.Context, table string, stmts []stmt) error {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: prepare on table %s: %w", table, err)
	}
	defer conn.Release()
	for _, s := range stmts {
		if s.text == "" {
			continue
		}
		if _, err := conn.Conn().PgConn().Prepare(ctx, "", s.text, nil); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) {
				return &dialects.ConfigError{Table: table,
					Reason: "a statement does not prepare against the live table (" + s.text + ")",
					Err:    err,
					Fix:    "give the table (and the dead-letter table) the column types rowactor.Schema renders"}
			}
			return fmt.Errorf("postgres: prepare on table %s: %w", table, err)
		}
	}
	return nil
}
