package postgres

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor/dialects"
)

// endTimeout bounds a ROLLBACK or a connection close that must run even when the caller's
// context has ended.
const endTimeout = 5 * time.Second

type rowLockQueue struct {
	queue
	claim  stmt
	claimN stmt // up to $limit rows, for batch handlers
	// claimSkip and claimNSkip are claim and claimN passing over the rows set aside in
	// skip (poison.go), used while there are any.
	claimSkip, claimNSkip stmt
	skip                  skipSet
}

var _ dialects.RowLockQueue = (*rowLockQueue)(nil)

func newRowLockQueue(base queue, t dialects.Table) *rowLockQueue {
	claim := func(many, skip bool) stmt {
		var w builder
		w.w("SELECT ", rowColumns(t, "", quote(t.Attempt)), " FROM ", quote(t.Name),
			" WHERE ", claimable(&w, t, "", false))
		if skip {
			w.w(skipCond(&w, t))
		}
		w.w(" ORDER BY ", t.ClaimOrder(quote, ""), " LIMIT ")
		if many {
			w.w(w.p(pLimit))
		} else {
			w.w("1")
		}
		w.w(" FOR UPDATE SKIP LOCKED")
		return w.stmt()
	}
	return &rowLockQueue{queue: base, claim: claim(false, false), claimN: claim(true, false),
		claimSkip: claim(false, true), claimNSkip: claim(true, true)}
}

// ClaimLocked opens the claim transaction on a pool connection of its own and locks the
// first due row. The connection stays with the claim until Settle or Rollback ends it.
// A transactional subscription's claim is a dialects.TxLockedClaim lending its pgx.Tx.
func (q *rowLockQueue) ClaimLocked(ctx context.Context, now time.Time) (dialects.LockedClaim, bool, error) {
	c, err := q.begin(ctx, q.transactional)
	if err != nil {
		return nil, false, err
	}
	c.from = q
	return q.take(ctx, c, now)
}

// begin takes a pool connection of its own for a claim transaction. Opened eagerly, the
// transaction is a pgx.Tx: a transactional subscription lends it to the handler, and a
// FIFO claim runs its group guard first. Otherwise its BEGIN goes with the claim's
// statement (take).
func (q *rowLockQueue) begin(ctx context.Context, eager bool) (*lockedClaim, error) {
	conn, err := q.d.pool.Acquire(ctx)
	if err != nil {
		return nil, q.errorf("claim", err)
	}
	if !eager {
		return &lockedClaim{q: q, conn: conn}, nil
	}
	tx, err := conn.BeginTx(ctx, q.txOptions)
	if err != nil {
		endConn(conn, err) // the connection's state is unknown: closed
		return nil, q.errorf("claim", err)
	}
	return &lockedClaim{q: q, conn: conn, tx: tx}, nil
}

// take runs the claim in c's transaction: the claim holds the row it found, or ends the
// transaction when none is due. A transaction not yet open is opened by a BEGIN sent with
// the claim in one round trip (sendPipelined).
func (q *rowLockQueue) take(ctx context.Context, c *lockedClaim, now time.Time) (dialects.LockedClaim, bool, error) {
	st, b := q.claimStmt(now)
	var (
		rows pgx.Rows
		br   pgx.BatchResults
		err  error
	)
	if c.tx == nil {
		c.tx = &connTx{conn: c.conn.Conn()}
		var batch pgx.Batch
		batch.Queue(q.beginText)
		batch.Queue(st.text, st.args(&b)...)
		br = c.conn.SendBatch(ctx, &batch)
		if _, err = br.Exec(); err == nil {
			rows, err = br.Query()
		}
	} else {
		rows, err = c.tx.Query(ctx, st.text, st.args(&b)...)
	}
	found, err := q.read(ctx, c, rows, br, err)
	if err != nil || !found {
		return nil, false, err
	}
	if q.transactional {
		return &txLockedClaim{c}, true, nil
	}
	return c, true, nil
}

// claimStmt is the claim's statement and its arguments: the plain claim, or the one
// passing over the rows set aside.
func (q *rowLockQueue) claimStmt(now time.Time) (stmt, bind) {
	b := q.bind()
	b.now = now
	if b.skip = q.skip.list(); b.skip != nil {
		return q.claimSkip, b
	}
	return q.claim, b
}

// read takes the claim's row into c from rows, the claim's answer (err, its error), and
// closes rows and br, the batch it came in, if any. It ends c when the claim failed or
// found no row.
func (q *rowLockQueue) read(ctx context.Context, c *lockedClaim, rows pgx.Rows, br pgx.BatchResults, err error) (bool, error) {
	found := false
	if err == nil {
		if found = rows.Next(); found {
			c.row, err = q.scanRow(rows, false)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if br != nil {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		c.end(ctx)
		return false, q.errorf("claim", err)
	}
	if !found {
		if err := c.end(ctx); err != nil {
			return false, q.errorf("claim", err)
		}
	}
	return found, nil
}

// lockedClaim is an open claim transaction holding one row on one pool connection.
type lockedClaim struct {
	q   *rowLockQueue
	row dialects.Row
	// tx is the claim transaction, set once: a pgx.Tx when opened eagerly (begin), a
	// connTx when its BEGIN went with the claim.
	tx claimTx
	// from is the queue whose claim this is (a FIFO queue's claims take its guard):
	// SettleAndClaim claims from it again.
	from dialects.RowLockQueue

	// mu serialises Settle and Rollback: a connection runs one statement at a time, and
	// the first of them to end the transaction releases the connection.
	mu   sync.Mutex
	conn *pgxpool.Conn // nil once released or closed
}

var _ dialects.LockedClaim = (*lockedClaim)(nil)

var errClaimEnded = errors.New("the claim transaction has already ended")

func (c *lockedClaim) Row() dialects.Row { return c.row }

// Settle runs the step's statement in the claim transaction and commits; a step with
// nothing to write (Retry without an attempt column, Release) rolls back instead. In a
// transactional claim the commit carries the handler's writes too (those a
// RollbackToSavepoint left).
func (c *lockedClaim) Settle(ctx context.Context, step dialects.Step) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.q
	if c.conn == nil {
		return q.errorf(step.Kind.String(), errClaimEnded)
	}
	if step.Event != "" {
		return c.settleEvent(ctx, step)
	}
	st, err := q.settle.pick(step)
	if err != nil {
		c.end(ctx)
		return q.errorf(step.Kind.String(), err)
	}
	op := step.Kind.String()
	if st.text == "" {
		if err := c.end(ctx); err != nil {
			return q.errorf(op, err)
		}
		return nil
	}
	if err := settleable(c.conn); err != nil {
		// The handler ended the transaction itself, or the server aborted it: the row
		// lock went with it (or the transaction can only roll back), so the settlement
		// no longer holds the row.
		c.end(ctx)
		return q.errorf(op, err)
	}
	b := q.stepBind(step, c.row.ID)
	if ct, ok := c.tx.(*connTx); ok {
		if err := ct.execCommit(ctx, st.text, st.args(&b)...); err != nil {
			c.end(ctx)
			return q.errorf(op, ended(err))
		}
		endConn(c.conn, nil)
		c.conn = nil
		return nil
	}
	if _, err := c.tx.Exec(ctx, st.text, st.args(&b)...); err != nil {
		c.end(ctx)
		return q.errorf(op, ended(err))
	}
	// pgx reports ErrTxCommitRollback when the server answers ROLLBACK to the COMMIT of a
	// failed transaction.
	if err := c.tx.Commit(ctx); err != nil {
		c.end(ctx)
		return q.errorf(op+" commit", ended(err))
	}
	endConn(c.conn, nil)
	c.conn = nil
	return nil
}

// settleEvent runs the step's event in the claim transaction and commits. The caller
// holds mu.
func (c *lockedClaim) settleEvent(ctx context.Context, step dialects.Step) error {
	q := c.q
	op := "event " + step.Event
	if err := settleable(c.conn); err != nil {
		c.end(ctx)
		return q.errorf(op, err)
	}
	if _, err := q.runEvent(ctx, c.tx, step, c.row.ID); err != nil {
		c.end(ctx)
		return ended(err)
	}
	if err := c.tx.Commit(ctx); err != nil {
		c.end(ctx)
		return q.errorf(op+" commit", ended(err))
	}
	endConn(c.conn, nil)
	c.conn = nil
	return nil
}

// Rollback ends the transaction unsettled; the row returns at once.
func (c *lockedClaim) Rollback(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	if err := c.end(ctx); err != nil {
		return c.q.errorf("rollback", err)
	}
	return nil
}

// end rolls the transaction back and releases the connection. When the rollback fails
// the connection is closed instead, so the server rolls back itself; the error is
// returned. The caller holds mu (or owns the claim alone).
func (c *lockedClaim) end(ctx context.Context) error {
	if c.conn == nil {
		return nil
	}
	err := rollbackConn(ctx, c.conn, c.tx)
	c.conn = nil
	return err
}

// txLockedClaim is a transactional subscription's claim: it lends the claim transaction
// to the handler, with a savepoint to discard the handler's writes and keep the row.
type txLockedClaim struct {
	*lockedClaim
}

var _ dialects.TxLockedClaim = (*txLockedClaim)(nil)

// savepoint is set right after the claim; a retry rolls back to it.
const savepoint = "rowactor_claim"

// Tx returns the claim's pgx.Tx. The handler runs its queries on it and never ends it:
// Settle commits it, Rollback and the other steps roll it back.
func (c *txLockedClaim) Tx() any { return c.tx }

// SQLTx returns the claim's transaction as a *sql.Tx until end (see lend).
func (c *txLockedClaim) SQLTx() (*sql.Tx, func()) { return c.q.d.lend(c.tx.(pgx.Tx)) }

// Interrupt ends the claim while its handler may still be using the lent transaction
// (see sever): the server rolls it back and the row's lock goes with it. Later calls end
// nothing more.
func (c *txLockedClaim) Interrupt(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := sever(c.conn)
	c.conn = nil
	if err != nil {
		return c.q.errorf("interrupt", err)
	}
	return nil
}

// Savepoint sets the savepoint rowactor_claim.
func (c *txLockedClaim) Savepoint(ctx context.Context) error {
	return c.run(ctx, "savepoint", "SAVEPOINT "+savepoint)
}

// RollbackToSavepoint discards the handler's writes (and clears a failed statement's
// error) and keeps the row locked; the savepoint stays for another rollback.
func (c *txLockedClaim) RollbackToSavepoint(ctx context.Context) error {
	return c.run(ctx, "rollback to savepoint", "ROLLBACK TO SAVEPOINT "+savepoint)
}

// run runs a statement in the open claim transaction. A failure leaves the claim open:
// the caller ends it with Rollback (a failed statement has spoilt the transaction).
func (c *txLockedClaim) run(ctx context.Context, op, text string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return c.q.errorf(op, errClaimEnded)
	}
	if err := inTx(c.conn); err != nil {
		return c.q.errorf(op, err)
	}
	if _, err := c.tx.Exec(ctx, text); err != nil {
		return c.q.errorf(op, err)
	}
	return nil
}

// closeConn takes a connection out of its pool and closes it: the server ends its
// session, rolling back its transaction and releasing its locks.
func closeConn(conn *pgxpool.Conn) error {
	raw := conn.Hijack()
	ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
	defer cancel()
	return raw.Close(ctx)
}

var _ dialects.ChainingClaim = (*lockedClaim)(nil)

// SettleAndClaim settles and claims the next row in one round trip (dialects.ChainingClaim):
// the settlement's statement (or ROLLBACK, for a step with nothing to write), COMMIT,
// BEGIN and the claim, in one pipeline with one Sync. A statement that fails makes the
// server skip the rest, so no claim is made unless the settlement committed. A claim
// whose transaction began eagerly (transactional, FIFO) or a step with an event of its
// own settles first and then claims on a connection of its own, as ClaimLocked does.
func (c *lockedClaim) SettleAndClaim(ctx context.Context, step dialects.Step, now time.Time) (dialects.LockedClaim, error, error) {
	q := c.q
	ct, lazy := c.tx.(*connTx)
	st, perr := q.settle.pick(step)
	if !lazy || step.Event != "" || perr != nil {
		if err := c.Settle(ctx, step); err != nil {
			return nil, err, nil
		}
		next, ok, err := c.from.ClaimLocked(ctx, now)
		if !ok {
			next = nil
		}
		return next, nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	op := step.Kind.String()
	if c.conn == nil {
		return nil, q.errorf(op, errClaimEnded), nil
	}
	if err := settleable(c.conn); err != nil {
		c.end(ctx)
		return nil, q.errorf(op, err), nil
	}
	var batch pgx.Batch
	end := "COMMIT"
	if st.text != "" {
		b := q.stepBind(step, c.row.ID)
		batch.Queue(st.text, st.args(&b)...)
	} else {
		end = "ROLLBACK"
	}
	batch.Queue(end)
	batch.Queue(q.beginText)
	claim, b := q.claimStmt(now)
	batch.Queue(claim.text, claim.args(&b)...)
	br := c.conn.SendBatch(ctx, &batch)
	if st.text != "" {
		if _, err := br.Exec(); err != nil {
			// The server skipped the rest: the transaction is aborted, left to a ROLLBACK.
			_ = br.Close()
			c.end(ctx)
			return nil, q.errorf(op, ended(err)), nil
		}
	}
	ct.done = true
	tag, err := br.Exec()
	if err == nil && end == "COMMIT" && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	if err != nil {
		// The COMMIT failed, and the server skipped the claim; or it answered ROLLBACK,
		// and whatever the claim took goes back with the connection.
		_ = br.Close()
		endConn(c.conn, err)
		c.conn = nil
		return nil, q.errorf(op+" commit", ended(err)), nil
	}
	// Settled. The claim's transaction is a new lockedClaim on the same connection.
	next := &lockedClaim{q: q, from: c.from, conn: c.conn, tx: &connTx{conn: c.conn.Conn()}}
	c.conn = nil
	var rows pgx.Rows
	if _, err = br.Exec(); err == nil {
		rows, err = br.Query()
	}
	found, err := q.read(ctx, next, rows, br, err)
	if err != nil {
		return nil, nil, err
	}
	if !found {
		return nil, nil, nil
	}
	return next, nil, nil
}
