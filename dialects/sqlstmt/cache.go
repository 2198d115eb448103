package sqlstmt

import (
	"context"
	"database/sql"
	"errors"
	"sync"
)

// ErrClosed reports a statement asked of a closed cache.
var ErrClosed = errors.New("the dialect is closed")

// Cache holds prepared statements by text. The texts are fixed per table, so it stays
// small. The zero Cache is not usable; set DB first.
type Cache struct {
	DB *sql.DB

	mu     sync.Mutex
	stmts  map[string]*sql.Stmt
	closed bool
}

// Cached returns text's prepared statement if it was prepared already, else nil; it never
// prepares (see Stmt), so it never waits for a connection.
func (c *Cache) Cached(text string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stmts[text]
}

// Stmt returns the prepared statement for text, preparing it on first use. Preparing
// takes a pool connection: a caller holding a transaction must use Cached and prepare on
// its own transaction instead, or it may wait for a second connection that a pool whose
// connections all hold such transactions never frees.
func (c *Cache) Stmt(ctx context.Context, text string) (*sql.Stmt, error) {
	c.mu.Lock()
	s, closed := c.stmts[text], c.closed
	c.mu.Unlock()
	if s != nil {
		return s, nil
	}
	if closed {
		return nil, ErrClosed
	}
	// Prepared outside the lock, which must not wait for a connection.
	s, err := c.DB.PrepareContext(ctx, text)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		s.Close()
		return nil, ErrClosed
	}
	if prev := c.stmts[text]; prev != nil {
		s.Close()
		return prev, nil
	}
	if c.stmts == nil {
		c.stmts = make(map[string]*sql.Stmt)
	}
	c.stmts[text] = s
	return s, nil
}

// PrepareAll prepares texts up front; empty texts are passed over.
func (c *Cache) PrepareAll(ctx context.Context, texts ...string) error {
	for _, t := range texts {
		if t == "" {
			continue
		}
		if _, err := c.Stmt(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// Close closes every statement; later calls return ErrClosed.
func (c *Cache) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for _, s := range c.stmts {
		errs = append(errs, s.Close())
	}
	c.stmts = nil
	return errors.Join(errs...)
}

// Closed reports whether Close ran.
func (c *Cache) Closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}
