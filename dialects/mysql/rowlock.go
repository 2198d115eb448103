package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// rowLockQueue serves the row lock form: each claim is a transaction on a pool connection
// of its own that holds one row under FOR UPDATE SKIP LOCKED until its settlement commits.
type rowLockQueue struct {
	queue
	cl     claimable
	claim  string
	claimN string // up to ? rows, for batch handlers
	// claimSkip and claimNSkip are claim and claimN passing over the rows set aside in
	// skip (poison.go), used while there are any: the list binds after the claimable args.
	claimSkip, claimNSkip string
	skip                  skipSet
	level                 sql.IsolationLevel
	// transactional: claims lend their transaction to the handler (txClaim).
	transactional bool
}

var _ dialects.RowLockQueue = (*rowLockQueue)(nil)

func newRowLockQueue(base queue, t dialects.Table) *rowLockQueue {
	cl := newClaimable(t, false)
	sel := "SELECT " + rowColumns(t, false) + " FROM " + quote(t.Name) + " WHERE " + cl.where
	order := " ORDER BY " + t.ClaimOrder(quote, "")
	skip := sel + skipCond(t) + order
	sel += order
	return &rowLockQueue{
		queue:      base,
		cl:         cl,
		claim:      sel + " LIMIT 1 FOR UPDATE SKIP LOCKED",
		claimN:     sel + " LIMIT ? FOR UPDATE SKIP LOCKED",
		claimSkip:  skip + " LIMIT 1 FOR UPDATE SKIP LOCKED",
		claimNSkip: skip + " LIMIT ? FOR UPDATE SKIP LOCKED",
		level:      isolation(t.Isolation),
	}
}

func (q *rowLockQueue) texts() []string {
	return []string{q.claim, q.claimN, q.claimSkip, q.claimNSkip}
}

// ClaimLocked opens a transaction at the table's level (READ COMMITTED when none is
// declared: REPEATABLE READ would gap-lock the index range the claim read, blocking
// inserts into the queue while the row is in work) and takes the first due row.
func (q *rowLockQueue) ClaimLocked(ctx context.Context, now time.Time) (dialects.LockedClaim, bool, error) {
	c, err := withRetry(ctx, func() (*lockedClaim, error) { return q.claimOnce(ctx, now) })
	if err != nil {
		return nil, false, q.errorf("claim", err)
	}
	if c == nil {
		return nil, false, nil
	}
	return q.deliver(ctx, c)
}

// deliver returns a claim as it is delivered: a transactional subscription's lends its
// transaction (lend: autocommit off, the savepoint), and is ended when that fails.
func (q *rowLockQueue) deliver(ctx context.Context, c *lockedClaim) (dialects.LockedClaim, bool, error) {
	if !q.transactional {
		return c, true, nil
	}
	c.x.lent = true
	if err := lend(ctx, c.x.tx); err != nil {
		return nil, false, q.errorf("claim", errors.Join(err, c.x.rollback()))
	}
	return txClaim{c}, true, nil
}

func (q *rowLockQueue) claimOnce(ctx context.Context, now time.Time) (*lockedClaim, error) {
	x, err := q.d.begin(ctx, q.level)
	if err != nil {
		return nil, err
	}
	text, args := q.claim, q.cl.args(nil, q.group, now)
	if skip := q.skip.list(); skip != "" {
		text, args = q.claimSkip, append(args, skip)
	}
	sel, err := q.d.stmt(ctx, text)
	if err != nil {
		_ = x.rollback()
		return nil, err
	}
	r, err := q.scanOne(x.tx.StmtContext(ctx, sel).QueryContext(ctx, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, x.rollback()
	}
	if err != nil {
		_ = x.rollback()
		return nil, err
	}
	return &lockedClaim{q: q, x: x, row: r}, nil
}

// lockedClaim is an open claim transaction holding one row.
type lockedClaim struct {
	q   *rowLockQueue
	x   *txn
	row dialects.Row

	mu    sync.Mutex
	ended bool
}

var _ dialects.LockedClaim = (*lockedClaim)(nil)

func (c *lockedClaim) Row() dialects.Row { return c.row }

// Tx is the claim transaction, for a transactional delivery's handler. It ends with the
// claim's Settle or Rollback.
func (c *lockedClaim) Tx() *sql.Tx { return c.x.tx }

var errEnded = errors.New("the claim transaction has ended")

// Settle runs the step's statement in the claim transaction and commits, or rolls back
// when the step writes nothing (Retry without an attempt column, Release) or a statement
// fails. A step naming an event of the subscription's runs the event instead, and commits.
func (c *lockedClaim) Settle(ctx context.Context, step dialects.Step) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.q
	op := step.Kind.String()
	if c.ended {
		return q.errorf(op, errEnded)
	}
	c.ended = true
	op, text, args, move, err := q.statement(step, c.row.ID)
	if err != nil {
		return q.errorf(op, errors.Join(err, c.x.rollback()))
	}
	if c.x.lent && (move || text != "") {
		// A lent transaction the server ended must not commit what ran since.
		if err := alive(ctx, c.x.tx); err != nil {
			return q.errorf(op, errors.Join(err, c.x.rollback()))
		}
	}
	switch {
	case move:
		moved, err := q.move(ctx, c.x.tx, args)
		if err == nil && !moved {
			err = fmt.Errorf("row %d was not moved: the copy or the delete changed no row", c.row.ID)
		}
		if err != nil {
			return q.errorf("dead-letter move", errors.Join(ended(err), c.x.rollback()))
		}
	case text == "":
		if err := c.x.rollback(); err != nil {
			return q.errorf(op+" rollback", err)
		}
		return nil
	default:
		s, err := q.d.stmt(ctx, text)
		if err == nil {
			_, err = c.x.tx.StmtContext(ctx, s).ExecContext(ctx, args...)
		}
		if err != nil {
			return q.errorf(op, errors.Join(ended(err), c.x.rollback()))
		}
	}
	if err := c.x.commit(); err != nil {
		return q.errorf(op+" commit", err)
	}
	return nil
}

// Rollback ends the transaction without a settlement; the row returns at once. A failed
// rollback closes the connection, so the server rolls the transaction back itself.
func (c *lockedClaim) Rollback(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return nil
	}
	c.ended = true
	if err := c.x.rollback(); err != nil {
		return c.q.errorf("rollback", err)
	}
	return nil
}

// txClaim is the claim of a transactional subscription: its transaction is lent to the
// handler, whose writes commit with the settlement (Settle, as lockedClaim's). The claim
// lent it (lend): autocommit is off on its connection and the savepoint rowactor_claim is
// set, right after the claim; Settle commits only while that savepoint is still there
// (alive), so a transaction InnoDB ended meanwhile commits nothing.
//
// Settle is never retried after a deadlock or a lock wait timeout: the handler's writes
// cannot be replayed. A deadlock has rolled the whole transaction back (the row lock
// included), so a deadlocked settlement returns its error, wrapping dialects.ErrTxEnded,
// after the rollback.
type txClaim struct{ *lockedClaim }

var _ dialects.TxLockedClaim = txClaim{}

// Tx is the claim transaction, a *sql.Tx. It ends with the claim's Settle or Rollback.
func (c txClaim) Tx() any { return c.x.tx }

// Interrupt rolls the claim transaction back while its handler may still be using it, as
// Rollback does: database/sql serialises the rollback behind a statement the handler is
// running through the *sql.Tx and fails the handler's later ones (sql.ErrTxDone), so
// neither the transaction nor its connection is used by two goroutines at once.
func (c txClaim) Interrupt(ctx context.Context) error { return c.Rollback(ctx) }

// Savepoint has nothing to do: the claim set the savepoint rowactor_claim when it lent
// its transaction, right after the claim (one statement fewer per delivery).
func (c txClaim) Savepoint(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return c.q.errorf("savepoint", errEnded)
	}
	return nil
}

// RollbackToSavepoint discards the handler's writes and keeps the row locked (InnoDB keeps
// the locks taken before the savepoint). When it fails (the savepoint is gone: a deadlock
// in the handler rolled the transaction back; the error then wraps dialects.ErrTxEnded)
// the whole transaction is rolled back and the claim ends, so that no later Settle can
// commit the handler's writes.
func (c txClaim) RollbackToSavepoint(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return c.q.errorf("rollback to savepoint", errEnded)
	}
	if _, err := c.x.tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
		c.ended = true
		if serverError(err) == errNoSavepoint {
			err = fmt.Errorf("%w (the savepoint set at the claim is gone: %w)", dialects.ErrTxEnded, err)
		}
		return c.q.errorf("rollback to savepoint", errors.Join(err, c.x.rollback()))
	}
	return nil
}
