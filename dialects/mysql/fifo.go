package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
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
// Every claim runs in a transaction whose first statement is the group guard: it counts
// the group's unfinished rows twice, by a plain read and by a read FOR UPDATE SKIP
// LOCKED. Equal counts mean no other transaction holds any of them, and this one now
// locks them all; unequal counts end the claim empty. In the row lock form the claim
// transaction stays open until the settlement, so the group stays held for the whole
// delivery (and a row published ahead of the head in work waits); writes from elsewhere
// to the group's rows wait as long. In the lease form the guard holds for the claim's
// transaction, and the lease holds the group after it. A row published or settled
// between the two counts makes them differ: the claim only comes back empty, and the
// next one tries again.
//
// The row lock form refuses SERIALIZABLE (checkSpec): InnoDB makes every read of a
// SERIALIZABLE transaction a locking read, so the plain count would wait for the row in
// work instead of answering at once. Lease claims run at READ COMMITTED whatever the
// table declares.

// fifoSQL are a FIFO table's guard and head claim, with ? placeholders.
type fifoSQL struct {
	guard string // group, group: 1 when this transaction now holds the group
	head  string // group, then the claimable args[, group, now (lease: NOT EXISTS)]
	// headSkip is the row lock form's head claim passing over the rows set aside (the
	// list binds last): a head set aside is not taken, and holds its group.
	headSkip string
}

func newFIFOSQL(t dialects.Table, cl claimable, lease bool) fifoSQL {
	tq, grp := quote(t.Name), quote(t.Group)
	unfinished := grp + " = ?"
	if t.ProcessedAt != "" {
		unfinished += " AND " + quote(t.ProcessedAt) + " IS NULL"
	}
	var f fifoSQL
	f.guard = "SELECT COUNT(*) = (SELECT COUNT(*) FROM " + tq + " WHERE " + unfinished + ") FROM " + tq +
		" WHERE " + unfinished + " FOR UPDATE SKIP LOCKED"
	// The head: the group's unfinished row with the lowest id, due or not (cl.where then
	// leaves a delayed head, and with it the group, waiting).
	head := "SELECT h." + quote(t.ID) + " FROM " + tq + " AS h WHERE h." + grp + " = ?"
	if t.ProcessedAt != "" {
		head += " AND h." + quote(t.ProcessedAt) + " IS NULL"
	}
	head += " ORDER BY h." + quote(t.ID) + " LIMIT 1"
	f.head = "SELECT " + rowColumns(t, false) + " FROM " + tq + " WHERE " + quote(t.ID) + " = (" + head + ") AND " + cl.where
	if !lease {
		f.headSkip = f.head + skipCond(t) + " FOR UPDATE SKIP LOCKED"
	}
	if lease {
		f.head += " AND NOT EXISTS (SELECT 1 FROM " + tq + " AS w WHERE w." + grp + " = ? AND w." + quote(t.LockedUntil) + " > ?"
		if t.ProcessedAt != "" {
			f.head += " AND w." + quote(t.ProcessedAt) + " IS NULL"
		}
		f.head += ")"
	}
	f.head += " FOR UPDATE SKIP LOCKED"
	return f
}

func (f *fifoSQL) texts() []string {
	if f.headSkip != "" {
		return []string{f.guard, f.head, f.headSkip}
	}
	return []string{f.guard, f.head}
}

// takeGuard runs the guard in tx and reports whether tx now holds the group.
func (q *queue) takeGuard(ctx context.Context, tx *sql.Tx, f *fifoSQL) (bool, error) {
	s, err := q.d.stmt(ctx, f.guard)
	if err != nil {
		return false, err
	}
	var held bool
	if err := tx.StmtContext(ctx, s).QueryRowContext(ctx, q.group, q.group).Scan(&held); err != nil {
		return false, fmt.Errorf("group guard: %w", err)
	}
	return held, nil
}

// fifoRowLockQueue is the row lock form's FIFO queue: its claim takes the guard, then the
// head. It serves single claims only (no batches: a group gives one row at a time).
type fifoRowLockQueue struct {
	q    *rowLockQueue
	fifo fifoSQL
}

var (
	_ dialects.FIFOQueue    = fifoRowLockQueue{}
	_ dialects.RowLockQueue = fifoRowLockQueue{}
)

func newFIFORowLockQueue(base queue, t dialects.Table) fifoRowLockQueue {
	rq := newRowLockQueue(base, t)
	return fifoRowLockQueue{q: rq, fifo: newFIFOSQL(t, rq.cl, false)}
}

func (fifoRowLockQueue) ClaimsHeadsOnly() {}

func (f fifoRowLockQueue) Close() error { return f.q.Close() }

func (f fifoRowLockQueue) texts() []string { return f.fifo.texts() }

// ClaimLocked opens the claim transaction at the table's level, takes the group guard and
// locks the head if it is due. The transaction, and with it the guard, stays open until
// the settlement.
func (f fifoRowLockQueue) ClaimLocked(ctx context.Context, now time.Time) (dialects.LockedClaim, bool, error) {
	q := f.q
	c, err := withRetry(ctx, func() (*lockedClaim, error) { return f.claimOnce(ctx, now) })
	if err != nil {
		return nil, false, q.errorf("claim", err)
	}
	if c == nil {
		return nil, false, nil
	}
	return q.deliver(ctx, c)
}

func (f fifoRowLockQueue) claimOnce(ctx context.Context, now time.Time) (*lockedClaim, error) {
	q := f.q
	x, err := q.d.begin(ctx, q.level)
	if err != nil {
		return nil, err
	}
	held, err := q.takeGuard(ctx, x.tx, &f.fifo)
	if err != nil || !held {
		return nil, errors.Join(err, x.rollback())
	}
	text, args := f.fifo.head, q.cl.args([]any{q.group}, q.group, now)
	if skip := q.skip.list(); skip != "" {
		text, args = f.fifo.headSkip, append(args, skip)
	}
	sel, err := q.d.stmt(ctx, text)
	if err != nil {
		_ = x.rollback()
		return nil, err
	}
	r, err := q.scanOne(x.tx.StmtContext(ctx, sel).QueryContext(ctx, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, x.rollback()
	}
	if err != nil {
		_ = x.rollback()
		return nil, err
	}
	return &lockedClaim{q: q, x: x, row: r}, nil
}

// fifoLease is the lease form's FIFO claim, shared by the plain and transactional queues.
type fifoLease struct {
	q    *leaseQueue
	fifo fifoSQL
}

// fifoLeaseQueue and fifoTxLeaseQueue are the lease form's FIFO queues: the lease queue's
// settlements and extensions, and the head claim.
type fifoLeaseQueue struct {
	*leaseQueue
	f *fifoLease
}

type fifoTxLeaseQueue struct {
	txLeaseQueue
	f *fifoLease
}

var (
	_ dialects.FIFOQueue    = fifoLeaseQueue{}
	_ dialects.LeaseQueue   = fifoLeaseQueue{}
	_ dialects.FIFOQueue    = fifoTxLeaseQueue{}
	_ dialects.TxLeaseQueue = fifoTxLeaseQueue{}
)

func newFIFOLease(lq *leaseQueue, t dialects.Table) *fifoLease {
	return &fifoLease{q: lq, fifo: newFIFOSQL(t, lq.cl, true)}
}

func (fifoLeaseQueue) ClaimsHeadsOnly()   {}
func (fifoTxLeaseQueue) ClaimsHeadsOnly() {}

func (f fifoLeaseQueue) ClaimLeases(ctx context.Context, now, until time.Time, limit int) ([]dialects.Row, error) {
	return f.f.claim(ctx, now, until, limit)
}

func (f fifoTxLeaseQueue) ClaimLeases(ctx context.Context, now, until time.Time, limit int) ([]dialects.Row, error) {
	return f.f.claim(ctx, now, until, limit)
}

// claim takes the head (at most one row, whatever limit) in a READ COMMITTED transaction:
// the guard, the head's locking read, the stamp, the commit. Claims of one queue run one
// at a time, as the lease queue's do.
func (f *fifoLease) claim(ctx context.Context, now, until time.Time, limit int) ([]dialects.Row, error) {
	q := f.q
	if limit <= 0 {
		return nil, nil
	}
	if err := checkExpiry(now, until); err != nil {
		return nil, q.errorf("claim", err)
	}
	select {
	case q.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, q.errorf("claim", ctx.Err())
	}
	defer func() { <-q.sem }()
	rows, err := withRetry(ctx, func() ([]dialects.Row, error) { return f.claimOnce(ctx, now, until) })
	if err != nil {
		return nil, q.errorf("claim", err)
	}
	return rows, nil
}

func (f *fifoLease) claimOnce(ctx context.Context, now, until time.Time) ([]dialects.Row, error) {
	q := f.q
	x, err := q.d.begin(ctx, sql.LevelReadCommitted)
	if err != nil {
		return nil, err
	}
	held, err := q.takeGuard(ctx, x.tx, &f.fifo)
	if err != nil || !held {
		return nil, errors.Join(err, x.rollback())
	}
	sel, err := q.d.stmt(ctx, f.fifo.head)
	if err != nil {
		_ = x.rollback()
		return nil, err
	}
	args := q.cl.args([]any{q.group}, q.group, now)
	args = append(args, q.group, dbTime(now))
	r, err := q.scanOne(x.tx.StmtContext(ctx, sel).QueryContext(ctx, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, x.rollback()
	}
	if err != nil {
		_ = x.rollback()
		return nil, err
	}
	stamp, err := x.stmt(ctx, q.stamp.text(0))
	if err == nil {
		var stamped int64
		stamped, err = affected(stamp.ExecContext(ctx, dbTime(until), r.ID, dbTime(now)))
		if err == nil && stamped != 1 {
			// The locking read saw the head free and holds it, so this should not happen.
			return nil, x.rollback()
		}
	}
	if err != nil {
		_ = x.rollback()
		return nil, err
	}
	if err := x.commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	r.Token = until
	return []dialects.Row{r}, nil
}

// checkFIFO refuses FIFO groups MySQL cannot serve: those tablecheck.CheckFIFO refuses, and
// the row lock form at SERIALIZABLE, where the guard's plain count would be a locking read
// that waits for the group's row in work.
func checkFIFO(t dialects.Table) error {
	if err := tablecheck.CheckFIFO(t); err != nil {
		return err
	}
	if t.FIFO && t.Form() == dialects.FormRowLock && t.Isolation == dialects.Serializable {
		return &dialects.ConfigError{Table: t.Name, Option: "Table.Isolation",
			Reason: "InnoDB makes every read of a serializable transaction a locking read, so the FIFO group guard " +
				"would wait for the group's row in work instead of passing it by",
			Fix: "declare ReadCommitted (the default) or RepeatableRead, or use the lease form (its claims run at read committed)"}
	}
	return nil
}
