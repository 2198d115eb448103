package dialects

import (
	"context"
	"fmt"
	"sync"
)

// Opener opens a dialect on an address, what follows the URL's scheme as rowactor.Open
// reads it: a SQLite file path, a PostgreSQL URL or a MySQL DSN. The dialect owns what
// it opened: its Close closes the pool.
type Opener func(ctx context.Context, addr string) (Dialect, error)

var (
	openersMu sync.RWMutex
	openers   = map[string]Opener{}
)

// Register makes a dialect reachable by rowactor.Open under kind: "sqlite", "postgres"
// or "mysql".
//
// A dialect package calls it from its init, the way database/sql drivers register, so a
// program links a database's driver only when it imports that dialect. A kind
// registered twice panics, as database/sql.Register does: it is a programming error.
func Register(kind string, open Opener) {
	openersMu.Lock()
	defer openersMu.Unlock()
	if open == nil {
		panic("rowactor: Register of a nil opener for " + kind)
	}
	if _, dup := openers[kind]; dup {
		panic(fmt.Sprintf("rowactor: Register called twice for %q", kind))
	}
	openers[kind] = open
}

// Lookup returns the opener registered for kind, if a linked package registered one.
func Lookup(kind string) (Opener, bool) {
	openersMu.RLock()
	defer openersMu.RUnlock()
	o, ok := openers[kind]
	return o, ok
}
