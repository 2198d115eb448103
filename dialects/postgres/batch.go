package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var _ dialects.LeaseBatchQueue = (*leaseQueue)(nil)

// batchSQL are the lease form's batched settlements: the ids and tokens travel as two
// arrays, joined to the table, and RETURNING names the rows that still held their tokens.
type batchSQL struct {
	ack     string // $1 ids, $2 tokens, $3 now (processed_at tables)
	release string // $1 ids, $2 tokens
}

func buildBatch(t dialects.Table) batchSQL {
	tq, id, lu := quote(t.Name), quote(t.ID), quote(t.LockedUntil)
	held := " FROM unnest($1::bigint[], $2::timestamptz[]) AS h(id, held) WHERE u." + id + " = h.id AND u." + lu + " = h.held RETURNING u." + id
	var b batchSQL
	if t.ProcessedAt != "" {
		clear := ""
		if t.Error != "" {
			clear = ", " + quote(t.Error) + " = NULL" // an ack clears a failed attempt's error
		}
		b.ack = "UPDATE " + tq + " AS u SET " + quote(t.ProcessedAt) + " = $3, " + lu + " = NULL" + clear + held
	} else {
		b.ack = "DELETE FROM " + tq + " AS u USING unnest($1::bigint[], $2::timestamptz[]) AS h(id, held) WHERE u." + id +
			" = h.id AND u." + lu + " = h.held RETURNING u." + id
	}
	b.release = "UPDATE " + tq + " AS u SET " + lu + " = NULL" + held
	return b
}

// SettleLeases acks or releases every lease in held that still holds its token, in one
// statement (one commit), and returns the ids it settled.
func (q *leaseQueue) SettleLeases(ctx context.Context, kind dialects.StepKind, now time.Time, held []dialects.Lease) ([]int64, error) {
	if len(held) == 0 {
		return nil, nil
	}
	ids := make([]int64, len(held))
	tokens := make([]time.Time, len(held))
	for i, l := range held {
		ids[i], tokens[i] = l.ID, l.Token
	}
	var (
		text string
		args = []any{ids, tokens}
	)
	switch kind {
	case dialects.StepAck:
		text = q.batch.ack
		if q.hasProcessedAt {
			args = append(args, now)
		}
	case dialects.StepRelease, dialects.StepRetry:
		text = q.batch.release
	default:
		return nil, q.errorf("settle batch", fmt.Errorf("a %v step cannot be batched", kind))
	}
	rows, err := q.d.pool.Query(ctx, text, args...)
	if err != nil {
		return nil, q.errorf(kind.String()+" batch", err)
	}
	defer rows.Close()
	settled := make([]int64, 0, len(held))
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, q.errorf(kind.String()+" batch", err)
		}
		settled = append(settled, id)
	}
	if err := rows.Err(); err != nil {
		return nil, q.errorf(kind.String()+" batch", err)
	}
	return settled, nil
}
