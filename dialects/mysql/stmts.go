package mysql

import (
	"context"
	"database/sql"
	"errors"
)

var errClosed = errors.New("the dialect is closed")

// stmt returns the prepared statement for text, prepared once per Dialect (and by
// database/sql once per pool connection that runs it). The texts are fixed per table, so
// the cache stays small.
func (d *Dialect) stmt(ctx context.Context, text string) (*sql.Stmt, error) {
	d.stmtMu.Lock()
	s, closed := d.stmts[text], d.closed
	d.stmtMu.Unlock()
	if s != nil {
		return s, nil
	}
	if closed {
		return nil, errClosed
	}
	// Prepared outside the lock, which must not wait for a connection.
	s, err := d.db.PrepareContext(ctx, text)
	if err != nil {
		return nil, err
	}
	d.stmtMu.Lock()
	defer d.stmtMu.Unlock()
	if d.closed {
		s.Close()
		return nil, errClosed
	}
	if prev := d.stmts[text]; prev != nil {
		s.Close()
		return prev, nil
	}
	if d.stmts == nil {
		d.stmts = make(map[string]*sql.Stmt)
	}
	d.stmts[text] = s
	return s, nil
}

// prepareAll prepares texts up front, so a statement the live schema cannot run fails
// when the subscription starts rather than at its first settlement.
func (d *Dialect) prepareAll(ctx context.Context, texts ...string) error {
	for _, t := range texts {
		if t == "" {
			continue
		}
		if _, err := d.stmt(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

func (d *Dialect) closeStmts() error {
	d.stmtMu.Lock()
	defer d.stmtMu.Unlock()
	d.closed = true
	var errs []error
	for _, s := range d.stmts {
		errs = append(errs, s.Close())
	}
	d.stmts = nil
	return errors.Join(errs...)
}

func (d *Dialect) isClosed() bool {
	d.stmtMu.Lock()
	defer d.stmtMu.Unlock()
	return d.closed
}
