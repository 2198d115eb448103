package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// A transactional delivery's transaction is a pgx.Tx on a pool connection rowactor owns:
// it claims, settles and ends on it, and may sever it from another goroutine. Handlers
// also get it as a *sql.Tx, so one handler reads the same on every database. No
// *sql.Tx can wrap a pgx.Tx, so the lent *sql.Tx runs on a database/sql handle of its
// own whose one "connection" is the lent pgx.Tx:
//
//   - its statements run through the pgx.Tx, on the same session and in the same
//     transaction;
//   - its Commit and Rollback run nothing and return errLentEnd: the settlement ends the
//     transaction, never the handler;
//   - a statement finding the session outside a transaction (a COMMIT or ROLLBACK run
//     through it) is refused, so nothing autocommits;
//   - the lending's end (the handler returned) waits for its statements in flight and
//     closes its rows left open, before the settlement uses the session; later
//     statements through it fail with sql.ErrTxDone.
//
// Values are read as pgx's stdlib driver reads them: int64, float64, bool, []byte,
// string and time.Time.

// errLentEnd is a handler's Commit or Rollback of the *sql.Tx it was lent.
var errLentEnd = errors.New("postgres: the delivery's transaction is ended by its settlement, not by the handler (return an outcome instead)")

// lentKey carries the pgx.Tx to lend from SQLTx to lentConnector.Connect.
type lentKey struct{}

// lentSQL opens, once per Dialect, the database/sql handle that lends transactions. It
// keeps no idle connection: each lent *sql.Tx opens one of its own, over its pgx.Tx,
// and closing it closes nothing of the session.
type lentSQL struct {
	once sync.Once
	db   *sql.DB
}

func (l *lentSQL) handle() *sql.DB {
	l.once.Do(func() {
		l.db = sql.OpenDB(lentConnector{})
		l.db.SetMaxIdleConns(0)
	})
	return l.db
}

// close closes the handle if it was opened (its connection opener goroutine with it).
func (l *lentSQL) close() {
	l.once.Do(func() {}) // a handle never opened stays unopened
	if l.db != nil {
		_ = l.db.Close()
	}
}

// lend returns tx as a *sql.Tx until end is called. end ends the *sql.Tx as database/sql
// ends a transaction, running nothing on the session: it waits for the statements in
// flight through it and closes the rows left open, so that the settlement which follows
// has the session to itself, and later statements through it fail with sql.ErrTxDone.
// After Close the *sql.Tx returned is done from the start.
func (d *Dialect) lend(tx pgx.Tx) (stx *sql.Tx, end func()) {
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), lentKey{}, tx))
	db := d.lent.handle()
	if db == nil {
		cancel()
		return doneSQLTx(tx), func() {}
	}
	stx, err := db.BeginTx(ctx, nil)
	if err != nil { // the handle was closed just now
		cancel()
		return doneSQLTx(tx), func() {}
	}
	return stx, func() {
		// Rollback, not cancel first: database/sql's own goroutine would then end the
		// *sql.Tx, and this would not wait for it.
		_ = stx.Rollback() // errLentEnd: lentTx refuses it, having run nothing
		cancel()
	}
}

// doneSQLTx is a *sql.Tx over tx already ended, for a lending asked for after Close.
func doneSQLTx(tx pgx.Tx) *sql.Tx {
	db := sql.OpenDB(lentConnector{})
	defer db.Close()
	stx, err := db.BeginTx(context.WithValue(context.Background(), lentKey{}, tx), nil)
	if err != nil {
		return nil // lentConnector and lentConn.BeginTx fail on nothing
	}
	_ = stx.Rollback()
	return stx
}

// lentConnector opens the lent pgx.Tx that its context carries as a connection.
type lentConnector struct{}

func (lentConnector) Connect(ctx context.Context) (driver.Conn, error) {
	tx, ok := ctx.Value(lentKey{}).(pgx.Tx)
	if !ok {
		return nil, errors.New("postgres: a lent transaction's handle opens only through SQLTx")
	}
	return &lentConn{tx: tx}, nil
}

func (lentConnector) Driver() driver.Driver { return lentDriver{} }

type lentDriver struct{}

func (lentDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("postgres: a lent transaction's handle opens only through SQLTx")
}

// lentConn is a lent pgx.Tx seen as a database/sql connection.
type lentConn struct {
	tx pgx.Tx
}

var (
	_ driver.Conn               = (*lentConn)(nil)
	_ driver.ConnBeginTx        = (*lentConn)(nil)
	_ driver.ExecerContext      = (*lentConn)(nil)
	_ driver.QueryerContext     = (*lentConn)(nil)
	_ driver.ConnPrepareContext = (*lentConn)(nil)
	_ driver.NamedValueChecker  = (*lentConn)(nil)
)

func (c *lentConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext prepares nothing on the server: pgx caches each statement it runs.
func (c *lentConn) PrepareContext(_ context.Context, query string) (driver.Stmt, error) {
	return &lentStmt{c: c, query: query}, nil
}

// Close closes nothing: the session is rowactor's.
func (c *lentConn) Close() error { return nil }

func (c *lentConn) Begin() (driver.Tx, error) {
	return nil, errors.New("postgres: a lent transaction begins only through SQLTx")
}

// BeginTx runs nothing: the transaction is open already.
func (c *lentConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	return lentTx{}, nil
}

// CheckNamedValue passes every argument to pgx as it is, as pgx's stdlib driver does.
func (c *lentConn) CheckNamedValue(*driver.NamedValue) error { return nil }

// inTx refuses a statement once the session is outside a transaction: the handler ran
// COMMIT or ROLLBACK through it, and the statement would autocommit.
func (c *lentConn) inTx() error {
	if c.tx.Conn().PgConn().TxStatus() == 'I' {
		return errNotInTx
	}
	return nil
}

func (c *lentConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if err := c.inTx(); err != nil {
		return nil, err
	}
	tag, err := c.tx.Exec(ctx, query, values(args)...)
	if err != nil {
		return nil, err
	}
	return driver.RowsAffected(tag.RowsAffected()), nil
}

func (c *lentConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := c.inTx(); err != nil {
		return nil, err
	}
	vals := make([]any, 0, 1+len(args))
	vals = append(vals, binaryResults)
	for _, a := range args {
		vals = append(vals, a.Value)
	}
	rows, err := c.tx.Query(ctx, query, vals...)
	if err != nil {
		return nil, err
	}
	return newLentRows(rows, c.tx.Conn().TypeMap()), nil
}

func values(args []driver.NamedValue) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = a.Value
	}
	return out
}

// lentTx is the database/sql side of a lent transaction: ending it runs nothing, and
// says so. (The lending's end rolls it back too, and drops the error.)
type lentTx struct{}

func (lentTx) Commit() error   { return errLentEnd }
func (lentTx) Rollback() error { return errLentEnd }

type lentStmt struct {
	c     *lentConn
	query string
}

func (s *lentStmt) Close() error  { return nil }
func (s *lentStmt) NumInput() int { return -1 }

func (s *lentStmt) Exec([]driver.Value) (driver.Result, error) {
	return nil, errors.New("postgres: use ExecContext")
}

func (s *lentStmt) Query([]driver.Value) (driver.Rows, error) {
	return nil, errors.New("postgres: use QueryContext")
}

func (s *lentStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.c.ExecContext(ctx, s.query, args)
}

func (s *lentStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.c.QueryContext(ctx, s.query, args)
}

// binaryResults asks for the types reader decodes from their binary form in binary;
// every other type comes as text, and is read as a string.
var binaryResults = pgx.QueryResultFormatsByOID{
	pgtype.BoolOID: pgx.BinaryFormatCode, pgtype.ByteaOID: pgx.BinaryFormatCode,
	pgtype.Int2OID: pgx.BinaryFormatCode, pgtype.Int4OID: pgx.BinaryFormatCode, pgtype.Int8OID: pgx.BinaryFormatCode,
	pgtype.OIDOID: pgx.BinaryFormatCode, pgtype.XIDOID: pgx.BinaryFormatCode, pgtype.CIDOID: pgx.BinaryFormatCode,
	pgtype.Float4OID: pgx.BinaryFormatCode, pgtype.Float8OID: pgx.BinaryFormatCode,
	pgtype.DateOID: pgx.BinaryFormatCode, pgtype.TimestampOID: pgx.BinaryFormatCode, pgtype.TimestamptzOID: pgx.BinaryFormatCode,
}

// lentRows reads a pgx result as database/sql values, one decoder per column.
type lentRows struct {
	rows  pgx.Rows
	m     *pgtype.Map
	fds   []pgconn.FieldDescription
	names []string
	read  []func(src []byte) (driver.Value, error)
}

func newLentRows(rows pgx.Rows, m *pgtype.Map) *lentRows {
	fds := rows.FieldDescriptions()
	r := &lentRows{rows: rows, m: m, fds: fds, names: make([]string, len(fds)), read: make([]func([]byte) (driver.Value, error), len(fds))}
	for i, fd := range fds {
		r.names[i] = fd.Name
		r.read[i] = reader(m, fd)
	}
	return r
}

func (r *lentRows) Columns() []string { return r.names }

// ColumnTypeDatabaseTypeName is the type's name in upper case, or its OID when pgx does
// not know it.
func (r *lentRows) ColumnTypeDatabaseTypeName(i int) string {
	if t, ok := r.m.TypeForOID(r.fds[i].DataTypeOID); ok {
		return strings.ToUpper(t.Name)
	}
	return strconv.FormatUint(uint64(r.fds[i].DataTypeOID), 10)
}

// ColumnTypeScanType is the type of the values Next reads in the column.
func (r *lentRows) ColumnTypeScanType(i int) reflect.Type {
	switch r.fds[i].DataTypeOID {
	case pgtype.BoolOID:
		return reflect.TypeFor[bool]()
	case pgtype.ByteaOID, pgtype.JSONOID, pgtype.JSONBOID, pgtype.XMLOID:
		return reflect.TypeFor[[]byte]()
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID, pgtype.OIDOID, pgtype.XIDOID, pgtype.CIDOID:
		return reflect.TypeFor[int64]()
	case pgtype.Float4OID, pgtype.Float8OID:
		return reflect.TypeFor[float64]()
	case pgtype.DateOID, pgtype.TimestampOID, pgtype.TimestamptzOID:
		return reflect.TypeFor[time.Time]()
	}
	return reflect.TypeFor[string]()
}

func (r *lentRows) Close() error {
	r.rows.Close()
	return r.rows.Err()
}

func (r *lentRows) Next(dest []driver.Value) error {
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return io.EOF
	}
	for i, src := range r.rows.RawValues() {
		if src == nil {
			dest[i] = nil
			continue
		}
		v, err := r.read[i](src)
		if err != nil {
			return err
		}
		dest[i] = v
	}
	return nil
}

// reader decodes a column's non-NULL value into the type database/sql expects of it.
func reader(m *pgtype.Map, fd pgconn.FieldDescription) func([]byte) (driver.Value, error) {
	switch fd.DataTypeOID {
	case pgtype.BoolOID:
		return scanAs[bool](m, fd)
	case pgtype.ByteaOID, pgtype.JSONOID, pgtype.JSONBOID, pgtype.XMLOID:
		return scanAs[[]byte](m, fd)
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID:
		return scanAs[int64](m, fd)
	case pgtype.OIDOID, pgtype.XIDOID, pgtype.CIDOID:
		read := scanAs[uint32](m, fd)
		return func(src []byte) (driver.Value, error) {
			v, err := read(src)
			if err != nil {
				return nil, err
			}
			return int64(v.(uint32)), nil
		}
	case pgtype.Float4OID, pgtype.Float8OID:
		return scanAs[float64](m, fd)
	case pgtype.DateOID:
		return valueOf[pgtype.Date](m, fd)
	case pgtype.TimestampOID:
		return valueOf[pgtype.Timestamp](m, fd)
	case pgtype.TimestamptzOID:
		return valueOf[pgtype.Timestamptz](m, fd)
	}
	return scanAs[string](m, fd)
}

// scanAs decodes into a T.
func scanAs[T any](m *pgtype.Map, fd pgconn.FieldDescription) func([]byte) (driver.Value, error) {
	return func(src []byte) (driver.Value, error) {
		var v T
		err := m.Scan(fd.DataTypeOID, fd.Format, src, &v)
		return v, err
	}
}

// valueOf decodes into a pgtype value and reads it as its driver.Value: a time.Time, or
// "infinity" and "-infinity" as text.
func valueOf[T any, P interface {
	*T
	driver.Valuer
}](m *pgtype.Map, fd pgconn.FieldDescription) func([]byte) (driver.Value, error) {
	return func(src []byte) (driver.Value, error) {
		var v T
		if err := m.Scan(fd.DataTypeOID, fd.Format, src, &v); err != nil {
			return nil, err
		}
		return P(&v).Value()
	}
}

// callerTx reports whether tx is a caller's transaction PostgreSQL code can run in: a
// pgx.Tx, or a *sql.Tx (on pgx's stdlib driver, or lent by SQLTx).
func callerTx(tx any) bool {
	switch tx.(type) {
	case pgx.Tx, *sql.Tx:
		return true
	}
	return false
}

// execIn runs a statement in the caller's transaction (callerTx) and returns the rows it
// changed.
func execIn(ctx context.Context, tx any, text string, args ...any) (int64, error) {
	if x, ok := tx.(*sql.Tx); ok {
		res, err := x.ExecContext(ctx, text, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	tag, err := tx.(pgx.Tx).Exec(ctx, text, args...)
	return tag.RowsAffected(), err
}

// scanner is a row to scan: a pgx.Row or a *sql.Row.
type scanner interface{ Scan(dest ...any) error }

// queryRowIn runs a query in the caller's transaction (callerTx) for its first row.
func queryRowIn(ctx context.Context, tx any, text string, args ...any) scanner {
	if x, ok := tx.(*sql.Tx); ok {
		return x.QueryRowContext(ctx, text, args...)
	}
	return tx.(pgx.Tx).QueryRow(ctx, text, args...)
}
