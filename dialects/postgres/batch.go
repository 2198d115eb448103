package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var _ dialects.LeaseBatchQueue = (*leaseQueue)(nil)

// batchSQL are the lease form's batched settlements: the ids and tokens travel as two
// arrays, joined to the table; a locking read skips the rows another session holds (a
// batch waiting for one such lock would hold every other row it locked), and RETURNING
// names the rows that held their tokens and were settled.
type batchSQL struct {
	ack     string // $1 ids, $2 tokens, $3 now (processed_at tables)
	release string // $1 ids, $2 tokens
	holding string // $1 ids, $2 tokens: the rows holding their tokens, read without locking
}

// lockedHolding is the locking read of the rows holding their tokens, as the CTE l: ids
// and tokens are the parameters of the two arrays. mode is the lock the statement that
// follows takes on its rows anyway: "NO KEY UPDATE" for an UPDATE of the lease (non-key
// columns), "UPDATE" for a DELETE. A stronger lock than the statement's own would skip
// rows the statement need not wait for: FOR UPDATE conflicts with the KEY SHARE a
// foreign key check of a referencing row holds, which an UPDATE of the lease does not.
// Either mode keeps the row on its token until the statement ends: every UPDATE takes at
// least NO KEY UPDATE, and every DELETE takes UPDATE.
func lockedHolding(t dialects.Table, ids, tokens, mode string) string {
	tq, id, lu := quote(t.Name), quote(t.ID), quote(t.LockedUntil)
	return "WITH l AS (SELECT u." + id + " AS id FROM " + tq + " AS u JOIN unnest(" + ids + "::bigint[], " + tokens +
		"::timestamptz[]) AS h(id, held) ON u." + id + " = h.id AND u." + lu + " = h.held FOR " + mode + " OF u SKIP LOCKED) "
}

func buildBatch(t dialects.Table) batchSQL {
	tq, id, lu := quote(t.Name), quote(t.ID), quote(t.LockedUntil)
	with := lockedHolding(t, "$1", "$2", "NO KEY UPDATE")
	from := " FROM l WHERE u." + id + " = l.id RETURNING u." + id
	var b batchSQL
	if t.ProcessedAt != "" {
		clear := ""
		if t.Error != "" {
			clear = ", " + quote(t.Error) + " = NULL" // an ack clears a failed attempt's error
		}
		b.ack = with + "UPDATE " + tq + " AS u SET " + quote(t.ProcessedAt) + " = $3, " + lu + " = NULL" + t.ClearUniqueKey(quote) + clear + from
	} else {
		b.ack = lockedHolding(t, "$1", "$2", "UPDATE") + "DELETE FROM " + tq + " AS u USING l WHERE u." + id + " = l.id RETURNING u." + id
	}
	b.release = with + "UPDATE " + tq + " AS u SET " + lu + " = NULL" + from
	b.holding = "SELECT u." + id + " FROM " + tq + " AS u JOIN unnest($1::bigint[], $2::timestamptz[]) AS h(id, held) ON u." +
		id + " = h.id AND u." + lu + " = h.held"
	return b
}

// SettleLeases acks or releases every lease in held that still holds its token, in one
// statement (one commit), and returns the ids it settled. A row another session holds
// locked is skipped and reported in a *dialects.RowsBusyError for the caller to settle
// alone.
func (q *leaseQueue) SettleLeases(ctx context.Context, kind dialects.StepKind, now time.Time, held []dialects.Lease) ([]int64, error) {
	if len(held) == 0 {
		return nil, nil
	}
	ids, tokens := leaseArrays(held)
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
	settled, err := q.queryIDs(ctx, text, args...)
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
	if len(missing) == 0 {
		return nil, nil
	}
	ids, tokens := leaseArrays(missing)
	busy, err := q.queryIDs(ctx, q.batch.holding, ids, tokens)
	if err != nil {
		return dialects.IDs(missing), err
	}
	return busy, nil
}

// Holding reads which rows of held hold their tokens, in one statement.
func (q *leaseQueue) Holding(ctx context.Context, held []dialects.Lease) ([]int64, error) {
	ids, tokens := leaseArrays(held)
	found, err := q.queryIDs(ctx, q.batch.holding, ids, tokens)
	if err != nil {
		return nil, q.errorf("read leases", err)
	}
	return found, nil
}

// leaseArrays returns the ids and tokens of held as two arrays.
func leaseArrays(held []dialects.Lease) ([]int64, []time.Time) {
	ids := make([]int64, len(held))
	tokens := make([]time.Time, len(held))
	for i, l := range held {
		ids[i], tokens[i] = l.ID, l.Token
	}
	return ids, tokens
}

// queryIDs runs a statement that returns row ids, on the pool.
func (q *leaseQueue) queryIDs(ctx context.Context, text string, args ...any) ([]int64, error) {
	return queryIDs(ctx, q.d.pool, text, args...)
}

// queryIDs runs a query of ids on db (the pool, or a transaction).
func queryIDs(ctx context.Context, db querier, text string, args ...any) ([]int64, error) {
	rows, err := db.Query(ctx, text, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}
