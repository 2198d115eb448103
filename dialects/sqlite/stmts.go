package sqlite

import (
	"context"
	"database/sql"
)

// stmt returns the prepared statement for text, prepared once per Dialect.
func (d *Dialect) stmt(ctx context.Context, text string) (*sql.Stmt, error) {
	return d.stmts.Stmt(ctx, text)
}

// prepareAll prepares texts up front, so a statement the live schema cannot run fails
// when the subscription starts rather than at its first settlement.
func (d *Dialect) prepareAll(ctx context.Context, texts ...string) error {
	return d.stmts.PrepareAll(ctx, texts...)
}

func (d *Dialect) closeStmts() error { return d.stmts.Close() }

func (q *queue) query(ctx context.Context, text string, args ...any) (*sql.Rows, error) {
	s, err := q.d.stmt(ctx, text)
	if err != nil {
		return nil, err
	}
	return s.QueryContext(ctx, args...)
}
