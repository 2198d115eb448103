package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

// FIFO groups (Table.FIFO), in the row lock and lease forms.
//
// A group's head is its unfinished row (not processed; dead letters have left the group)
// with the lowest id, whatever its retry_after. A claim takes the head alone, only if it is
// due, and (lease form) only while no row of the group holds an unexpired lease. So a head
// not yet due (published with a delay, or answered RetryAfter) holds its whole group until
// its time, and order holds across retries. The head subselect takes no lock, so a head in
// work stays the head and the claim comes back empty rather than handing out the row
// behind it.
//
// Every claim runs in a transaction whose first statement is the group guard, a
// transaction-scoped advisory lock on hashtextextended('<table>:' || group, 0), taken
// without waiting; a group held elsewhere ends the claim empty. In the row lock form the
// claim transaction stays open until the settlement, so the guard holds the group for the
// whole delivery (and keeps out a row published ahead of the head in work); in the lease
// form it holds for the claim's transaction, and the lease itself holds the group after
// it. Two groups whose hashes collide only wait for each other.

// fifoRowLockQueue is the row lock form's FIFO queue: its claim takes the guard, then the
// head. It serves single claims only (no batches: a group gives one row at a time).
type fifoRowLockQueue struct {
	q     *rowLockQueue // claim is the head claim
	guard stmt
}

func (fifoRowLockQueue) ClaimsHeadsOnly() {}

func (f fifoRowLockQueue) Close() error { return f.q.Close() }

// fifoLeaseQueue and fifoTxLeaseQueue mark the lease form's FIFO queues, whose leaseQueue
// has the head claim and the guard (ClaimLeases then runs claimHead).
type fifoLeaseQueue struct{ *leaseQueue }

func (fifoLeaseQueue) ClaimsHeadsOnly() {}

type fifoTxLeaseQueue struct{ *txLeaseQueue }

func (fifoTxLeaseQueue) ClaimsHeadsOnly() {}

var (
	_ dialects.FIFOQueue       = fifoRowLockQueue{}
	_ dialects.RowLockQueue    = fifoRowLockQueue{}
	_ dialects.FIFOQueue       = fifoLeaseQueue{}
	_ dialects.LeaseBatchQueue = fifoLeaseQueue{}
	_ dialects.FIFOQueue       = fifoTxLeaseQueue{}
	_ dialects.TxLeaseQueue    = fifoTxLeaseQueue{}
)

// guardSQL is the group guard: true when this transaction now holds the group.
func guardSQL(t dialects.Table) stmt {
	var w builder
	w.w("SELECT pg_try_advisory_xact_lock(hashtextextended(", literal(t.Name), " || ':' || ", w.p(pGroup), ", 0))")
	return w.stmt()
}

// headCond writes the condition that the row (unaliased) is its group's head: the
// group's unfinished row with the lowest id, due or not (the claim's due condition then
// leaves a delayed head, and with it the group, waiting).
func headCond(w *builder, t dialects.Table) {
	w.w(quote(t.ID), " = (SELECT h.", quote(t.ID), " FROM ", quote(t.Name), " AS h WHERE h.", quote(t.Group), " = ", w.p(pGroup))
	if t.ProcessedAt != "" {
		w.w(" AND h.", quote(t.ProcessedAt), " IS NULL")
	}
	w.w(" ORDER BY h.", quote(t.ID), " LIMIT 1)")
}

// newFIFORowLockQueue builds the row lock form's head claim and its guard. The head set
// aside in memory (Skip) is not taken: it holds its group.
func newFIFORowLockQueue(base queue, t dialects.Table) fifoRowLockQueue {
	claim := func(skip bool) stmt {
		var w builder
		w.w("SELECT ", rowColumns(t, "", quote(t.Attempt)), " FROM ", quote(t.Name), " WHERE ")
		headCond(&w, t)
		w.w(" AND ", claimable(&w, t, "", false))
		if skip {
			w.w(skipCond(&w, t))
		}
		w.w(" FOR UPDATE SKIP LOCKED")
		return w.stmt()
	}
	return fifoRowLockQueue{q: &rowLockQueue{queue: base, claim: claim(false), claimSkip: claim(true)}, guard: guardSQL(t)}
}

// Skip passes over a row set aside in memory: the group's head, it holds its group.
func (f fifoRowLockQueue) Skip(id int64) { f.q.Skip(id) }

// stmts are the statements Open prepares.
func (f fifoRowLockQueue) stmts() []stmt {
	return append(f.q.settle.all(), f.q.claim, f.q.claimSkip, f.guard)
}

// ClaimLocked opens the claim transaction, takes the group guard and locks the head if it
// is due. The transaction, and with it the guard, stays open until the settlement.
func (f fifoRowLockQueue) ClaimLocked(ctx context.Context, now time.Time) (dialects.LockedClaim, bool, error) {
	q := f.q
	c, err := q.begin(ctx, true) // the guard is the transaction's first statement
	if err != nil {
		return nil, false, err
	}
	c.from = f
	held, err := q.takeGuard(ctx, c.tx, f.guard)
	if err != nil || !held {
		if rerr := c.end(ctx); err == nil {
			err = rerr
		}
		if err != nil {
			return nil, false, q.errorf("claim", err)
		}
		return nil, false, nil // the group is in work elsewhere
	}
	return q.take(ctx, c, now)
}

// fifoLeaseClaim builds the lease form's head claim: the head, if it is due, unleased,
// and no other row of its group holds an unexpired lease; stamped and counted (up to
// attemptMax) as the other lease claims are.
func fifoLeaseClaim(t dialects.Table, attemptMax int64) stmt {
	tq, id, lu := quote(t.Name), quote(t.ID), quote(t.LockedUntil)
	var w builder
	w.w("WITH c AS (SELECT ", rowColumns(t, "", quote(t.Attempt)), " FROM ", tq, " WHERE ")
	headCond(&w, t)
	w.w(" AND ", claimable(&w, t, "", true), " AND NOT EXISTS (SELECT 1 FROM ", tq, " AS w WHERE w.", quote(t.Group), " = ", w.p(pGroup),
		" AND w.", lu, " > ", w.p(pNow))
	if t.ProcessedAt != "" {
		w.w(" AND w.", quote(t.ProcessedAt), " IS NULL")
	}
	w.w(") FOR UPDATE SKIP LOCKED), s AS (UPDATE ", tq, " AS u SET ", lu, " = ", w.p(pUntil))
	if t.Attempt != "" {
		w.w(", ", quote(t.Attempt), " = ", sqlpart.CountAttempt("u."+quote(t.Attempt), attemptMax))
	}
	w.w(" FROM c WHERE u.", id, " = c.", id, ") SELECT ", rowColumns(t, "c", "c."+quote(t.Attempt)), " FROM c")
	return w.stmt()
}

// takeGuard runs the group guard as the transaction's first statement.
func (q *queue) takeGuard(ctx context.Context, tx interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, guard stmt) (bool, error) {
	b := q.bind()
	var held bool
	if err := tx.QueryRow(ctx, guard.text, guard.args(&b)...).Scan(&held); err != nil {
		return false, err
	}
	return held, nil
}

// claimHead is ClaimLeases for a FIFO table: a read committed transaction on a connection
// of its own takes the guard, claims the head and commits.
func (q *leaseQueue) claimHead(ctx context.Context, now, until time.Time) ([]dialects.Row, error) {
	conn, err := q.d.pool.Acquire(ctx)
	if err != nil {
		return nil, q.errorf("claim", err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		endConn(conn, err)
		return nil, q.errorf("claim", err)
	}
	held, err := q.takeGuard(ctx, tx, q.guard)
	if err != nil || !held {
		if rerr := rollbackConn(ctx, conn, tx); err == nil {
			err = rerr
		}
		if err != nil {
			return nil, q.errorf("claim", err)
		}
		return nil, nil
	}
	b := q.bind()
	b.now, b.until = now, until
	rows, err := tx.Query(ctx, q.claim.text, q.claim.args(&b)...)
	if err != nil {
		_ = rollbackConn(ctx, conn, tx)
		return nil, q.errorf("claim", err)
	}
	var out []dialects.Row
	sc := q.rowScanner(false)
	for rows.Next() {
		r, err := sc.scan(rows)
		if err != nil {
			rows.Close()
			_ = rollbackConn(ctx, conn, tx)
			return nil, q.errorf("claim", err)
		}
		r.Token = until
		out = append(out, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		_ = rollbackConn(ctx, conn, tx)
		return nil, q.errorf("claim", err)
	}
	if err := tx.Commit(ctx); err != nil {
		_ = rollbackConn(ctx, conn, tx)
		return nil, q.errorf("claim commit", err)
	}
	endConn(conn, nil)
	return out, nil
}
