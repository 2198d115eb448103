package sqlstmt

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
)

// RowQuerier is a pool or a transaction of database/sql.
type RowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// On returns db, or tx when the caller gave one (a *sql.Tx); name is the dialect's, for
// the error of another type.
func On(db *sql.DB, tx any, name, op string) (RowQuerier, error) {
	switch x := tx.(type) {
	case nil:
		return db, nil
	case *sql.Tx:
		if x == nil {
			return db, nil
		}
		return x, nil
	}
	return nil, fmt.Errorf("%s: %s needs a *sql.Tx, got %T", name, op, tx)
}

// NewestUniqueKey reads the greatest key of t's UniqueKey column in [low, high) on db,
// compared as the column compares (binary in the tables Schema renders for MySQL and
// SQLite), quoting identifiers with quote.
func NewestUniqueKey(ctx context.Context, db RowQuerier, quote func(string) string, t dialects.Table, low, high string) (string, bool, error) {
	if err := tablecheck.CheckKeyRange(t, low, high); err != nil {
		return "", false, err
	}
	k := quote(t.UniqueKey)
	var key []byte
	err := db.QueryRowContext(ctx, "SELECT "+k+" FROM "+quote(t.Name)+" WHERE "+k+" >= ? AND "+k+" < ? ORDER BY "+k+" DESC LIMIT 1",
		low, high).Scan(&key)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return string(key), true, nil
}
