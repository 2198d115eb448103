package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

type leaseQueue struct {
	queue
	claim  stmt
	extend stmt // $1 until, $2 ids, $3 tokens
}

var _ dialects.LeaseQueue = (*leaseQueue)(nil)

func newLeaseQueue(base queue, t dialects.Table) *leaseQueue {
	tq, id, lu := quote(t.Name), quote(t.ID), quote(t.LockedUntil)
	var w builder
	// One statement, one commit: c locks the claimable rows (skipping rows another claim
	// holds), s stamps the lease and counts the attempt, and the result is c's rows as
	// they were before the count. At read committed a row updated meanwhile is re-checked
	// against the claimable condition when c locks it.
	w.w("WITH c AS (SELECT ", rowColumns(t, "", quote(t.Attempt)), " FROM ", tq,
		" WHERE ", claimable(&w, t, "", true),
		" ORDER BY ", id, " LIMIT ", w.p(pLimit), " FOR UPDATE SKIP LOCKED), s AS (UPDATE ", tq,
		" AS u SET ", lu, " = ", w.p(pUntil))
	if t.Attempt != "" {
		w.w(", ", quote(t.Attempt), " = u.", quote(t.Attempt), " + 1")
	}
	w.w(" FROM c WHERE u.", id, " = c.", id, ") SELECT ", rowColumns(t, "c", "c."+quote(t.Attempt)),
		" FROM c ORDER BY c.", id)
	return &leaseQueue{
		queue: base,
		claim: w.stmt(),
		extend: stmt{text: "UPDATE " + tq + " AS u SET " + lu + " = $1 FROM unnest($2::bigint[], $3::timestamptz[]) AS h(id, held)" +
			" WHERE u." + id + " = h.id AND u." + lu + " = h.held RETURNING u." + id},
	}
}

func (q *leaseQueue) ClaimLeases(ctx context.Context, now, until time.Time, limit int) ([]dialects.Row, error) {
	if limit <= 0 {
		return nil, nil
	}
	b := q.bind()
	b.now, b.until, b.limit = now, until, int64(limit)
	rows, err := q.d.pool.Query(ctx, q.claim.text, q.claim.args(&b)...)
	if err != nil {
		return nil, q.errorf("claim", err)
	}
	defer rows.Close()
	var out []dialects.Row
	for rows.Next() {
		r, err := q.scanRow(rows, false)
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

// ExtendLeases moves every lease still holding its token in one statement, whatever
// their number: the ids and tokens travel as two arrays.
func (q *leaseQueue) ExtendLeases(ctx context.Context, until time.Time, held []dialects.Lease) ([]int64, error) {
	if len(held) == 0 {
		return nil, nil
	}
	ids := make([]int64, len(held))
	tokens := make([]time.Time, len(held))
	for i, l := range held {
		ids[i], tokens[i] = l.ID, l.Token
	}
	rows, err := q.d.pool.Query(ctx, q.extend.text, until, ids, tokens)
	if err != nil {
		return nil, q.errorf("extend", err)
	}
	defer rows.Close()
	var moved []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, q.errorf("extend", err)
		}
		moved = append(moved, id)
	}
	if err := rows.Err(); err != nil {
		return nil, q.errorf("extend", err)
	}
	return moved, nil
}

// SettleLease runs the step's statement fenced by the token; false when the row holds
// another token (or is gone), with nothing changed.
func (q *leaseQueue) SettleLease(ctx context.Context, step dialects.Step, held dialects.Lease) (bool, error) {
	b := q.bind()
	b.id, b.token, b.now, b.at = held.ID, held.Token, step.Now, step.At
	s := &q.settle
	db := q.d.pool
	switch step.Kind {
	case dialects.StepAck:
		return q.exec(ctx, db, "ack", s.ack, &b)
	case dialects.StepRetry, dialects.StepRelease:
		return q.exec(ctx, db, step.Kind.String(), s.release, &b)
	case dialects.StepRetryAfter:
		if s.retryAfter.text == "" {
			return false, q.errorf("retry_after", errNoRetryAfter)
		}
		return q.exec(ctx, db, "retry_after", s.retryAfter, &b)
	case dialects.StepDeadLetter:
		dl, err := s.deadLetter()
		if err != nil {
			return false, q.errorf("dead-letter", err)
		}
		// The move's command tag counts the rows inserted, which are the rows deleted.
		return q.exec(ctx, db, "dead-letter", dl, &b)
	}
	return false, q.errorf("settle", fmt.Errorf("unknown step %v", step.Kind))
}
