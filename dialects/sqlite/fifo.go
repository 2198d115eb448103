package sqlite

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

// FIFO groups (Table.FIFO), in the lease form (SQLite has no row lock form).
//
// A group's head is its unfinished row (not processed; dead letters have left the group)
// with the lowest id, whatever its retry_after. The claim is one UPDATE that stamps the
// head, only if it is due, not leased, and no row of its group holds an unexpired lease;
// its subselect takes the head whatever its state, so a head in work, or not yet due
// (published with a delay, or answered RetryAfter), stays the head and the claim changes
// nothing rather than handing out the row behind it: order holds across retries. SQLite
// has one writer per database file, so the UPDATE needs no guard: a claim in another
// process runs before or after it, never beside it.

// fifoLeaseQueue is the lease queue of a FIFO table: the lease queue's settlements,
// extensions and transactional deliveries, and the head claim.
type fifoLeaseQueue struct {
	*leaseQueue
	head string // :until, :group, :now
}

var (
	_ dialects.FIFOQueue    = fifoLeaseQueue{}
	_ dialects.TxLeaseQueue = fifoLeaseQueue{}
)

func newFIFOLeaseQueue(lq *leaseQueue, t dialects.Table) fifoLeaseQueue {
	tq, id, grp, lu := quote(t.Name), quote(t.ID), quote(t.Group), quote(t.LockedUntil)
	unfinished := func(alias string) string {
		if t.ProcessedAt == "" {
			return ""
		}
		return " AND " + alias + "." + quote(t.ProcessedAt) + " IS NULL"
	}
	var b strings.Builder
	b.WriteString("UPDATE " + tq + " SET " + lu + " = :until")
	if t.Attempt != "" {
		b.WriteString(", " + quote(t.Attempt) + " = " + sqlpart.CountAttempt(quote(t.Attempt), attemptMax))
	}
	b.WriteString(" WHERE " + id + " = (SELECT h." + id + " FROM " + tq + " AS h WHERE h." + grp + " = :group" +
		unfinished("h") + " ORDER BY h." + id + " LIMIT 1)")
	b.WriteString(" AND " + claimable(t, true))
	b.WriteString(" AND NOT EXISTS (SELECT 1 FROM " + tq + " AS w WHERE w." + grp + " = :group AND w." + lu + " > :now" +
		unfinished("w") + ")")
	b.WriteString(" RETURNING " + id + ", " + quote(t.Payload))
	if t.Attempt != "" {
		// RETURNING sees the counted value; the delivery reports the one before.
		b.WriteString(", " + quote(t.Attempt) + " - 1")
	}
	if t.Headers != "" {
		b.WriteString(", " + quote(t.Headers))
	}
	return fifoLeaseQueue{leaseQueue: lq, head: b.String()}
}

func (fifoLeaseQueue) ClaimsHeadsOnly() {}

func (f fifoLeaseQueue) prepare(ctx context.Context) error {
	if err := f.leaseQueue.prepare(ctx); err != nil {
		return err
	}
	if err := f.d.prepareAll(ctx, f.head); err != nil {
		return f.errorf("prepare", err)
	}
	return nil
}

// ClaimLeases claims the group's head (at most one row, whatever limit) in one statement
// under the file's writer turn.
func (f fifoLeaseQueue) ClaimLeases(ctx context.Context, now, until time.Time, limit int) ([]dialects.Row, error) {
	if limit <= 0 {
		return nil, nil
	}
	if err := checkExpiry(now, until); err != nil {
		return nil, f.errorf("claim", err)
	}
	if err := f.f.lockWriter(ctx); err != nil {
		return nil, f.errorf("claim", err)
	}
	defer f.f.unlockWriter()
	rows, err := f.query(ctx, f.head,
		sql.Named("until", formatTime(until)),
		sql.Named("now", formatTime(now)),
		sql.Named("group", f.group))
	if err != nil {
		return nil, f.errorf("claim", err)
	}
	defer rows.Close()
	var out []dialects.Row
	sc := f.rowScanner(false)
	for rows.Next() {
		r, err := sc.scan(rows)
		if err != nil {
			return nil, f.errorf("claim", err)
		}
		r.Token = until
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, f.errorf("claim", err)
	}
	return out, nil
}
