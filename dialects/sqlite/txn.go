package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	msqlite "modernc.org/sqlite"

	"github.com/rowactor/rowactor/dialects"
)

// Transactional mode lends *sql.Tx values: one per lease delivery (BeginDelivery), and one
// per advisory session after its take (Begin), each on a pool connection of its own. The
// package doc says what they hold and what they stall.

var (
	_ dialects.TxLeaseQueue = (*leaseQueue)(nil)
	_ dialects.TxSession    = (*session)(nil)
)

var (
	// errTxEnded is a delivery's transaction used after it ended.
	errTxEnded = errors.New("the delivery's transaction has already ended")
	// errNotInTx is a lent transaction that ended behind rowactor's back: a rollback
	// SQLite made itself (an interrupted write, SQLITE_FULL, SQLITE_IOERR), or a COMMIT
	// or ROLLBACK the handler ran through it (the commit hook turns such a COMMIT into a
	// rollback). A settlement run now would commit on its own, without the handler's
	// writes. It is reported wrapped with dialects.ErrTxEnded.
	errNotInTx = errors.New("the transaction was ended outside rowactor (by SQLite after an error, or by a COMMIT or ROLLBACK the handler must not run)")
	// errNoHooks is a pool whose driver connections cannot take a commit hook.
	errNoHooks = errors.New("the driver connection takes no commit hook (transactional mode needs modernc.org/sqlite's connections, unwrapped)")
	// errNoTx is a session committed before Begin.
	errNoTx = errors.New("the session has no transaction (Begin opens it)")
	// errTxOpen is a second Begin on a session whose transaction is still open.
	errTxOpen = errors.New("the session's transaction is already open")
)

// beginText is the statement that opens a delivery's transaction in the table's mode.
func beginText(m dialects.Mode) string {
	switch m {
	case dialects.Immediate:
		return "BEGIN IMMEDIATE"
	case dialects.Exclusive:
		return "BEGIN EXCLUSIVE"
	}
	return "BEGIN DEFERRED"
}

// deliveryTx is a transaction lent to a handler, on a connection of its own.
type deliveryTx struct {
	q    *queue
	conn *sql.Conn
	tx   *sql.Tx

	// mu guards ended, failed and suspect: a shutdown may roll a transaction back while
	// its delivery settles. Statements run without it; one that meets a transaction ended
	// meanwhile fails with sql.ErrTxDone.
	mu    sync.Mutex
	ended bool
	// failed is why the transaction ended before its commit (a settlement that failed or
	// found it ended): a later commit reports it.
	failed error
	// suspect says SQLite ended the transaction by itself: the connection is closed
	// rather than pooled.
	suspect bool

	// committing lets the commit hook pass the one commit rowactor runs (end).
	committing atomic.Bool
}

// beginTx opens a delivery's transaction in the table's mode (q.begin), outside this
// process's writer turn: it may last as long as the handler.
//
// How the mode is chosen. The handler and PublishTx need a *sql.Tx, and database/sql
// makes one only through the driver's BeginTx; it cannot adopt a transaction begun by
// executing BEGIN on a *sql.Conn. modernc.org/sqlite (v1.62.0, tx.go) begins with plain
// "begin", or "begin <_txlock>" when the pool's DSN says so: a setting per connection,
// fixed when it is opened, so it cannot vary per table; and it ignores
// sql.TxOptions.Isolation. So the transaction is opened by database/sql, which on SQLite
// takes no lock yet (a deferred BEGIN only leaves autocommit), then restarted on the same
// connection: COMMIT ends that empty transaction and BEGIN <mode> opens the one that is
// lent. database/sql does not read the SQL it runs, and the driver's Commit and Rollback
// just run COMMIT and ROLLBACK, so the *sql.Tx ends the restarted transaction. This keeps
// SQLite's own semantics of each mode, tested in txn_test.go: IMMEDIATE takes the write
// lock at BEGIN, waiting in the busy handler; EXCLUSIVE also keeps readers out in
// rollback-journal mode; DEFERRED takes nothing until the first write, whatever the
// pool's _txlock. A no-op write right after a deferred BEGIN (UPDATE ... WHERE 0) does
// take the write lock too, but it cannot take EXCLUSIVE's lock.
//
// The transaction lives as long as ctx: when ctx ends, database/sql rolls it back.
func (q *queue) beginTx(ctx context.Context) (*deliveryTx, error) {
	conn, err := q.d.db.Conn(ctx)
	if err != nil {
		return nil, q.errorf("begin", err)
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		conn.Close()
		return nil, q.errorf("begin", err)
	}
	t := &deliveryTx{q: q, conn: conn, tx: tx}
	if _, err = tx.ExecContext(ctx, "COMMIT"); err == nil {
		_, err = tx.ExecContext(ctx, q.begin)
	}
	if err != nil {
		// A BEGIN that failed (SQLITE_BUSY once busy_timeout ran out) left the
		// connection in autocommit, so this rollback fails and the connection is
		// closed: an exception, and never a connection that might stay in a
		// transaction going back to the pool.
		t.end(false)
		return nil, q.errorf(q.begin, err)
	}
	if err := t.hook(true); err != nil {
		t.end(false)
		return nil, q.errorf("begin", err)
	}
	return t, nil
}

// hook sets (on) or clears the connection's commit hook. While the transaction is lent,
// the hook refuses every commit but the one end runs: when SQLite ends the transaction by
// itself (an interrupted write, SQLITE_FULL or SQLITE_IOERR roll the whole transaction
// back) the connection is in autocommit, and the *sql.Tx does not know; each statement
// the handler runs through it afterwards would commit on its own. The hook turns each such
// commit into a rollback (the statement fails with SQLITE_CONSTRAINT_COMMITHOOK), so
// nothing of the delivery commits but with its settlement. Setting and clearing the hook
// are calls into the driver: no statement runs.
func (t *deliveryTx) hook(on bool) error {
	return t.conn.Raw(func(dc any) error {
		h, ok := dc.(msqlite.HookRegisterer)
		if !ok {
			return fmt.Errorf("%T: %w", dc, errNoHooks)
		}
		if !on {
			h.RegisterCommitHook(nil)
			return nil
		}
		h.RegisterCommitHook(func() int32 {
			if t.committing.Load() {
				return 0
			}
			return 1 // any other commit rolls back
		})
		return nil
	})
}

// checkHooks refuses transactional mode on a pool whose driver connections take no commit
// hook (a driver other than modernc.org/sqlite, or one wrapped): without it, a handler's
// statements after SQLite ended its transaction would commit on their own.
func (d *Dialect) checkHooks(ctx context.Context, table string) error {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("sqlite: open table %s: %w", table, err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		if _, ok := dc.(msqlite.HookRegisterer); !ok {
			return fmt.Errorf("%T: %w", dc, errNoHooks)
		}
		return nil
	})
	if errors.Is(err, errNoHooks) {
		return &dialects.ConfigError{Table: table, Option: "Transactional",
			Reason: "the pool's driver connections take no commit hook, which transactional mode needs to keep a " +
				"transaction SQLite ended by itself from committing the handler's later writes", Err: err,
			Fix: "open the pool with the modernc.org/sqlite driver (driver name \"sqlite\"), unwrapped, or drop Transactional"}
	}
	if err != nil {
		return fmt.Errorf("sqlite: open table %s: %w", table, err)
	}
	return nil
}

func (t *deliveryTx) open() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.ended
}

// inTx checks that the connection is still inside this transaction. A BEGIN fails inside
// a transaction and changes nothing; outside one it opens an empty deferred transaction,
// which the rollback that follows ends. A transaction found ended by SQLite (or by the
// handler) is reported wrapping dialects.ErrTxEnded, and its connection will be closed.
func (t *deliveryTx) inTx(ctx context.Context) error {
	t.mu.Lock()
	ended, failed := t.ended, t.failed
	t.mu.Unlock()
	if ended {
		if failed != nil {
			return failed
		}
		return errTxEnded
	}
	_, err := t.tx.ExecContext(ctx, "BEGIN")
	switch {
	case err == nil:
		t.mu.Lock()
		t.suspect = true
		t.mu.Unlock()
		return fmt.Errorf("%w: %w", dialects.ErrTxEnded, errNotInTx)
	case errors.Is(err, sql.ErrTxDone):
		return errTxEnded
	case ctx.Err() != nil:
		return err
	}
	return nil // "cannot start a transaction within a transaction"
}

// fail ends the transaction, rolled back, because of err, which a later commit reports.
func (t *deliveryTx) fail(err error) error {
	t.mu.Lock()
	if !t.ended && t.failed == nil {
		t.failed = err
	}
	t.mu.Unlock()
	_, rerr := t.end(false)
	return rerr
}

// run runs a settlement inside the transaction and reports whether it changed the row
// (for the move: whether both the copy and the delete did). It never takes this process's
// writer turn: the transaction may already hold SQLite's write lock (the handler wrote, or
// the mode is immediate or exclusive) while another writer of this process holds the turn
// and waits in the busy handler for that very lock; waiting for the turn here would hold
// both until busy_timeout.
func (t *deliveryTx) run(ctx context.Context, st settlement) (bool, error) {
	q := t.q
	if err := t.inTx(ctx); err != nil {
		return false, q.errorf(st.op, err)
	}
	if st.confirm != "" {
		// A lease-form event: nothing runs unless the row holds the token.
		n, err := t.exec(ctx, st.op+" confirm", st.confirm, st.confirmArgs)
		if err != nil || n == 0 {
			return false, err
		}
		_, err = t.exec(ctx, st.op, st.text, st.args)
		return err == nil, err
	}
	if st.move {
		copied, err := t.exec(ctx, st.op+" insert", q.settle.moveInsert, st.args)
		if err != nil {
			return false, err
		}
		deleted, err := t.exec(ctx, st.op+" delete", q.settle.moveDelete, st.args)
		if err != nil {
			return false, err
		}
		return copied == 1 && deleted == 1, nil
	}
	if st.text == "" {
		return true, nil
	}
	n, err := t.exec(ctx, st.op, st.text, st.args)
	return n > 0, err
}

// exec runs one statement of the Dialect's cache inside the transaction: database/sql
// prepares it once per connection and keeps it with the pool's statement.
func (t *deliveryTx) exec(ctx context.Context, op, text string, args []any) (int64, error) {
	q := t.q
	s, err := q.d.stmt(ctx, text)
	if err != nil {
		return 0, q.errorf(op, err)
	}
	ts := t.tx.StmtContext(ctx, s)
	defer ts.Close()
	n, err := changed(ts.ExecContext(ctx, args...))
	if err != nil {
		return 0, q.errorf(op, err)
	}
	return n, nil
}

// end commits the transaction (commit) or rolls it back, once, and gives its connection
// up: back to the pool when the transaction ended cleanly, closed otherwise, so SQLite
// rolls back whatever the connection still held. closed reports the latter. Ending an
// ended transaction is a no-op, except that a commit then fails: its writes are gone.
func (t *deliveryTx) end(commit bool) (closed bool, err error) {
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		if commit {
			return false, t.q.errorf("commit", errTxEnded)
		}
		return false, nil
	}
	t.ended = true
	suspect := t.suspect
	t.mu.Unlock()
	op := "rollback"
	if commit {
		op = "commit"
		// The driver rolls back a commit that failed; the connection is closed all
		// the same, in case that rollback failed too.
		t.committing.Store(true)
		err = t.tx.Commit()
	} else if err = t.tx.Rollback(); errors.Is(err, sql.ErrTxDone) {
		// database/sql ended it already: its context ended, or the handler called
		// Commit or Rollback on the *sql.Tx it was lent.
		err = nil
	}
	if err != nil || suspect || t.hook(false) != nil {
		// A driver.ErrBadConn from Raw makes database/sql close the connection (and the
		// driver forgets its hook). A connection SQLite ended a transaction on by itself
		// (a full disk, an I/O error) is not trusted with another.
		_ = t.conn.Raw(func(any) error { return driver.ErrBadConn })
		closed = true
	}
	t.conn.Close()
	if err != nil {
		return closed, t.q.errorf(op, err)
	}
	return closed, nil
}

// leaseTx is a transactional lease delivery's transaction.
type leaseTx struct {
	*deliveryTx
	lq *leaseQueue
}

// BeginDelivery opens the delivery's transaction in the table's mode on a pool connection
// of its own, without this process's writer turn (a transaction may last as long as its
// handler). It lives as long as ctx.
func (q *leaseQueue) BeginDelivery(ctx context.Context) (dialects.LeaseTx, error) {
	t, err := q.beginTx(ctx)
	if err != nil {
		return nil, err
	}
	return &leaseTx{deliveryTx: t, lq: q}, nil
}

// Tx is the *sql.Tx lent to the handler.
func (t *leaseTx) Tx() any { return t.tx }

// SettleLease runs the step fenced by the token inside the transaction, and commits when
// it changed the row (for a move into the dead-letter table: when both the copy and the
// delete did). Otherwise it rolls back, the handler's writes included, and reports false;
// a failed statement rolls back and reports its error. Either way the transaction is over.
func (t *leaseTx) SettleLease(ctx context.Context, step dialects.Step, held dialects.Lease) (bool, error) {
	st, err := t.lq.leaseSettlement(step, held)
	ok := false
	if err == nil {
		ok, err = t.run(ctx, st)
	}
	if err != nil || !ok {
		return false, errors.Join(err, t.fail(err))
	}
	if _, err := t.end(true); err != nil {
		return false, err
	}
	return true, nil
}

// Interrupt rolls the transaction back while its handler may still be using it, as
// Rollback does: database/sql serialises the rollback behind a statement the handler is
// running through the *sql.Tx and fails its later ones (sql.ErrTxDone). The lease is the
// caller's to release.
func (t *leaseTx) Interrupt(ctx context.Context) error { return t.Rollback(ctx) }

// Rollback discards the transaction (a no-op once it ended).
func (t *leaseTx) Rollback(ctx context.Context) error {
	_, err := t.end(false)
	return err
}

// Begin opens the session's transaction in the table's mode, on a pool connection of its
// own (SQLite's advisory sessions hold none otherwise), without this process's writer
// turn. It lives as long as ctx.
func (s *session) Begin(ctx context.Context) error {
	if s.isEnded() {
		return s.q.errorf("begin", errSessionEnded)
	}
	if s.openTx() != nil {
		return s.q.errorf("begin", errTxOpen)
	}
	t, err := s.q.beginTx(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tx != nil && s.tx.open() {
		t.end(false)
		return s.q.errorf("begin", errTxOpen)
	}
	s.tx = t
	return nil
}

// Tx is the *sql.Tx lent to the handler: nil before Begin, the last one Begin opened after.
func (s *session) Tx() any {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tx == nil {
		return nil
	}
	return s.tx.tx
}

// openTx is the session's transaction while it is open, nil otherwise.
func (s *session) openTx() *deliveryTx {
	s.mu.Lock()
	t := s.tx
	s.mu.Unlock()
	if t == nil || !t.open() {
		return nil
	}
	return t
}

// settle runs an advisory settlement inside the session's transaction; Commit ends it. A
// settlement that fails (or finds the transaction ended) rolls it back, and Commit then
// reports why.
func (t *deliveryTx) settle(ctx context.Context, st settlement) error {
	if !st.move && st.text == "" {
		return nil
	}
	if _, err := t.run(ctx, st); err != nil {
		return errors.Join(err, t.fail(err))
	}
	return nil
}

// Commit commits the handler's writes and the settlement's. A transaction that ended
// behind rowactor's back is rolled back instead, with an error.
func (s *session) Commit(ctx context.Context) error {
	s.mu.Lock()
	t := s.tx
	s.mu.Unlock()
	if t == nil {
		return s.q.errorf("commit", errNoTx)
	}
	if err := t.inTx(ctx); err != nil {
		return errors.Join(s.q.errorf("commit", err), t.fail(err))
	}
	_, err := t.end(true)
	return err
}

// Interrupt ends the session while its handler may still be using the lent transaction,
// as Abort does: the transaction is rolled back (see leaseTx.Interrupt) and the key
// released.
func (s *session) Interrupt(ctx context.Context) error { return s.Abort(ctx) }

// Rollback discards the transaction (a no-op once it ended, or before Begin).
func (s *session) Rollback(ctx context.Context) error {
	_, err := s.endTx()
	return err
}

// endTx rolls back the session's transaction if one is open.
func (s *session) endTx() (closed bool, err error) {
	s.mu.Lock()
	t := s.tx
	s.mu.Unlock()
	if t == nil {
		return false, nil
	}
	return t.end(false)
}
