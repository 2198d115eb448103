package mysql

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var _ dialects.RowLockBatchQueue = (*rowLockQueue)(nil)

// ClaimLockedBatch opens a claim transaction at the table's level and locks up to limit
// due rows; the transaction stays open until the batch's Settle or Rollback.
func (q *rowLockQueue) ClaimLockedBatch(ctx context.Context, now time.Time, limit int) (dialects.LockedBatch, bool, error) {
	if limit <= 0 {
		return nil, false, nil
	}
	text, skip := q.claimN, q.skip.list()
	if skip != "" {
		text = q.claimNSkip
	}
	b, err := withRetry(ctx, func() (*lockedBatch, error) { return q.claimBatchOnce(ctx, text, skip, now, limit) })
	if err != nil {
		return nil, false, q.errorf("claim batch", err)
	}
	if b == nil {
		return nil, false, nil
	}
	return b, true, nil
}

// claimBatchOnce runs one batch claim; skip, when set, is the list of ids set aside that
// text (claimNSkip) binds before the limit.
func (q *rowLockQueue) claimBatchOnce(ctx context.Context, text, skip string, now time.Time, limit int) (*lockedBatch, error) {
	x, err := q.d.begin(ctx, q.level)
	if err != nil {
		return nil, err
	}
	sel, err := q.d.stmt(ctx, text)
	if err != nil {
		_ = x.rollback()
		return nil, err
	}
	args := q.cl.args(nil, q.group, now)
	if skip != "" {
		args = append(args, skip)
	}
	rows, err := x.tx.StmtContext(ctx, sel).QueryContext(ctx, append(args, limit)...)
	if err != nil {
		_ = x.rollback()
		return nil, err
	}
	b := &lockedBatch{q: q, x: x}
	for rows.Next() {
		r, err := q.scanRow(rows)
		if err != nil {
			rows.Close()
			_ = x.rollback()
			return nil, err
		}
		b.rows = append(b.rows, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		_ = x.rollback()
		return nil, err
	}
	if len(b.rows) == 0 {
		return nil, x.rollback()
	}
	return b, nil
}

// lockedBatch is an open claim transaction holding several rows.
type lockedBatch struct {
	q    *rowLockQueue
	x    *txn
	rows []dialects.Row

	mu    sync.Mutex
	ended bool
}

func (b *lockedBatch) Rows() []dialects.Row { return b.rows }

// Settle runs each row's step in the claim transaction and commits once; a failed
// statement rolls everything back.
func (b *lockedBatch) Settle(ctx context.Context, steps []dialects.Step) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.q
	if b.ended {
		return q.errorf("settle batch", errEnded)
	}
	b.ended = true
	if len(steps) != len(b.rows) {
		return q.errorf("settle batch", errors.Join(fmt.Errorf("%d steps for %d rows", len(steps), len(b.rows)), b.x.rollback()))
	}
	for i, step := range steps {
		if step.Kind == dialects.StepRelease && step.Event == "" {
			continue
		}
		id := b.rows[i].ID
		op, text, args, move, err := q.statement(step, id)
		switch {
		case err != nil:
		case move:
			var moved bool
			if moved, err = q.move(ctx, b.x.tx, args); err == nil && !moved {
				err = fmt.Errorf("row %d was not moved: the copy or the delete changed no row", id)
			}
		case text == "":
			continue
		default:
			s, serr := b.x.stmt(ctx, text)
			if err = serr; err == nil {
				_, err = s.ExecContext(ctx, args...)
			}
		}
		if err != nil {
			return q.errorf(op+" in batch", errors.Join(err, b.x.rollback()))
		}
	}
	if err := b.x.commit(); err != nil {
		return q.errorf("settle batch commit", err)
	}
	return nil
}

// Rollback ends the transaction unsettled; every row returns at once.
func (b *lockedBatch) Rollback(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return nil
	}
	b.ended = true
	if err := b.x.rollback(); err != nil {
		return b.q.errorf("rollback batch", err)
	}
	return nil
}
