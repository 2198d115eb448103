package dialecttest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// SQLRunner is the raw-SQL half of a Harness for a dialect on database/sql (MySQL,
// SQLite): embed it and give it the dialect's pool.
type SQLRunner struct {
	DB func(dialects.Dialect) *sql.DB
}

// SQLCaps is c with what the dialects on database/sql share: Publish takes a *sql.Tx as
// the caller's transaction, refuses a *sql.DB, and takes a nil *sql.Tx as none.
func SQLCaps(c Caps) Caps {
	c.TxType, c.WrongTx, c.TypedNilTx = "*sql.Tx", (*sql.DB)(nil), (*sql.Tx)(nil)
	return c
}

func (r SQLRunner) Exec(t *testing.T, d dialects.Dialect, query string, args ...any) {
	t.Helper()
	if _, err := r.DB(d).ExecContext(ctx, query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

func (r SQLRunner) Try(c context.Context, d dialects.Dialect, query string, args ...any) error {
	_, err := r.DB(d).ExecContext(c, query, args...)
	return err
}

func (r SQLRunner) QueryRow(t *testing.T, d dialects.Dialect, query string, args []any, dest ...any) bool {
	t.Helper()
	err := r.DB(d).QueryRowContext(ctx, query, args...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return false
	}
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return true
}

// LentTry runs on the *sql.Tx a delivery lends.
func (SQLRunner) LentTry(tx any, query string, args ...any) error {
	stx, ok := tx.(*sql.Tx)
	if !ok || stx == nil {
		return fmt.Errorf("Tx() is %T %v, want a *sql.Tx", tx, tx)
	}
	_, err := stx.ExecContext(ctx, query, args...)
	return err
}

// BeginTx opens a caller's *sql.Tx with opts.
func (r SQLRunner) BeginTx(t *testing.T, d dialects.Dialect, opts *sql.TxOptions) Tx {
	t.Helper()
	tx, err := r.DB(d).BeginTx(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	return sqlTx{tx}
}

// sqlTx is a caller's *sql.Tx.
type sqlTx struct{ *sql.Tx }

func (tx sqlTx) Value() any { return tx.Tx }

func (tx sqlTx) Exec(query string, args ...any) error {
	_, err := tx.ExecContext(ctx, query, args...)
	return err
}

// ReadState reads row id of tbl on db, for a Harness.State on database/sql: the columns
// tbl names (unnamed ones read as zero), times scanned into T (sql.NullTime, or
// sql.NullString where the database keeps times as text) and made times by toTime, which
// returns nil for NULL. It reports false when the row does not exist.
func ReadState[T any](t *testing.T, db *sql.DB, quote func(string) string, tbl dialects.Table, id int64,
	toTime func(T) *time.Time) (RowState, bool) {
	t.Helper()
	col := func(name string) string {
		if name == "" {
			return "NULL"
		}
		return quote(name)
	}
	var (
		s                   RowState
		attempt             sql.NullInt64
		group               sql.NullString
		locked, retry, proc T
	)
	err := db.QueryRowContext(ctx, "SELECT "+col(tbl.Attempt)+", "+col(tbl.Group)+", "+col(tbl.LockedUntil)+", "+
		col(tbl.RetryAfter)+", "+col(tbl.ProcessedAt)+" FROM "+quote(tbl.Name)+" WHERE "+quote(tbl.ID)+" = ?", id).
		Scan(&attempt, &group, &locked, &retry, &proc)
	if errors.Is(err, sql.ErrNoRows) {
		return s, false
	}
	if err != nil {
		t.Fatal(err)
	}
	s.Attempt, s.Group = int(attempt.Int64), group.String
	s.LockedUntil, s.RetryAfter, s.ProcessedAt = toTime(locked), toTime(retry), toTime(proc)
	return s, true
}
