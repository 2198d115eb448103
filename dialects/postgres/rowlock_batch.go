package postgres

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor/dialects"
)

var _ dialects.RowLockBatchQueue = (*rowLockQueue)(nil)

// ClaimLockedBatch opens the claim transaction on a pool connection of its own and locks
// up to limit due rows. The connection stays with the batch until Settle or Rollback.
func (q *rowLockQueue) ClaimLockedBatch(ctx context.Context, now time.Time, limit int) (dialects.LockedBatch, bool, error) {
	if limit <= 0 {
		return nil, false, nil
	}
	conn, err := q.d.pool.Acquire(ctx)
	if err != nil {
		return nil, false, q.errorf("claim batch", err)
	}
	tx, err := conn.BeginTx(ctx, q.txOptions)
	if err != nil {
		endConn(conn, err)
		return nil, false, q.errorf("claim batch", err)
	}
	lb := &lockedBatch{q: q, conn: conn, tx: tx}
	b := q.bind()
	b.now, b.limit = now, int64(limit)
	st := q.claimN
	if b.skip = q.skip.list(); b.skip != nil {
		st = q.claimNSkip
	}
	rows, err := tx.Query(ctx, st.text, st.args(&b)...)
	if err != nil {
		lb.end(ctx)
		return nil, false, q.errorf("claim batch", err)
	}
	sc := q.rowScanner(false)
	for rows.Next() {
		r, serr := sc.scan(rows)
		if serr != nil {
			err = serr
			break
		}
		lb.rows = append(lb.rows, r)
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		lb.end(ctx)
		return nil, false, q.errorf("claim batch", err)
	}
	if len(lb.rows) == 0 {
		if rerr := lb.end(ctx); rerr != nil {
			return nil, false, q.errorf("claim batch", rerr)
		}
		return nil, false, nil
	}
	return lb, true, nil
}

// lockedBatch is an open claim transaction holding several rows on one connection.
type lockedBatch struct {
	q    *rowLockQueue
	rows []dialects.Row
	tx   pgx.Tx

	mu   sync.Mutex
	conn *pgxpool.Conn // nil once released or closed
}

func (lb *lockedBatch) Rows() []dialects.Row { return lb.rows }

// Settle runs each row's step in the claim transaction and commits once.
func (lb *lockedBatch) Settle(ctx context.Context, steps []dialects.Step) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	q := lb.q
	if lb.conn == nil {
		return q.errorf("settle batch", errClaimEnded)
	}
	if len(steps) != len(lb.rows) {
		lb.end(ctx)
		return q.errorf("settle batch", fmt.Errorf("%d steps for %d rows", len(steps), len(lb.rows)))
	}
	for i, step := range steps {
		if err := lb.run(ctx, step, lb.rows[i].ID); err != nil {
			lb.end(ctx)
			return err
		}
	}
	if err := lb.tx.Commit(ctx); err != nil {
		lb.end(ctx)
		return q.errorf("settle batch commit", err)
	}
	endConn(lb.conn, nil)
	lb.conn = nil
	return nil
}

// run runs one row's step, as lockedClaim.Settle would, without ending the transaction.
func (lb *lockedBatch) run(ctx context.Context, step dialects.Step, id int64) error {
	q := lb.q
	if step.Event != "" {
		_, err := q.runEvent(ctx, lb.tx, step, id)
		return err
	}
	st, err := q.settle.pick(step)
	if err != nil {
		return q.errorf(step.Kind.String(), err)
	}
	if st.text == "" {
		return nil
	}
	b := q.stepBind(step, id)
	if _, err := lb.tx.Exec(ctx, st.text, st.args(&b)...); err != nil {
		return q.errorf(step.Kind.String(), err)
	}
	return nil
}

// Rollback ends the transaction unsettled; every row returns at once.
func (lb *lockedBatch) Rollback(ctx context.Context) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if err := lb.end(ctx); err != nil {
		return lb.q.errorf("rollback batch", err)
	}
	return nil
}

// end rolls back and releases the connection (closed when the rollback failed). The
// caller holds mu.
func (lb *lockedBatch) end(ctx context.Context) error {
	if lb.conn == nil {
		return nil
	}
	err := rollbackConn(ctx, lb.conn, lb.tx)
	lb.conn = nil
	return err
}
