package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

// Open checks the subscription against the live database and builds its statements.
func (d *Dialect) Open(ctx context.Context, spec dialects.QueueSpec) (dialects.Queue, error) {
	moveCols, err := d.checkSpec(ctx, spec)
	if err != nil {
		return nil, err
	}
	if spec.Transactional {
		if err := d.checkHooks(ctx, spec.Table.Name); err != nil {
			return nil, err
		}
	}
	f, err := d.fileEntry(ctx)
	if err != nil {
		return nil, err
	}
	t := spec.Table
	base := queue{
		d:          d,
		f:          f,
		name:       t.Name,
		group:      spec.Group,
		hasAttempt: t.Attempt != "",
		hasHeaders: t.Headers != "",
		begin:      beginText(t.Mode),
	}
	if base.events, err = d.compileEvents(ctx, spec); err != nil {
		return nil, err
	}
	if t.Form() == dialects.FormLease {
		base.settle = buildSettle(spec, true, moveCols)
		lq := newLeaseQueue(base, t)
		if t.FIFO {
			fq := newFIFOLeaseQueue(lq, t)
			if err := fq.prepare(ctx); err != nil {
				return nil, err
			}
			return fq, nil
		}
		if err := lq.prepare(ctx); err != nil {
			return nil, err
		}
		return lq, nil
	}
	base.settle = buildSettle(spec, false, moveCols)
	aq, err := newAdvisoryQueue(base, t)
	if err != nil {
		return nil, err
	}
	if err := aq.prepare(ctx); err != nil {
		return nil, err
	}
	return aq, nil
}

// queue is what both forms share: the table, the file's writer turn, the settlements.
type queue struct {
	d          *Dialect
	f          *file
	name       string
	group      string
	hasAttempt bool
	hasHeaders bool
	settle     settleSQL
	// begin opens a transactional delivery's transaction in the table's mode (txn.go).
	begin string
	// events are the subscription's own statements by name (events.go).
	events map[string]dialects.Event
}

// Close has nothing to release: the prepared statements belong to the Dialect, which
// shares them between queues on the same table and closes them itself.
func (q *queue) Close() error { return nil }

func (q *queue) errorf(op string, err error) error {
	return fmt.Errorf("sqlite: %s on table %s: %w", op, q.name, err)
}

// settleSQL holds the settlement statements of one subscription. The lease form's are
// fenced by :token and clear the lease; the advisory form's name the id only, since the
// key excludes every other delivery. An empty text means the table cannot run that step
// (or, retry, that it writes nothing). Every statement but release may name :err, the
// outcome's error for the error column (settlement.args binds it).
//
// A lease table without a retry_after column delays a row (retryAfter, snooze) by leaving
// it leased until then: locked_until = :at (see dialects.StepRetryAfter).
type settleSQL struct {
	ack     string // :id, :now, :token
	release string // lease form only: :id, :token
	// ackUnstarted and giveBack are the ack and the release of a delivery whose handler
	// never started (Step.Unstarted): they also give back the attempt the claim (or the
	// take) counted. giveBack is empty where nothing needs writing (an advisory table
	// without an attempt column).
	ackUnstarted string // as ack
	giveBack     string // :id, :token
	// retry: the lease form clears the lease; the advisory form writes only the error
	// (the take counted the attempt, the unlock returns the row), and runs it only for a
	// step with one (retryNeedsError).
	retry           string // :id, :token
	retryNeedsError bool
	retryAfter      string // :id, :at, :token
	snooze          string // :id, :at, :token
	deadGroup       string // :id, :dest, :now, :token
	destGroup       string
	moveInsert      string // :id, :now, :token
	moveDelete      string // :id, :token
}

// buildSettle builds the settlements; moveCols are the columns a move into the
// dead-letter table copies (deadLetterColumns).
func buildSettle(spec dialects.QueueSpec, lease bool, moveCols []adminsql.MoveColumn) settleSQL {
	t := spec.Table
	tq := quote(t.Name)
	where := " WHERE " + quote(t.ID) + " = :id"
	unlease := ""
	if lease {
		where += " AND " + quote(t.LockedUntil) + " = :token"
		unlease = ", " + quote(t.LockedUntil) + " = NULL"
	}
	keepErr := ""
	if t.Error != "" {
		keepErr = ", " + quote(t.Error) + " = " + sqlpart.KeepError(quote(t.Error), ":err")
	}
	uncount := ""
	if t.Attempt != "" {
		// The claim (or the take) counted the attempt; a snooze, and a row given back
		// unstarted, give it back.
		uncount = ", " + quote(t.Attempt) + " = " + sqlpart.UncountAttempt(quote(t.Attempt))
	}
	delay, delayUnlease := t.RetryAfter, unlease
	if lease && delay == "" {
		delay, delayUnlease = t.LockedUntil, ""
	}
	var s settleSQL
	if t.ProcessedAt != "" {
		ackErr := ""
		if t.Error != "" {
			// An ack writes the outcome's error as is: NULL clears a failed attempt's.
			ackErr = ", " + quote(t.Error) + " = :err"
		}
		s.ack = "UPDATE " + tq + " SET " + quote(t.ProcessedAt) + " = :now" + unlease + t.ClearUniqueKey(quote) + ackErr + where
		s.ackUnstarted = "UPDATE " + tq + " SET " + quote(t.ProcessedAt) + " = :now" + unlease + t.ClearUniqueKey(quote) + uncount + ackErr + where
	} else {
		s.ack = "DELETE FROM " + tq + where
		s.ackUnstarted = s.ack // the row is gone: no count to give back
	}
	if lease {
		s.release = "UPDATE " + tq + " SET " + quote(t.LockedUntil) + " = NULL" + where
		s.giveBack = "UPDATE " + tq + " SET " + quote(t.LockedUntil) + " = NULL" + uncount + where
		s.retry = "UPDATE " + tq + " SET " + quote(t.LockedUntil) + " = NULL" + keepErr + where
	} else {
		if keepErr != "" {
			s.retry = "UPDATE " + tq + " SET " + keepErr[2:] + where
			s.retryNeedsError = true
		}
		if uncount != "" {
			// Advisory: the take counted; the unlock that follows returns the row.
			s.giveBack = "UPDATE " + tq + " SET " + uncount[2:] + where
		}
	}
	if delay != "" {
		s.retryAfter = "UPDATE " + tq + " SET " + quote(delay) + " = :at" + delayUnlease + keepErr + where
		s.snooze = "UPDATE " + tq + " SET " + quote(delay) + " = :at" + delayUnlease + uncount + keepErr + where
	}
	if spec.DeadLetterGroup != "" {
		deadAt := ""
		if t.DeadAt != "" {
			deadAt = ", " + quote(t.DeadAt) + " = :now"
		}
		s.deadGroup = "UPDATE " + tq + " SET " + quote(t.Group) + " = :dest" + deadAt + unlease + keepErr + where
		s.destGroup = spec.DeadLetterGroup
	} else if spec.DeadLetterTable != "" {
		// The whole row: every column both tables share, read from the catalog at Open.
		into, sel := adminsql.MoveLists(moveCols, false, quote, func(c adminsql.MoveColumn) string {
			switch {
			case c.Role == "UniqueKey":
				return "NULL" // the key is free again: the queue table no longer holds the row
			case lease && c.Role == "LockedUntil":
				return "NULL" // the moved row arrives without a lease
			case c.Role == "Error":
				return sqlpart.KeepError(quote(c.Name), ":err")
			case c.Role == "DeadAt":
				return ":now" // the row died now
			}
			return ""
		})
		s.moveInsert = "INSERT INTO " + quote(spec.DeadLetterTable) + " (" + into + ") SELECT " + sel + " FROM " + tq + where
		s.moveDelete = "DELETE FROM " + tq + where
	}
	return s
}

// texts lists the statements to prepare. The move runs as text in a transaction on a
// connection of its own; preparing it here still checks it against the live schema.
func (s *settleSQL) texts() []string {
	return []string{s.ack, s.release, s.ackUnstarted, s.giveBack, s.retry, s.retryAfter, s.snooze, s.deadGroup, s.moveInsert, s.moveDelete}
}

// settlement is what one step runs: a statement with its arguments, or the dead-letter
// move (the copy, then the delete) when move is set. Neither (text "", move false) is a
// step with nothing to write.
type settlement struct {
	op   string
	text string
	move bool
	args []any
	// confirm, for a lease-form event, first confirms that the row holds the delivery's
	// token (with confirmArgs); when it changes no row, nothing else runs (events.go).
	confirm     string
	confirmArgs []any
}

// run runs a settlement on the pool, in this process's writer turn, and reports whether
// it changed the row.
func (q *queue) run(ctx context.Context, st settlement) (bool, error) {
	switch {
	case st.confirm != "":
		return q.confirmed(ctx, st)
	case st.move:
		return q.move(ctx, st.args...)
	case st.text == "":
		return true, nil
	}
	return q.exec(ctx, st.op, st.text, st.args...)
}

// exec runs one write statement in this process's writer turn and reports whether it
// changed a row.
func (q *queue) exec(ctx context.Context, op, query string, args ...any) (bool, error) {
	s, err := q.d.stmt(ctx, query)
	if err != nil {
		return false, q.errorf(op, err)
	}
	if err := q.f.lockWriter(ctx); err != nil {
		return false, q.errorf(op, err)
	}
	defer q.f.unlockWriter()
	res, err := s.ExecContext(ctx, args...)
	if err != nil {
		return false, q.errorf(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, q.errorf(op, err)
	}
	return n > 0, nil
}

// move copies the row into the dead-letter table and deletes it, in one transaction that
// commits only if both statements changed the row.
func (q *queue) move(ctx context.Context, args ...any) (bool, error) {
	const op = "dead-letter move"
	return q.immediate(ctx, op, func(conn *sql.Conn) (bool, error) {
		copied, err := changed(conn.ExecContext(ctx, q.settle.moveInsert, args...))
		if err != nil {
			return false, q.errorf(op+" insert", err)
		}
		deleted, err := changed(conn.ExecContext(ctx, q.settle.moveDelete, args...))
		if err != nil {
			return false, q.errorf(op+" delete", err)
		}
		return copied == 1 && deleted == 1, nil
	})
}

// immediate runs fn in one transaction on a connection of its own, in this process's
// writer turn, and commits only when fn reports true (rolling back otherwise). BEGIN
// IMMEDIATE takes the write lock up front, where the busy handler can wait for it; a
// deferred transaction upgrading from read to write would fail at once instead.
func (q *queue) immediate(ctx context.Context, op string, fn func(conn *sql.Conn) (bool, error)) (done bool, err error) {
	if err := q.f.lockWriter(ctx); err != nil {
		return false, q.errorf(op, err)
	}
	defer q.f.unlockWriter()
	conn, err := q.d.db.Conn(ctx)
	if err != nil {
		return false, q.errorf(op, err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return false, q.errorf(op, err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		// The rollback must run even when ctx is what ended the transaction.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, rerr := conn.ExecContext(rctx, "ROLLBACK"); rerr != nil {
			// The transaction may still be open: the connection must not go back to
			// the pool holding the write lock.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			if err == nil {
				err = q.errorf(op+" rollback", rerr)
			}
		}
	}()
	if ok, err := fn(conn); err != nil || !ok {
		return false, err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return false, q.errorf(op+" commit", err)
	}
	committed = true
	return true, nil
}

func changed(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// scanIDs reads a result of ids.
func scanIDs(rows *sql.Rows) ([]int64, error) {
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return ids, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}
