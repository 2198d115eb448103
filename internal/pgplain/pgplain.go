// Package pgplain records the pgx pools that were made from a connection string alone,
// with nothing of their configuration set in code. Only such pools may share a LISTEN
// session by their connection string (dialects/postgres): a pool configured in code (a
// database, a dialer or a hook set after parsing) may reach the server differently, and
// nothing in its configuration tells so reliably.
package pgplain

import (
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
)

var pools sync.Map // *pgxpool.Pool → struct{}

// Mark records p as made by pgxpool.New(ctx, p.Config().ConnString()) and nothing else.
func Mark(p *pgxpool.Pool) { pools.Store(p, struct{}{}) }

// Forget drops p's record; call it as p is closed.
func Forget(p *pgxpool.Pool) { pools.Delete(p) }

// Is reports whether p was marked.
func Is(p *pgxpool.Pool) bool {
	_, ok := pools.Load(p)
	return ok
}
