// Package sqlite is rowactor's SQLite dialect, on the pure-Go driver modernc.org/sqlite
// (driver name "sqlite").
//
// SQLite serves the lease and the advisory lock forms; it has no row locks, so a table
// without LockedUntil or AdvisoryKey is refused. Time columns hold UTC text in TimeLayout.
// SQLite has one writer per database file: this package serialises the process's own
// writes to a file, and advisory keys in work are kept in a process-wide registry per
// file, so one process (any number of Dialects) per database file is the supported setup
// for the advisory form.
//
// # Transactional mode
//
// Both forms lend a transactional delivery a *sql.Tx on a pool connection of its own: the
// lease form one per delivery (BeginDelivery), the advisory form one per session, opened
// after the take (Begin). It opens in the table's Mode: BEGIN DEFERRED by default, or
// IMMEDIATE or EXCLUSIVE (txn.go says how, since the driver chooses the BEGIN itself). It
// lives as long as the context it was opened with. The handler's writes through it, rows
// it publishes with PublishTx included, commit with the settlement: the lease form's
// settlement, fenced by the token, commits only if it changed the row and otherwise rolls
// back everything; the advisory form's settles inside it and Commit ends it.
//
// SQLite rolls a transaction back by itself after some errors (an interrupted write,
// SQLITE_FULL, SQLITE_IOERR), leaving the connection in autocommit without the *sql.Tx
// knowing. So while a transaction is lent, its connection carries a commit hook that
// refuses every commit but the settlement's: a statement the handler runs through the
// *sql.Tx after such a rollback fails instead of committing on its own, and the settlement
// reports an error wrapping dialects.ErrTxEnded (the connection is then closed). The hook
// is a driver call, not a statement; it needs the pool's connections to be
// modernc.org/sqlite's, unwrapped (Open refuses a transactional subscription otherwise).
//
// A delivery's transaction never takes this process's writer turn, neither to begin nor
// to settle: it may hold SQLite's write lock while another writer of this process holds
// the turn and waits in the busy handler for that lock, and waiting for the turn would
// then stall both until busy_timeout.
//
// What can still stall: SQLite has one writer per file, and a transactional delivery holds
// the write lock from BEGIN IMMEDIATE or EXCLUSIVE, or from its first write when deferred,
// until it settles. Meanwhile every other writer on the file waits in the busy handler:
// claims, lease renewals, settlements, publishes, and the BEGIN of other immediate or
// exclusive deliveries, so such deliveries run one at a time. A writer that waits longer
// than busy_timeout (Open sets 10 s) fails with SQLITE_BUSY: a claim is retried after the
// claimer's backoff, a lease renewal that fails can let leases expire, and a delivery
// whose BEGIN fails is released unhandled. Keep transactional handlers well within
// busy_timeout. A deferred transaction that reads before it writes cannot wait for the
// lock at all: SQLite fails its first write (the handler's, or the settlement's) at once
// with SQLITE_BUSY when another connection holds the lock, or when one committed since it
// first read, which the lease form's claims and renewals do all the time. Its settlement
// then fails and rolls back; declare Mode Immediate for handlers that read before they
// write. In rollback-journal mode (not Open's WAL), a transaction that has read also keeps
// every other connection from committing until it ends.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/sqlstmt"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// The modes Table.Mode takes, how SQLite begins a table's transactions: a SQLite-only
// setting, so it lives with the SQLite dialect.
const (
	Deferred  = dialects.Deferred
	Immediate = dialects.Immediate
	Exclusive = dialects.Exclusive
)

// Dialect is SQLite behind rowactor.
type Dialect struct {
	db    *sql.DB
	owned bool

	mu   sync.Mutex
	file *file // resolved on first use, then fixed

	stmts sqlstmt.Cache
}

var _ dialects.Dialect = (*Dialect)(nil)

// New wraps a pool opened with the modernc.org/sqlite driver. The caller keeps owning
// it: Close does not close it. The pool should have a busy_timeout set (Open's DSN shows
// how), or writers in other processes fail at once with SQLITE_BUSY.
func New(db *sql.DB) *Dialect {
	return &Dialect{db: db, stmts: sqlstmt.Cache{DB: db}}
}

// Open opens (creating it if missing) the database file at path in WAL mode with a
// 10 s busy timeout and synchronous NORMAL, and owns the pool: Close closes it. Only
// file paths are accepted: an in-memory database is private to each connection of a
// pool.
func Open(ctx context.Context, path string) (*Dialect, error) {
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil, fmt.Errorf("sqlite: open %q: want a database file path (no URI, no :memory:)", path)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %q: %w", path, err)
	}
	db, err := sql.Open("sqlite", dsn(abs))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %q: %w", path, err)
	}
	d := &Dialect{db: db, owned: true, stmts: sqlstmt.Cache{DB: db}}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: open %q: %w", path, err)
	}
	if _, err := d.fileEntry(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return d, nil
}

// dsn builds a URI filename: the driver runs each _pragma on every new connection, and
// SQLite ignores query parameters it does not know. Characters that would end the path
// part of a URI are escaped.
func dsn(path string) string {
	p := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(filepath.ToSlash(path))
	q := url.Values{"_pragma": {"busy_timeout(10000)", "journal_mode(WAL)", "synchronous(NORMAL)"}}
	return "file:" + p + "?" + q.Encode()
}

// DB returns the pool.
func (d *Dialect) DB() *sql.DB { return d.db }

// SQLDB is DB: the pool the dialect runs on, for dialects.SQLDB.
func (d *Dialect) SQLDB() *sql.DB { return d.db }

// Name is "sqlite".
func (d *Dialect) Name() string { return "sqlite" }

// Limits: no connection cap (outside transactional mode no form holds a connection
// through a handler; a transactional delivery holds one for its transaction, and the pool
// Open makes has no size cap), and one claim at a time per subscription, since concurrent
// claims would only queue for the single writer.
func (d *Dialect) Limits() dialects.Limits {
	return dialects.Limits{Connections: 0, ClaimsInFlight: 1}
}

// Close releases the dialect's prepared statements, and closes the pool if Open made it.
func (d *Dialect) Close() error {
	err := d.closeStmts()
	if d.owned {
		err = errors.Join(err, d.db.Close())
	}
	return err
}

// fileEntry finds the registry entry of the pool's main database, keyed by the path
// SQLite reports, so Dialects opened on the same file by different paths still share it.
func (d *Dialect) fileEntry(ctx context.Context) (*file, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.file != nil {
		return d.file, nil
	}
	var path string
	err := d.db.QueryRowContext(ctx, "SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&path)
	if errors.Is(err, sql.ErrNoRows) {
		err = errors.New("no main database")
	}
	if err != nil {
		return nil, fmt.Errorf("sqlite: locate the database file: %w", err)
	}
	if path == "" {
		// A memory or temporary database is private to this pool: nothing to share.
		path = fmt.Sprintf("private:%p", d)
	}
	d.file = fileFor(path)
	return d.file, nil
}
