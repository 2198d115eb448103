package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

// listSlots bounds the id lists one statement names: 1<<(listSlots-1) = 4096 ids (8193
// placeholders in an extension), far below MySQL's 65535 placeholders.
const (
	listSlots = 13
	maxList   = 1 << (listSlots - 1)
)

// inList builds statements around a list of n items, n a power of two: a short list is
// padded by repeating its last item (a repeated id or (id, token) pair changes nothing),
// so a handful of texts serve every length and each is prepared once.
type inList struct {
	prefix, item, suffix string

	mu    sync.Mutex
	texts [listSlots]string
}

// slotOf returns the slot of a list of n items (n >= 1) and its padded length.
func slotOf(n int) (slot, padded int) {
	slot = bits.Len(uint(n - 1))
	return slot, 1 << slot
}

// pairSlotOf is slotOf for a list of (id, token) pairs, padded to two pairs at least:
// MariaDB reads a one-pair row-value IN, (id, t) IN ((?, ?)), by scanning the whole table,
// locking every row it passes, so one lease's extension or settlement would wait for any
// row another session holds. With two pairs (a repeated pair changes nothing) it reads
// the primary key's range. Every pair list is padded so: batch.lock, the locking read that
// the extension and the batched settlements run (the extension's UPDATE names ids only).
func pairSlotOf(n int) (slot, padded int) { return slotOf(max(n, 2)) }

func (l *inList) text(slot int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.texts[slot] == "" {
		n := 1 << slot
		var b strings.Builder
		b.Grow(len(l.prefix) + (len(l.item)+1)*n + len(l.suffix))
		b.WriteString(l.prefix)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(l.item)
		}
		b.WriteString(l.suffix)
		l.texts[slot] = b.String()
	}
	return l.texts[slot]
}

// idArgs appends ids padded to n to dst.
func idArgs(dst []any, ids []int64, n int) []any {
	for i := range n {
		dst = append(dst, ids[min(i, len(ids)-1)])
	}
	return dst
}

// leaseQueue serves the lease form. MySQL cannot return the rows an UPDATE changed, so a
// claim is a short READ COMMITTED transaction: a locking read of the due rows that skips
// rows other claims hold, one UPDATE stamping the lease on the ids it read, and a commit.
// The read's locks last until the commit, so claims of one queue run one at a time (sem):
// concurrent claims would only skip each other's rows and hold more locks for longer.
type leaseQueue struct {
	queue
	cl claimable
	// claim selects the due rows: claimable args, then the limit.
	claim string
	// stamp writes the lease on an id list: until, ids, now.
	stamp inList
	// extend moves the leases of an id list, each locked on its token by batch.lock in
	// the same transaction: until, ids.
	extend inList
	// confirm locks a row if it holds a token, before an event runs: id, token.
	confirm string
	// mark and unmark confirm instead on a Galera node (markText).
	mark, unmark string
	// batch are the batched acks and releases (batch.go).
	batch *batchSQL
	// level is the table's isolation level, for transactional deliveries (claims run at
	// READ COMMITTED whatever the table declares).
	level sql.IsolationLevel

	sem chan struct{}
}

var _ dialects.LeaseQueue = (*leaseQueue)(nil)

func newLeaseQueue(base queue, t dialects.Table) *leaseQueue {
	tq, id, lu := quote(t.Name), quote(t.ID), quote(t.LockedUntil)
	cl := newClaimable(t, true)
	set := lu + " = ?"
	if t.Attempt != "" {
		set += ", " + quote(t.Attempt) + " = " + sqlpart.CountAttempt(quote(t.Attempt), base.attemptMax)
	}
	return &leaseQueue{
		queue: base,
		cl:    cl,
		claim: "SELECT " + rowColumns(t, false) + " FROM " + tq + " WHERE " + cl.where +
			" ORDER BY " + t.ClaimOrder(quote, "") + " LIMIT ? FOR UPDATE SKIP LOCKED",
		stamp: inList{prefix: "UPDATE " + tq + " SET " + set + " WHERE " + id + " IN (", item: "?",
			suffix: ") AND (" + lu + " IS NULL OR " + lu + " <= ?)"},
		extend:  inList{prefix: "UPDATE " + tq + " SET " + lu + " = ? WHERE " + id + " IN (", item: "?", suffix: ")"},
		confirm: confirmText(t),
		mark:    markText(t),
		unmark:  unmarkText(t),
		batch:   newBatchSQL(t),
		level:   isolation(t.Isolation),
		sem:     make(chan struct{}, 1),
	}
}

// texts lists the statements to prepare at Open (the list statements at their shortest).
func (q *leaseQueue) texts() []string {
	texts := []string{q.claim, q.stamp.text(0), q.extend.text(0), q.confirm}
	return append(texts, q.batch.texts()...)
}

func (q *leaseQueue) ClaimLeases(ctx context.Context, now, until time.Time, limit int) ([]dialects.Row, error) {
	if limit <= 0 {
		return nil, nil
	}
	if err := checkExpiry(now, until); err != nil {
		return nil, q.errorf("claim", err)
	}
	limit = min(limit, maxList)
	select {
	case q.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, q.errorf("claim", ctx.Err())
	}
	defer func() { <-q.sem }()
	rows, err := withRetry(ctx, func() ([]dialects.Row, error) { return q.claimOnce(ctx, now, until, limit) })
	if err != nil {
		return nil, q.errorf("claim", err)
	}
	return rows, nil
}

// checkExpiry refuses a claim whose lease would not end after now, as stored (to the
// microsecond). A claim takes only rows whose lease ended at or before now, so an expiry
// after now makes each claim of a row write a token later than the one it replaces: no
// two deliveries of a row ever hold the same token.
func checkExpiry(now, until time.Time) error {
	if !dbTime(until).After(dbTime(now)) {
		return fmt.Errorf("the lease expiry %s is not after now %s", dbTime(until).Format(time.RFC3339Nano),
			dbTime(now).Format(time.RFC3339Nano))
	}
	return nil
}

// claimOnce runs one claim transaction.
func (q *leaseQueue) claimOnce(ctx context.Context, now, until time.Time, limit int) (_ []dialects.Row, err error) {
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
	sel, err := q.d.stmt(ctx, q.claim)
	if err != nil {
		return nil, err
	}
	rs, err := x.tx.StmtContext(ctx, sel).QueryContext(ctx, append(q.cl.args(nil, q.group, now), limit)...)
	if err != nil {
		return nil, err
	}
	var rows []dialects.Row
	for rs.Next() {
		r, err := q.scanRow(rs)
		if err != nil {
			rs.Close()
			return nil, err
		}
		r.Token = until
		rows = append(rows, r)
	}
	if err := rs.Close(); err != nil {
		return nil, err
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		done = true
		return nil, x.rollback()
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	slot, n := slotOf(len(ids))
	stamp, err := x.stmt(ctx, q.stamp.text(slot))
	if err != nil {
		return nil, err
	}
	args := make([]any, 0, n+2)
	args = append(args, dbTime(until))
	args = idArgs(args, ids, n)
	args = append(args, dbTime(now))
	stamped, err := affected(stamp.ExecContext(ctx, args...))
	if err != nil {
		return nil, err
	}
	if stamped != int64(len(ids)) {
		// The locking read found every row free and locks it until the commit, and the
		// stamp writes a value later than now, so each row changes: anything else is
		// a fault, and nothing of the claim is kept. (No read-back by value: a row
		// holding until afterwards need not be one this claim stamped.)
		return nil, fmt.Errorf("stamped %d of the %d rows the claim locked", stamped, len(ids))
	}
	done = true
	if err := x.commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return rows, nil
}

func (q *leaseQueue) ExtendLeases(ctx context.Context, until time.Time, held []dialects.Lease) ([]int64, error) {
	if len(held) == 0 {
		return nil, nil
	}
	if ev, own := q.events[dialects.EventExtend]; own {
		return q.extendEach(ctx, ev, until, held)
	}
	var moved, busy []int64
	for start := 0; start < len(held); start += maxList {
		chunk := held[start:min(start+maxList, len(held))]
		ids, err := q.extendChunk(ctx, until, chunk)
		if err != nil {
			return moved, q.errorf("extend", err)
		}
		moved = append(moved, ids...)
		if len(ids) == len(chunk) {
			continue
		}
		// A failed read says nothing of which leases were lost: the round fails, and
		// the leases it did not move keep their tokens until the next.
		b, err := q.busyOf(ctx, chunk, ids)
		if err != nil {
			return moved, q.errorf("extend: read the rows skipped", err)
		}
		busy = append(busy, b...)
	}
	if len(busy) > 0 {
		return moved, &dialects.RowsBusyError{IDs: busy}
	}
	return moved, nil
}

// extendChunk moves the leases of one chunk (at most maxList) in a READ COMMITTED
// transaction (retried whole after a deadlock or a lock wait timeout, which rolled it
// back): a locking read of the rows that still hold their tokens, the UPDATE of the ids
// it found, and the commit. The read's locks keep every row it found on its token until
// the commit, so the rows it returns are exactly the rows moved. The read skips rows
// another session has locked (ExtendLeases tells which of those are still ours): waiting
// for one would keep every other lease of the round from moving, and let them run out
// behind a lock that is not theirs.
//
// A lease is never confirmed by its new value: a row that holds until after the renewal
// may be one another claim took with that very expiry once this delivery's lease had run
// out (tokens are whole seconds), and a delivery that kept it would settle, by that value,
// the other claim's delivery. Nor by the server's count of changed rows alone: a renewal
// in the claim's second asks for the value the row already holds, which the server does
// not count as a change.
func (q *leaseQueue) extendChunk(ctx context.Context, until time.Time, held []dialects.Lease) ([]int64, error) {
	return withRetry(ctx, func() ([]int64, error) { return q.extendOnce(ctx, until, held, &q.batch.lock) })
}

// ExtendLeasesWaiting moves the leases of held that still hold their tokens, waiting (up
// to ctx) for rows another session has locked: the locking read does not skip them.
func (q *leaseQueue) ExtendLeasesWaiting(ctx context.Context, until time.Time, held []dialects.Lease) ([]int64, error) {
	var moved []int64
	for start := 0; start < len(held); start += maxList {
		chunk := held[start:min(start+maxList, len(held))]
		ids, err := q.extendOnce(ctx, until, chunk, &q.batch.lockWait)
		if err != nil {
			return moved, q.errorf("extend", err)
		}
		moved = append(moved, ids...)
	}
	return moved, nil
}

func (q *leaseQueue) extendOnce(ctx context.Context, until time.Time, held []dialects.Lease, lock *inList) ([]int64, error) {
	var found []int64
	err := q.inTx(ctx, lock == &q.batch.lockWait, func(x *txn) error {
		var err error
		if found, err = q.lockPairs(ctx, x, lock, held); err != nil || len(found) == 0 {
			return err
		}
		slices.Sort(found)
		found = slices.Compact(found) // held may name a row twice
		slot, n := slotOf(len(found))
		s, err := x.stmt(ctx, q.extend.text(slot))
		if err != nil {
			return err
		}
		args := make([]any, 0, 1+n)
		args = idArgs(append(args, dbTime(until)), found, n)
		// The count is not checked: a row already holding until does not count as changed.
		_, err = s.ExecContext(ctx, args...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return found, nil
}

// inTx runs fn in a transaction of its own at read committed, committed when fn returns
// nil. wait says fn may wait for locks other sessions hold: a wait cut short by ctx makes
// the driver close its socket, but the server does not notice while the statement waits
// in a lock's queue, and its transaction keeps the rows it locked already (up to
// innodb_lock_wait_timeout). It never commits (nothing else will be read from the socket),
// and its session is killed (killCut) so that its locks go at once.
func (q *leaseQueue) inTx(ctx context.Context, wait bool, fn func(x *txn) error) error {
	x, err := q.d.begin(ctx, sql.LevelReadCommitted)
	if err != nil {
		return err
	}
	var connID int64
	if wait {
		if err := x.tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&connID); err != nil {
			_ = x.rollback()
			return err
		}
	}
	if err := fn(x); err != nil {
		q.d.cutTx(ctx, x, connID, err)
		_ = x.rollback()
		return err
	}
	if err := x.commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// errUnchanged rolls back an inTx whose statement found nothing to change.
var errUnchanged = errors.New("nothing changed")

// SettleLease runs the step's statement fenced by the token; false when the row holds
// another token (or is gone), with nothing changed. A step naming an event runs it in a
// transaction of its own that first confirms the token (settleEvent).
func (q *leaseQueue) SettleLease(ctx context.Context, step dialects.Step, held dialects.Lease) (bool, error) {
	if step.Event != "" {
		return q.settleEvent(ctx, step, held)
	}
	op := step.Kind.String()
	text, args, move, err := q.settle.statement(step, held.ID, dbTime(held.Token))
	if err != nil {
		return false, q.errorf(op, err)
	}
	if move {
		return q.moveLeased(ctx, args)
	}
	if text == "" {
		return false, q.errorf(op, fmt.Errorf("no statement for step %v", step.Kind))
	}
	// The statement waits for a row another session holds: in a transaction of its own
	// whose server session is killed when ctx ends the wait (inTx), so that a settlement
	// cut short (a Shutdown whose context ended) changes nothing later and leaves nothing
	// waiting on the server. Run in autocommit, the orphan would commit once the other
	// session let the row go.
	var n int64
	err = q.inTx(ctx, true, func(x *txn) error {
		s, err := x.stmt(ctx, text)
		if err == nil {
			n, err = affected(s.ExecContext(ctx, args...))
		}
		return err
	})
	if err != nil {
		return false, q.errorf(op, err)
	}
	// Every lease statement deletes the row or clears its lease, so a row that held the
	// token is a changed row whatever the DSN's clientFoundRows says.
	return n > 0, nil
}

// SettleLeaseWaiting runs a batchable step's statement in a transaction of its own that
// waits for the row's lock up to ctx (inTx): a wait cut short never commits.
func (q *leaseQueue) SettleLeaseWaiting(ctx context.Context, step dialects.Step, held dialects.Lease) (bool, error) {
	op := step.Kind.String()
	text, args, move, err := q.settle.statement(step, held.ID, dbTime(held.Token))
	if err == nil && (move || text == "" || step.Event != "") {
		err = fmt.Errorf("a %v step does not wait for its row in a batch", step.Kind)
	}
	if err != nil {
		return false, q.errorf(op, err)
	}
	var n int64
	err = q.inTx(ctx, true, func(x *txn) error {
		s, err := x.stmt(ctx, text)
		if err == nil {
			n, err = affected(s.ExecContext(ctx, args...))
		}
		return err
	})
	if err != nil {
		return false, q.errorf(op, err)
	}
	return n > 0, nil
}

// moveLeased moves a leased row into the dead-letter table in one transaction, which
// commits only if the copy and the delete both matched the row and its token.
func (q *leaseQueue) moveLeased(ctx context.Context, args []any) (bool, error) {
	const op = "dead-letter move"
	moved, err := withRetry(ctx, func() (bool, error) {
		// inTx: a move waiting for a row another session holds, cut short, is killed on
		// the server (see SettleLease).
		var ok bool
		err := q.inTx(ctx, true, func(x *txn) error {
			var err error
			if ok, err = q.move(ctx, x.tx, args); err == nil && !ok {
				return errUnchanged
			}
			return err
		})
		if errors.Is(err, errUnchanged) {
			return false, nil
		}
		return ok, err
	})
	if err != nil {
		return false, q.errorf(op, err)
	}
	return moved, nil
}

// txLeaseQueue is the lease queue of a transactional subscription: each delivery's handler
// gets a transaction of its own, opened after the claim committed.
type txLeaseQueue struct{ *leaseQueue }

var _ dialects.TxLeaseQueue = txLeaseQueue{}

// BeginDelivery opens a transaction at the table's isolation level (READ COMMITTED when
// none is declared) on a pool connection of its own, held until the transaction ends. Any
// level serves: the fenced settlement is an UPDATE or DELETE, which InnoDB runs against
// the latest committed row version (a locking read) whatever the transaction's snapshot,
// so it sees the renewer's extensions.
//
// The transaction is lent (lend): autocommit off on its connection and a savepoint, so
// that after InnoDB ended it on its own (a deadlock's victim) nothing run through it
// commits, and the settlement finds it ended (alive) and reports dialects.ErrTxEnded.
func (q txLeaseQueue) BeginDelivery(ctx context.Context) (dialects.LeaseTx, error) {
	x, err := q.d.begin(ctx, q.level)
	if err != nil {
		return nil, q.errorf("begin delivery", err)
	}
	x.lent = true
	if err := lend(ctx, x.tx); err != nil {
		return nil, q.errorf("begin delivery", errors.Join(err, x.rollback()))
	}
	return &leaseTx{q: q.leaseQueue, x: x}, nil
}

// leaseTx is a lease-form delivery's transaction.
//
// Its settlement is never retried after a deadlock or a lock wait timeout, unlike the
// settlements outside it: the handler's writes cannot be replayed, and a deadlock has
// rolled them back already. The settlement then rolls back and returns the error (a
// deadlock's, or a transaction found ended, wrapping dialects.ErrTxEnded).
type leaseTx struct {
	q *leaseQueue
	x *txn

	mu    sync.Mutex
	ended bool
}

var _ dialects.LeaseTx = (*leaseTx)(nil)

var errDeliveryEnded = errors.New("the delivery's transaction has ended")

// Tx is the delivery's transaction, a *sql.Tx. It ends with SettleLease or Rollback.
func (t *leaseTx) Tx() any { return t.x.tx }

// SettleLease runs the step fenced by the token inside the transaction (a dead letter into
// a table as its copy and delete), and commits when it changed the row: the handler's
// writes commit with it. When the row no longer holds the token (or the move's copy or
// delete matched no row) it rolls everything back and reports false; a failed statement
// rolls back too, and returns its error. Either way the transaction is over, and a
// connection whose COMMIT or ROLLBACK failed is closed rather than pooled.
func (t *leaseTx) SettleLease(ctx context.Context, step dialects.Step, held dialects.Lease) (_ bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.q
	op := step.Kind.String()
	if t.ended {
		return false, q.errorf(op, errDeliveryEnded)
	}
	t.ended = true
	text, args, move, err := q.settle.statement(step, held.ID, dbTime(held.Token))
	if err != nil && step.Event == "" {
		return false, q.errorf(op, errors.Join(err, t.x.rollback()))
	}
	// A transaction the server ended must not commit what ran since (nor the settlement).
	if err := alive(ctx, t.x.tx); err != nil {
		return false, q.errorf(op, errors.Join(err, t.x.rollback()))
	}
	// The settlement may wait for a row another session holds: when ctx ends the wait,
	// the server session is killed (killCut), its transaction (the handler's writes) rolled
	// back and its locks gone at once.
	session, err := t.x.sessionID(ctx)
	if err != nil {
		return false, q.errorf(op, errors.Join(err, t.x.rollback()))
	}
	var changed bool
	switch {
	case step.Event != "":
		// The event runs after confirming the token, and settles whatever it changed.
		op = "event " + step.Event
		changed, err = q.leaseEvent(ctx, t.x.tx, step, held)
	case move:
		op = "dead-letter move"
		changed, err = q.move(ctx, t.x.tx, args)
	case text == "":
		err = fmt.Errorf("no statement for step %v", step.Kind)
	default:
		var s *sql.Stmt
		if s, err = t.x.stmt(ctx, text); err == nil {
			var n int64
			n, err = affected(s.ExecContext(ctx, args...))
			// Every lease statement deletes the row or clears its lease: a row that held
			// the token is a changed row.
			changed = n > 0
		}
	}
	if err != nil {
		q.d.cutTx(ctx, t.x, session, err)
		return false, q.errorf(op, errors.Join(ended(err), t.x.rollback()))
	}
	if !changed {
		if err := t.x.rollback(); err != nil {
			return false, q.errorf(op+" rollback", err)
		}
		return false, nil
	}
	if err := t.x.commit(); err != nil {
		return false, q.errorf(op+" commit", err)
	}
	return true, nil
}

// Interrupt rolls the transaction back while its handler may still be using it, as
// Rollback does (see txClaim.Interrupt); the lease is the caller's to release.
func (t *leaseTx) Interrupt(ctx context.Context) error { return t.Rollback(ctx) }

// Rollback discards the transaction, the handler's writes with it; a no-op once it ended.
func (t *leaseTx) Rollback(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return nil
	}
	t.ended = true
	if err := t.x.rollback(); err != nil {
		return t.q.errorf("rollback", err)
	}
	return nil
}
