// Package postgres is rowactor's PostgreSQL dialect, on github.com/jackc/pgx/v5 and its
// pool (pgxpool).
//
// PostgreSQL serves all three claim forms:
//
//   - Row lock: the claim transaction (plain BEGIN, or the table's declared isolation)
//     holds its row with SELECT … FOR UPDATE SKIP LOCKED while the handler runs; the
//     settlement statement and the COMMIT end it. One pool connection per row in work.
//   - Lease: one statement claims, stamps the lease and counts the attempt; every
//     settlement is fenced by the lease expiry (locked_until = token). No connection is
//     held while the handler runs.
//   - Advisory lock: the key text is rendered by SQL (concat of the template's literals
//     and columns, NULL reading as empty) and locked with pg_try_advisory_lock on its
//     64-bit hashtextextended(key, 0), on a connection set aside for the delivery. The
//     connection returns to the pool only when the server confirms the unlock; it is
//     closed otherwise. Session locks need a direct connection or PgBouncer in session
//     pooling: transaction pooling loses them.
//
// # Transactional mode
//
// A transactional subscription (QueueSpec.Transactional) lends each delivery a pgx.Tx
// (and the same transaction as a *sql.Tx: dialects.SQLLender, sqltx.go),
// opened at the table's isolation level (plain BEGIN when none is declared):
//
//   - Row lock: the claim transaction itself (dialects.TxLockedClaim), with the savepoint
//     rowactor_claim set after the claim; a retry rolls back to it and counts the attempt
//     in the same transaction.
//   - Lease: a transaction of its own on a pool connection acquired per delivery
//     (dialects.TxLeaseQueue); the fenced settlement runs inside it and commits only while
//     the row still holds the token. Open refuses a transactional lease table at
//     repeatable read or serializable: its snapshot would not see the renewer's extended
//     lease.
//   - Advisory lock: a transaction on the session's connection (dialects.TxSession),
//     always ended before the key is unlocked.
//
// A handler runs its queries on the pgx.Tx and never commits or rolls it back itself. A
// transaction the server aborted (a statement in it failed, a deadlock's victim included)
// refuses every later statement and its COMMIT is a ROLLBACK, so nothing of it commits; its
// settlement reports an error wrapping dialects.ErrTxEnded (found from the connection's
// transaction status, with no extra statement). A connection that carried a lent
// transaction returns to the pool only idle outside a transaction; otherwise it is
// closed, and the server rolls back. In the lease form each
// delivery in work then holds a connection: size the pool as for the other forms.
//
// Time columns are timestamptz and are bound as time.Time (the server keeps
// microseconds; lease tokens are compared by the server, in its own precision). The
// payload column is bytea (text, varchar, json and jsonb are read as their bytes too);
// headers are jsonb (or json, text). Identifiers are always double-quoted, so names keep
// their case, and names longer than PostgreSQL's 63 bytes are refused rather than
// silently truncated.
//
// # Pool sizing
//
// The subscriptions on a pool never hold more than its size less one connection between
// them (Limits.Budget, shared by every dialect and broker made on the pool), the one left
// for publishes and handlers' own queries; what each holds depends on the form:
//
//   - Row lock: one connection per row in work (its claim transaction) and one per claim
//     in flight. Workers(n) needs a pool of at least n + 1 to keep n rows in work.
//   - Lease: one connection per claim in flight and per settlement, only for the statement;
//     the renewer takes one per round. A pool of 4 serves many workers.
//   - Advisory lock: one connection per row in work (the session holding its key) and one
//     per claim in flight. Workers(n) needs at least n + 1.
//
// Subscriptions sharing a pool share it: add up their workers. The broker also holds one
// connection of its own (outside the pool) for LISTEN, unless WithPollOnly. pgxpool's
// default size is max(4, number of CPUs); set pool_max_conns in the URL to change it. A
// subscription whose budget is spent keeps fewer rows in work rather than waiting for the
// pool.
//
// Publishing notifies channel Channel ("rowactor") with the payload "<table>\t<group>" in
// the same statement as the insert, so a notification from a caller's transaction is
// delivered when it commits. (*Dialect).Listen receives them (dialects.Notifier).
package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/pgplain"
)

// Channel is the LISTEN/NOTIFY channel every publish notifies, with the payload
// "<table>\t<group>" (the group is empty for a table without groups). Other writers may
// send the same notification (e.g. from an AFTER INSERT trigger) to wake subscribers.
const Channel = "rowactor"

// Dialect is PostgreSQL behind rowactor.
type Dialect struct {
	pool  *pgxpool.Pool
	owned bool

	// sqlOnce makes sqlDB, the pool as a database/sql handle, on first use.
	sqlOnce sync.Once
	sqlDB   *sql.DB
	// lent lends transactional deliveries' transactions as *sql.Tx (sqltx.go).
	lent lentSQL
}

var (
	_ dialects.Dialect  = (*Dialect)(nil)
	_ dialects.Notifier = (*Dialect)(nil)
	_ dialects.SQLDB    = (*Dialect)(nil)
)

// New wraps a pool. The caller keeps owning it: Close does not close it.
//
// The row lock and advisory forms hold one pool connection per row in work, so size the
// pool for the workers of those subscriptions plus one (they share the pool's size less
// one: Limits.Budget).
func New(pool *pgxpool.Pool) *Dialect {
	return &Dialect{pool: pool}
}

// Open opens a pool on url (a pgx connection string, e.g.
// "postgres://user@host:5432/db?sslmode=disable&pool_max_conns=16"), checks the server
// answers, and owns the pool: Close closes it.
func Open(ctx context.Context, url string) (*Dialect, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	pgplain.Mark(pool) // its LISTEN session may be shared: see Listen
	return &Dialect{pool: pool, owned: true}, nil
}

// Pool returns the pool.
func (d *Dialect) Pool() *pgxpool.Pool { return d.pool }

// SQLDB returns the pool as a *sql.DB (pgx's stdlib over the pool), made on first use:
// its connections come from the pool and go back to it after each use. A *sql.Tx begun
// on it can be given to PublishTx. Close closes it; closing it does not close the pool.
func (d *Dialect) SQLDB() *sql.DB {
	d.sqlOnce.Do(func() { d.sqlDB = stdlib.OpenDBFromPool(d.pool) })
	return d.sqlDB
}

// Name is "postgres".
func (d *Dialect) Name() string { return "postgres" }

// Limits: the subscriptions on the pool may hold its size less one (at least one) between
// them, leaving a connection for publishes and handlers' own queries: they share one
// Budget per pool, whichever dialect or broker they came through.
func (d *Dialect) Limits() dialects.Limits {
	n := int(d.pool.Config().MaxConns) - 1
	if n < 1 {
		n = 1
	}
	return dialects.Limits{Connections: n, ClaimsInFlight: 0, SessionConnections: true, Budget: dialects.BudgetFor(d.pool, n)}
}

// Close closes the pool if Open made it. Closing waits for every acquired connection to
// be released, so shut every broker on the dialect down first.
func (d *Dialect) Close() error {
	var err error
	d.sqlOnce.Do(func() {}) // no handle is made once Close has begun
	if d.sqlDB != nil {
		err = d.sqlDB.Close()
	}
	d.lent.close()
	if d.owned {
		d.pool.Close()
		dialects.ForgetBudget(d.pool)
		pgplain.Forget(d.pool)
	}
	return err
}
