package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var _ dialects.LeaseBatchQueue = (*leaseQueue)(nil)

// maxSettle bounds the leases one batched settlement statement names (two parameters
// each, far below SQLite's 32766). A longer list runs in chunks in one transaction.
const maxSettle = maxExtend

// valuesList is a statement around a VALUES list of (id, token) pairs, built once per
// power-of-two length: a short list is padded with its last pair (a repeated pair changes
// nothing, and RETURNING names each row once), so a handful of texts serve every length
// and each is prepared once.
type valuesList struct {
	prefix, suffix string

	mu    sync.Mutex
	texts [extendSlots]string
}

// pairSlot returns the slot of a list of n pairs (1 <= n <= maxSettle) and its padded
// length.
func pairSlot(n int) (slot, padded int) {
	slot = bits.Len(uint(n - 1))
	return slot, 1 << slot
}

func (l *valuesList) text(slot int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.texts[slot] == "" {
		n := 1 << slot
		var b strings.Builder
		b.Grow(len(l.prefix) + 6*n + len(l.suffix))
		b.WriteString(l.prefix)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString("(?,?)")
		}
		b.WriteString(l.suffix)
		l.texts[slot] = b.String()
	}
	return l.texts[slot]
}

// batchSQL are the lease form's batched settlements, each fenced per row by its token:
// WHERE (id, locked_until) IN (VALUES (?,?),…) RETURNING id names the rows that still
// held their tokens. The ack mirrors the single-row ack: DELETE, or, with a processed_at
// column, processed_at = now and the lease cleared (now then binds first).
type batchSQL struct {
	ack     valuesList
	ackNow  bool
	release valuesList
}

func newBatchSQL(t dialects.Table) *batchSQL {
	tq, id, lu := quote(t.Name), quote(t.ID), quote(t.LockedUntil)
	where := " WHERE (" + id + ", " + lu + ") IN (VALUES "
	suffix := ") RETURNING " + id
	b := &batchSQL{release: valuesList{prefix: "UPDATE " + tq + " SET " + lu + " = NULL" + where, suffix: suffix}}
	if t.ProcessedAt != "" {
		clear := ""
		if t.Error != "" {
			clear = ", " + quote(t.Error) + " = NULL" // an ack clears a failed attempt's error
		}
		b.ack.prefix = "UPDATE " + tq + " SET " + quote(t.ProcessedAt) + " = ?, " + lu + " = NULL" + t.ClearUniqueKey(quote) + clear + where
		b.ackNow = true
	} else {
		b.ack.prefix = "DELETE FROM " + tq + where
	}
	b.ack.suffix = suffix
	return b
}

// texts lists the statements to prepare at Open (one pair each).
func (b *batchSQL) texts() []string {
	return []string{b.ack.text(0), b.release.text(0)}
}

// SettleLeases acks or releases every lease in held whose row still holds its token, in
// one write statement (one transaction) in this process's writer turn, and returns the ids
// it settled. A row holding another token, or gone, is left alone and missing from the
// result.
func (q *leaseQueue) SettleLeases(ctx context.Context, kind dialects.StepKind, now time.Time, held []dialects.Lease) ([]int64, error) {
	if len(held) == 0 {
		return nil, nil
	}
	var (
		list  *valuesList
		first []any
	)
	switch kind {
	case dialects.StepAck:
		list = &q.batch.ack
		if q.batch.ackNow {
			first = []any{formatTime(now)}
		}
	case dialects.StepRelease, dialects.StepRetry:
		list = &q.batch.release
	default:
		return nil, q.errorf("settle batch", fmt.Errorf("a %v step cannot be batched", kind))
	}
	op := kind.String() + " batch"
	if len(held) == 1 {
		// A lone row runs the single-row statement, which costs half the batched one here
		// (no VALUES list to match, no RETURNING to read). SQLite has no row locks another
		// session could hold, so it never waits where the batched one would skip.
		step := dialects.Step{Kind: kind, Now: now}
		if kind == dialects.StepRetry {
			step.Kind = dialects.StepRelease // as the batch: the lease is cleared, nothing else
		}
		st, err := q.leaseSettlement(step, held[0])
		if err != nil {
			return nil, err
		}
		if ok, err := q.run(ctx, st); err != nil || !ok {
			return nil, err
		}
		return []int64{held[0].ID}, nil
	}
	if len(held) <= maxSettle {
		text, args := settleArgs(list, first, held)
		if err := q.f.lockWriter(ctx); err != nil {
			return nil, q.errorf(op, err)
		}
		defer q.f.unlockWriter()
		rows, err := q.query(ctx, text, args...)
		if err != nil {
			return nil, q.errorf(op, err)
		}
		// The statement's transaction commits when its rows close, within the turn.
		ids, err := scanIDs(rows)
		if err != nil {
			return nil, q.errorf(op, err)
		}
		return ids, nil
	}
	// More than one statement's worth: the chunks share one transaction.
	var settled []int64
	_, err := q.immediate(ctx, op, func(conn *sql.Conn) (bool, error) {
		for start := 0; start < len(held); start += maxSettle {
			text, args := settleArgs(list, first, held[start:min(start+maxSettle, len(held))])
			rows, err := conn.QueryContext(ctx, text, args...)
			if err != nil {
				return false, q.errorf(op, err)
			}
			ids, err := scanIDs(rows)
			if err != nil {
				return false, q.errorf(op, err)
			}
			settled = append(settled, ids...)
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return settled, nil
}

// settleArgs returns the text for held (1 to maxSettle leases) and its arguments: first,
// then each (id, token) pair, padded with the last one.
func settleArgs(list *valuesList, first []any, held []dialects.Lease) (string, []any) {
	slot, n := pairSlot(len(held))
	args := make([]any, 0, len(first)+2*n)
	args = append(args, first...)
	// The rows of one claim share its token: its text is formatted (and boxed) once.
	var (
		token time.Time
		text  any
	)
	for i := range n {
		l := held[min(i, len(held)-1)]
		if text == nil || !l.Token.Equal(token) {
			token, text = l.Token, formatTime(l.Token)
		}
		args = append(args, l.ID, text)
	}
	return list.text(slot), args
}
