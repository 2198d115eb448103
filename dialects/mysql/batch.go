package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var _ dialects.LeaseBatchQueue = (*leaseQueue)(nil)

// batchSQL are the lease form's batched settlements. Neither MySQL nor MariaDB can return
// the rows an UPDATE changed (nor MySQL those a DELETE removed), so a batch is a READ
// COMMITTED transaction: a locking read of the rows that still hold their tokens, the ack
// or release of the ids it found, and a commit. The read's locks keep every row it found
// on its token until the commit; the rows it did not find are not touched.
type batchSQL struct {
	// lock reads which rows hold their tokens, and locks them, skipping rows another
	// session has locked: (id, token) pairs.
	lock inList
	// holding reads, without locking or waiting, which rows hold their tokens: (id,
	// token) pairs. It tells the rows lock skipped that are still ours (busy) from those
	// that lost their leases.
	holding inList
	// lockWait is lock without skipping: it waits for rows another session has locked
	// (ExtendLeasesWaiting).
	lockWait inList
	// ack mirrors the single-row ack: DELETE, or, with a processed_at column,
	// processed_at = now and the lease cleared ([now,] ids).
	ack    inList
	ackNow bool
	// release clears the lease: ids.
	release inList
}

func newBatchSQL(t dialects.Table) *batchSQL {
	tq, id, lu := quote(t.Name), quote(t.ID), quote(t.LockedUntil)
	where := " WHERE " + id + " IN ("
	b := &batchSQL{
		lock: inList{prefix: "SELECT " + id + " FROM " + tq + " WHERE (" + id + ", " + lu + ") IN (", item: "(?,?)",
			suffix: ") FOR UPDATE SKIP LOCKED"},
		holding: inList{prefix: "SELECT " + id + " FROM " + tq + " WHERE (" + id + ", " + lu + ") IN (", item: "(?,?)",
			suffix: ")"},
		lockWait: inList{prefix: "SELECT " + id + " FROM " + tq + " WHERE (" + id + ", " + lu + ") IN (", item: "(?,?)",
			suffix: ") FOR UPDATE"},
		release: inList{prefix: "UPDATE " + tq + " SET " + lu + " = NULL" + where, item: "?", suffix: ")"},
	}
	if t.ProcessedAt != "" {
		clear := ""
		if t.Error != "" {
			clear = ", " + quote(t.Error) + " = NULL" // an ack clears a failed attempt's error
		}
		b.ack = inList{prefix: "UPDATE " + tq + " SET " + quote(t.ProcessedAt) + " = ?, " + lu + " = NULL" + t.ClearUniqueKey(quote) + clear + where, item: "?", suffix: ")"}
		b.ackNow = true
	} else {
		b.ack = inList{prefix: "DELETE FROM " + tq + where, item: "?", suffix: ")"}
	}
	return b
}

// texts lists the statements to prepare at Open (one item each).
func (b *batchSQL) texts() []string {
	return []string{b.lock.text(1), b.holding.text(1), b.ack.text(0), b.release.text(0)}
}

// SettleLeases acks or releases every lease in held whose row still holds its token, in
// one transaction (retried after a deadlock or a lock wait timeout, which rolled it back),
// and returns the ids it settled. A row holding another token, or gone, is left alone and
// missing from the result. A row another session has locked is skipped rather than waited
// for, since the wait would hold every other row of the batch locked with it: it is
// reported in a *dialects.RowsBusyError for the caller to try again. A batch of one runs
// the same transaction: SettleLease's single fenced statement would wait for such a lock,
// holding a pool connection meanwhile.
func (q *leaseQueue) SettleLeases(ctx context.Context, kind dialects.StepKind, now time.Time, held []dialects.Lease) ([]int64, error) {
	if len(held) == 0 {
		return nil, nil
	}
	var (
		list  *inList
		first []any
	)
	switch kind {
	case dialects.StepAck:
		list = &q.batch.ack
		if q.batch.ackNow {
			first = []any{dbTime(now)}
		}
	case dialects.StepRelease, dialects.StepRetry:
		list = &q.batch.release
	default:
		return nil, q.errorf("settle batch", fmt.Errorf("a %v step cannot be batched", kind))
	}
	settled, err := withRetry(ctx, func() ([]int64, error) { return q.settleOnce(ctx, list, first, held) })
	if err != nil {
		return nil, q.errorf(kind.String()+" batch", err)
	}
	// When the read of the skipped rows fails, every one is reported busy: the caller
	// settles each alone, fenced by its token, so a lost lease still changes nothing.
	if busy, _ := q.busyOf(ctx, held, settled); len(busy) > 0 {
		return settled, &dialects.RowsBusyError{IDs: busy}
	}
	return settled, nil
}

// busyOf returns the rows of held missing from done that still hold their tokens: rows
// the skipping locking read passed because another session held them. It reads without
// locking or waiting; on an error it returns every missing row with it.
func (q *leaseQueue) busyOf(ctx context.Context, held []dialects.Lease, done []int64) ([]int64, error) {
	missing := dialects.Missing(held, done)
	busy, err := q.holdingAll(ctx, missing)
	if err != nil {
		return dialects.IDs(missing), err
	}
	return busy, nil
}

// Holding reads which rows of held hold their tokens, one statement per maxList leases.
func (q *leaseQueue) Holding(ctx context.Context, held []dialects.Lease) ([]int64, error) {
	found, err := q.holdingAll(ctx, held)
	if err != nil {
		return nil, q.errorf("read leases", err)
	}
	return found, nil
}

func (q *leaseQueue) holdingAll(ctx context.Context, held []dialects.Lease) ([]int64, error) {
	var found []int64
	for start := 0; start < len(held); start += maxList {
		ids, err := q.holding(ctx, held[start:min(start+maxList, len(held))])
		if err != nil {
			return nil, err
		}
		found = append(found, ids...)
	}
	return found, nil
}

// settleOnce runs one batch transaction: the locking read of the rows holding their
// tokens, then list's statement on the ids found (first binding before them).
func (q *leaseQueue) settleOnce(ctx context.Context, list *inList, first []any, held []dialects.Lease) ([]int64, error) {
	x, err := q.d.begin(ctx, sql.LevelReadCommitted)
	if err != nil {
		return nil, err
	}
	done := false
	defer func() {
		if !done {
			_ = x.rollback()
		}
	}()
	var found []int64
	for start := 0; start < len(held); start += maxList {
		ids, err := q.lockHolding(ctx, x, held[start:min(start+maxList, len(held))])
		if err != nil {
			return nil, err
		}
		found = append(found, ids...)
	}
	if len(found) == 0 {
		done = true
		return nil, x.rollback()
	}
	slices.Sort(found)
	found = slices.Compact(found) // held may name a row twice, in two chunks
	for start := 0; start < len(found); start += maxList {
		ids := found[start:min(start+maxList, len(found))]
		slot, n := slotOf(len(ids))
		s, err := x.stmt(ctx, list.text(slot))
		if err != nil {
			return nil, err
		}
		args := make([]any, 0, len(first)+n)
		args = idArgs(append(args, first...), ids, n)
		changed, err := affected(s.ExecContext(ctx, args...))
		if err != nil {
			return nil, err
		}
		// Every row found is locked on its token, and the statement deletes it or
		// clears its lease: each one changes.
		if changed != int64(len(ids)) {
			return nil, fmt.Errorf("settled %d of the %d rows locked on their tokens", changed, len(ids))
		}
	}
	done = true
	if err := x.commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return found, nil
}

// lockHolding locks, in tx, the rows of held (at most maxList leases) that hold their
// tokens and that no other session has locked, and returns their ids.
func (q *leaseQueue) lockHolding(ctx context.Context, x *txn, held []dialects.Lease) ([]int64, error) {
	return q.lockPairs(ctx, x, &q.batch.lock, held)
}

// lockPairs runs list, a locking read of (id, token) pairs, in x.
func (q *leaseQueue) lockPairs(ctx context.Context, x *txn, list *inList, held []dialects.Lease) ([]int64, error) {
	return q.readPairs(ctx, list, held, x.stmt)
}

// holding reads, outside any transaction and without waiting for locks, which rows of
// held (at most maxList leases) hold their tokens.
func (q *leaseQueue) holding(ctx context.Context, held []dialects.Lease) ([]int64, error) {
	return q.readPairs(ctx, &q.batch.holding, held, q.d.stmt)
}

// readPairs runs list, a read of ids by (id, token) pairs, on held, with the statement
// stmt gives (a transaction's, or the pool's).
func (q *leaseQueue) readPairs(ctx context.Context, list *inList, held []dialects.Lease, stmt func(context.Context, string) (*sql.Stmt, error)) ([]int64, error) {
	slot, n := pairSlotOf(len(held))
	s, err := stmt(ctx, list.text(slot))
	if err != nil {
		return nil, err
	}
	args := make([]any, 0, 2*n)
	for i := range n {
		l := held[min(i, len(held)-1)]
		args = append(args, l.ID, dbTime(l.Token))
	}
	rs, err := s.QueryContext(ctx, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	ids := make([]int64, 0, len(held))
	for rs.Next() {
		var id int64
		if err := rs.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rs.Err()
}
