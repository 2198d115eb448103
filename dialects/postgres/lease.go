package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

type leaseQueue struct {
	queue
	claim  stmt
	extend stmt // $1 until, $2 ids, $3 tokens
	// extendWait is extend waiting for rows another session has locked: $1 until, $2
	// ids, $3 tokens.
	extendWait stmt
	confirm    string // $1 id, $2 token: locks the row if it holds the token
	batch      batchSQL
	guard      stmt // FIFO tables: the group guard; claim is then the head claim (fifo.go)

	hasProcessedAt bool
}

var _ dialects.LeaseQueue = (*leaseQueue)(nil)

func newLeaseQueue(base queue, t dialects.Table) *leaseQueue {
	tq, id, lu := quote(t.Name), quote(t.ID), quote(t.LockedUntil)
	var w builder
	// One statement, one commit: c locks the claimable rows (skipping rows another claim
	// holds), s stamps the lease and counts the attempt, and the result is c's rows as
	// they were before the count. At read committed a row updated meanwhile is re-checked
	// against the claimable condition when c locks it.
	prio := ""
	if t.Priority != "" {
		prio = ", " + quote(t.Priority) // c keeps it to hand the rows out in claim order
	}
	w.w("WITH c AS (SELECT ", rowColumns(t, "", quote(t.Attempt)), prio, " FROM ", tq,
		" WHERE ", claimable(&w, t, "", true),
		" ORDER BY ", t.ClaimOrder(quote, ""), " LIMIT ", w.p(pLimit), " FOR UPDATE SKIP LOCKED), s AS (UPDATE ", tq,
		" AS u SET ", lu, " = ", w.p(pUntil))
	if t.Attempt != "" {
		w.w(", ", quote(t.Attempt), " = ", sqlpart.CountAttempt("u."+quote(t.Attempt), base.attemptMax))
	}
	w.w(" FROM c WHERE u.", id, " = c.", id, ") SELECT ", rowColumns(t, "c", "c."+quote(t.Attempt)),
		" FROM c ORDER BY ", t.ClaimOrder(quote, "c"))
	return &leaseQueue{
		queue:   base,
		claim:   w.stmt(),
		confirm: confirmText(t),
		batch:   buildBatch(t),

		hasProcessedAt: t.ProcessedAt != "",
		extend: stmt{text: lockedHolding(t, "$2", "$3", "NO KEY UPDATE") + "UPDATE " + tq + " AS u SET " + lu + " = $1 FROM l WHERE u." + id +
			" = l.id RETURNING u." + id},
		extendWait: stmt{text: "UPDATE " + tq + " AS u SET " + lu + " = $1 FROM unnest($2::bigint[], $3::timestamptz[]) AS h(id, held)" +
			" WHERE u." + id + " = h.id AND u." + lu + " = h.held RETURNING u." + id},
	}
}

func (q *leaseQueue) ClaimLeases(ctx context.Context, now, until time.Time, limit int) ([]dialects.Row, error) {
	if limit <= 0 {
		return nil, nil
	}
	if err := checkExpiry(now, until); err != nil {
		return nil, q.errorf("claim", err)
	}
	if q.guard.text != "" {
		return q.claimHead(ctx, now, until)
	}
	b := q.bind()
	b.now, b.until, b.limit = now, until, int64(limit)
	rows, err := q.d.pool.Query(ctx, q.claim.text, q.claim.args(&b)...)
	if err != nil {
		return nil, q.errorf("claim", err)
	}
	defer rows.Close()
	var out []dialects.Row
	sc := q.rowScanner(false)
	for rows.Next() {
		r, err := sc.scan(rows)
		if err != nil {
			return nil, q.errorf("claim", err)
		}
		r.Token = until
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, q.errorf("claim", err)
	}
	return out, nil
}

// checkExpiry refuses a claim whose lease would not end after now, as stored (timestamptz
// keeps microseconds, and pgx truncates to them). A claim takes only rows whose lease
// ended at or before now, so an expiry after now makes each claim of a row write a token
// later than the one it replaces: no two deliveries of a row ever hold the same token.
func checkExpiry(now, until time.Time) error {
	u, n := until.Truncate(time.Microsecond), now.Truncate(time.Microsecond)
	if !u.After(n) {
		return fmt.Errorf("the lease expiry %s is not after now %s", u.UTC().Format(time.RFC3339Nano), n.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// ExtendLeases moves every lease still holding its token in one statement, whatever
// their number: the ids and tokens travel as two arrays. The statement skips rows another
// session holds locked, since waiting for one would keep every other lease of the round
// from moving; those still holding their tokens are reported in a *dialects.RowsBusyError.
func (q *leaseQueue) ExtendLeases(ctx context.Context, until time.Time, held []dialects.Lease) ([]int64, error) {
	if len(held) == 0 {
		return nil, nil
	}
	if ev, own := q.events[dialects.EventExtend]; own {
		return q.extendEach(ctx, ev, until, held)
	}
	ids, tokens := leaseArrays(held)
	moved, err := q.queryIDs(ctx, q.extend.text, until, ids, tokens)
	if err != nil {
		return nil, q.errorf("extend", err)
	}
	// A failed read says nothing of which leases were lost: the round fails, and the
	// leases it did not move keep their tokens until the next.
	busy, err := q.busyOf(ctx, held, moved)
	if err != nil {
		return moved, q.errorf("extend: read the rows skipped", err)
	}
	if len(busy) > 0 {
		return moved, &dialects.RowsBusyError{IDs: busy}
	}
	return moved, nil
}

// SettleLease runs the step's statement fenced by the token; false when the row holds
// another token (or is gone), with nothing changed.
//
// The statement may wait for a row another session holds, so a step that decides the
// row's fate runs in a transaction of its own (waiting), as a step with an event does:
// one cut short (a Shutdown whose context ended) changes nothing, then or later. In
// autocommit the orphan, which pgx leaves to a best-effort cancel request, would commit
// once the other session let the row go, after its caller was told the settlement was
// cut. A release stays one statement: Shutdown gives rows back by the dozen within its
// budget, and a release that takes effect late only returns its row before its lease
// runs out.
func (q *leaseQueue) SettleLease(ctx context.Context, step dialects.Step, held dialects.Lease) (bool, error) {
	if step.Event != "" {
		return q.settleEvent(ctx, step, held)
	}
	if step.Kind == dialects.StepRelease {
		return q.settleOn(ctx, q.d.pool, step, held)
	}
	return q.SettleLeaseWaiting(ctx, step, held)
}

// settleOn runs SettleLease's statement on db: the pool, or a delivery's transaction.
func (q *leaseQueue) settleOn(ctx context.Context, db querier, step dialects.Step, held dialects.Lease) (bool, error) {
	op := step.Kind.String()
	st, err := q.settle.pick(step)
	if err == nil && st.text == "" {
		err = fmt.Errorf("no statement for step %v", step.Kind)
	}
	if err != nil {
		return false, q.errorf(op, err)
	}
	b := q.stepBind(step, held.ID)
	b.token = held.Token
	// A move's command tag counts the rows inserted, which are the rows deleted.
	return q.exec(ctx, db, op, st, &b)
}

// txLeaseQueue is a transactional subscription's lease queue: the claim has committed
// already, so each delivery opens a transaction of its own for the handler. Open refuses a
// transactional lease table at repeatable read or serializable.
type txLeaseQueue struct {
	*leaseQueue
}

var _ dialects.TxLeaseQueue = (*txLeaseQueue)(nil)

// BeginDelivery acquires a pool connection and opens a transaction on it at the table's
// isolation level (plain BEGIN when none is declared). The connection stays with the
// transaction until SettleLease or Rollback ends it.
func (q *txLeaseQueue) BeginDelivery(ctx context.Context) (dialects.LeaseTx, error) {
	conn, err := q.d.pool.Acquire(ctx)
	if err != nil {
		return nil, q.errorf("begin", err)
	}
	tx, err := conn.BeginTx(ctx, q.txOptions)
	if err != nil {
		endConn(conn, err)
		return nil, q.errorf("begin", err)
	}
	return &leaseTx{q: q.leaseQueue, tx: tx, conn: conn}, nil
}

// leaseTx is a lease delivery's transaction on a pool connection of its own.
type leaseTx struct {
	q  *leaseQueue
	tx pgx.Tx // set once

	// mu serialises SettleLease and Rollback; the first to end the transaction gives the
	// connection up.
	mu   sync.Mutex
	conn *pgxpool.Conn // nil once released or closed
}

var _ dialects.LeaseTx = (*leaseTx)(nil)

// Tx returns the pgx.Tx. The handler runs its queries on it and never ends it.
func (l *leaseTx) Tx() any { return l.tx }

// SQLTx returns the transaction as a *sql.Tx until end (see lend).
func (l *leaseTx) SQLTx() (*sql.Tx, func()) { return l.q.d.lend(l.tx) }

// SettleLease runs the queue's fenced statement inside the transaction. When it changed
// the row (the row still held the token) the transaction commits, the handler's writes
// with it; otherwise it rolls back, the handler's writes included, and reports false. A
// failed statement or commit rolls back and returns the error. Either way the transaction
// is over and the connection given up.
func (l *leaseTx) SettleLease(ctx context.Context, step dialects.Step, held dialects.Lease) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.q
	op := step.Kind.String()
	if l.conn == nil {
		return false, q.errorf(op, errTxEnded)
	}
	if err := settleable(l.conn); err != nil {
		l.end(ctx)
		return false, q.errorf(op, err)
	}
	var (
		changed bool
		err     error
	)
	if step.Event != "" {
		changed, err = q.leaseEvent(ctx, l.tx, step, held)
	} else {
		changed, err = q.settleOn(ctx, l.tx, step, held)
	}
	if err != nil {
		l.end(ctx)
		return false, ended(err)
	}
	if !changed {
		// The lease is lost: nothing of the delivery may commit.
		if err := l.end(ctx); err != nil {
			return false, q.errorf(op+" rollback", err)
		}
		return false, nil
	}
	if err := l.tx.Commit(ctx); err != nil {
		l.end(ctx)
		return false, q.errorf(op+" commit", ended(err))
	}
	endConn(l.conn, nil)
	l.conn = nil
	return true, nil
}

// Rollback discards the transaction and gives the connection up; a no-op once it ended.
func (l *leaseTx) Rollback(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return nil
	}
	if err := l.end(ctx); err != nil {
		return l.q.errorf("rollback", err)
	}
	return nil
}

// Interrupt ends the transaction while its handler may still be using it (see sever); the
// lease is the caller's to release. Later calls end nothing more.
func (l *leaseTx) Interrupt(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return nil
	}
	err := sever(l.conn)
	l.conn = nil
	if err != nil {
		return l.q.errorf("interrupt", err)
	}
	return nil
}

// end rolls back and gives the connection up: to the pool, or closed when the rollback
// failed. The caller holds mu.
func (l *leaseTx) end(ctx context.Context) error {
	if l.conn == nil {
		return nil
	}
	err := rollbackConn(ctx, l.conn, l.tx)
	l.conn = nil
	return err
}
