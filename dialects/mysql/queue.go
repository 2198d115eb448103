package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
	"github.com/rowactor/rowactor/dialects/sqlstmt"
)

// Open checks the subscription against the live database and builds its statements.
func (d *Dialect) Open(ctx context.Context, spec dialects.QueueSpec) (dialects.Queue, error) {
	if d.isClosed() {
		return nil, fmt.Errorf("mysql: open table %s: %w", spec.Table.Name, errClosed)
	}
	moveCols, err := d.checkSpec(ctx, spec)
	if err != nil {
		return nil, err
	}
	t := spec.Table
	form := t.Form()
	max, err := d.attemptMax(ctx, t)
	if err != nil {
		return nil, err
	}
	base := queue{
		d:          d,
		attemptMax: max,
		name:       t.Name,
		group:      spec.Group,
		hasAttempt: t.Attempt != "",
		hasHeaders: t.Headers != "",
		settle:     buildSettle(spec, form, max, moveCols),
	}
	events, err := d.compileEvents(ctx, spec)
	if err != nil {
		return nil, err
	}
	base.events = events
	var (
		q     dialects.Queue
		texts []string
	)
	// A transactional subscription's queue (or its claims, or its sessions) also serves
	// the form's transactional interface; any declared isolation level is allowed, since
	// InnoDB's UPDATE and DELETE read the latest row version at every level, so the fenced
	// settlements see the renewer's extensions.
	switch form {
	case dialects.FormLease:
		lq := newLeaseQueue(base, t)
		q, texts = lq, lq.texts()
		if spec.Transactional {
			q = txLeaseQueue{lq}
		}
		if t.FIFO {
			f := newFIFOLease(lq, t)
			texts = append(texts, f.fifo.texts()...)
			if spec.Transactional {
				q = fifoTxLeaseQueue{txLeaseQueue{lq}, f}
			} else {
				q = fifoLeaseQueue{lq, f}
			}
		}
	case dialects.FormAdvisory:
		aq, err := newAdvisoryQueue(base, t)
		if err != nil {
			return nil, err // CheckDescription has already refused a malformed template
		}
		aq.transactional = spec.Transactional
		q, texts = aq, aq.texts()
	default:
		if t.FIFO {
			fq := newFIFORowLockQueue(base, t)
			fq.q.transactional = spec.Transactional
			q, texts = fq, fq.texts()
			break
		}
		rq := newRowLockQueue(base, t)
		rq.transactional = spec.Transactional
		q, texts = rq, rq.texts()
	}
	if err := d.prepareAll(ctx, append(texts, base.settle.texts()...)...); err != nil {
		return nil, base.errorf("prepare", err)
	}
	return q, nil
}

// queue is what every form shares: the table, the group, the settlements.
type queue struct {
	d *Dialect
	// attemptMax is where the attempt counter stops: the column type's largest value.
	attemptMax int64
	name       string
	group      string
	hasAttempt bool
	hasHeaders bool
	settle     settleSQL
	// events are the subscription's own statements by name (events.go).
	events map[string]dialects.Event
}

// Close has nothing to release: the prepared statements belong to the Dialect, which
// shares them between queues on the same table and closes them itself.
func (q *queue) Close() error { return nil }

func (q *queue) errorf(op string, err error) error {
	return fmt.Errorf("mysql: %s on table %s: %w", op, q.name, err)
}

// settleSQL holds the settlement statements of one subscription, with ? placeholders in
// a fixed order: the SET values, the error (when the table has an error column), the id,
// then (lease form) the token. The lease form's statements are fenced by the token and
// clear the lease; the others name the id only, since the row lock or the key excludes
// every other delivery. An empty text means the step writes nothing, or (retryAfter,
// snooze, dead letters) that the table cannot run it.
//
// A lease table without a retry_after column delays a row (retryAfter, snooze) by leaving
// it leased until then: locked_until = at (parks; see dialects.StepRetryAfter).
type settleSQL struct {
	ack    string // [processed_at, [error,]] id[, token]
	ackNow bool   // ack sets processed_at
	// hasErr says the table has an error column: every statement but release binds the
	// outcome's error after its SET values (the move's insert binds it first).
	hasErr     bool
	release    string // lease form: id, token
	retry      string // [error,] id[, token]: see below
	retryAfter string // at, [error,] id[, token]
	snooze     string // at, [error,] id[, token]
	parks      bool   // retryAfter and snooze write locked_until (lease form, no retry_after)
	deadGroup  string // dest, [dead_at,] [error,] id[, token]
	destGroup  string
	deadAt     bool     // deadGroup binds dead_at (the table describes DeadAt)
	moveInsert string   // moveVals, id[, token]
	moveVals   []string // the roles whose values moveInsert binds first, in order (Error, DeadAt)
	moveDelete string   // id[, token]
	// retryNeedsError: the advisory form's retry writes only the error (the take counted
	// the attempt, the unlock returns the row), so it runs only for a step with one.
	retryNeedsError bool
	// ackUnstarted and giveBack are the ack and the release of a delivery whose handler
	// never started (Step.Unstarted): they also give back the attempt the lease and
	// advisory forms' claim counted. ackUnstarted binds as ack; giveBack binds id[,
	// token], and is empty where nothing needs writing (the row lock form, an advisory
	// table without an attempt column).
	ackUnstarted string
	giveBack     string
}

// buildSettle builds the settlements; attemptMax is where the row lock form's count stops,
// moveCols the columns a move into the dead-letter table copies (deadLetterColumns).
func buildSettle(spec dialects.QueueSpec, form dialects.Form, attemptMax int64, moveCols []adminsql.MoveColumn) settleSQL {
	t := spec.Table
	lease := form == dialects.FormLease
	tq := quote(t.Name)
	where := " WHERE " + quote(t.ID) + " = ?"
	unlease := ""
	if lease {
		where += " AND " + quote(t.LockedUntil) + " = ?"
		unlease = ", " + quote(t.LockedUntil) + " = NULL"
	}
	keepErr := ""
	if t.Error != "" {
		keepErr = ", " + quote(t.Error) + " = " + sqlpart.KeepError(quote(t.Error), "?")
	}
	count := ""
	if form == dialects.FormRowLock && t.Attempt != "" {
		// The row lock form counts the attempt when a retry returns the row.
		count = ", " + quote(t.Attempt) + " = " + sqlpart.CountAttempt(quote(t.Attempt), attemptMax)
	}
	uncount := ""
	if form != dialects.FormRowLock && t.Attempt != "" {
		// The claim counted the attempt; a snooze, and a row given back unstarted, give it
		// back.
		uncount = ", " + quote(t.Attempt) + " = " + sqlpart.UncountAttempt(quote(t.Attempt))
	}
	delay, delayUnlease := t.RetryAfter, unlease
	s := settleSQL{hasErr: t.Error != ""}
	if lease && delay == "" {
		delay, delayUnlease, s.parks = t.LockedUntil, "", true
	}
	if t.ProcessedAt != "" {
		ackErr := ""
		if t.Error != "" {
			// An ack writes the outcome's error as is: NULL clears a failed attempt's.
			ackErr = ", " + quote(t.Error) + " = ?"
		}
		s.ack = "UPDATE " + tq + " SET " + quote(t.ProcessedAt) + " = ?" + unlease + t.ClearUniqueKey(quote) + ackErr + where
		s.ackUnstarted = "UPDATE " + tq + " SET " + quote(t.ProcessedAt) + " = ?" + unlease + t.ClearUniqueKey(quote) + uncount + ackErr + where
		s.ackNow = true
	} else {
		s.ack = "DELETE FROM " + tq + where
		s.ackUnstarted = s.ack // the row is gone: no count to give back
	}
	if lease {
		s.release = "UPDATE " + tq + " SET " + quote(t.LockedUntil) + " = NULL" + where
		s.giveBack = "UPDATE " + tq + " SET " + quote(t.LockedUntil) + " = NULL" + uncount + where
		s.retry = "UPDATE " + tq + " SET " + quote(t.LockedUntil) + " = NULL" + keepErr + where
	} else if set := count + keepErr; set != "" {
		s.retry = "UPDATE " + tq + " SET" + strings.TrimPrefix(set, ",") + where
		s.retryNeedsError = form == dialects.FormAdvisory
	}
	if form == dialects.FormAdvisory && uncount != "" {
		// The take counted; the unlock that follows returns the row.
		s.giveBack = "UPDATE " + tq + " SET" + strings.TrimPrefix(uncount, ",") + where
	}
	if delay != "" {
		s.retryAfter = "UPDATE " + tq + " SET " + quote(delay) + " = ?" + delayUnlease + count + keepErr + where
		s.snooze = "UPDATE " + tq + " SET " + quote(delay) + " = ?" + delayUnlease + uncount + keepErr + where
	}
	if spec.DeadLetterGroup != "" {
		deadAt := ""
		if t.DeadAt != "" {
			deadAt, s.deadAt = ", "+quote(t.DeadAt)+" = ?", true
		}
		s.deadGroup = "UPDATE " + tq + " SET " + quote(t.Group) + " = ?" + deadAt + unlease + keepErr + where
		s.destGroup = spec.DeadLetterGroup
	} else if spec.DeadLetterTable != "" {
		// The whole row: every column both tables share, read from the catalog at Open.
		// The error's and dead_at's ? come before the WHERE's, in column order: each role
		// is copied once.
		into, sel := adminsql.MoveLists(moveCols, false, quote, func(c adminsql.MoveColumn) string {
			switch {
			case c.Role == "UniqueKey":
				return "NULL" // the key is free again: the queue table no longer holds the row
			case lease && c.Role == "LockedUntil":
				return "NULL" // the moved row arrives without a lease
			case c.Role == "Error":
				s.moveVals = append(s.moveVals, c.Role)
				return sqlpart.KeepError(quote(c.Name), "?")
			case c.Role == "DeadAt":
				s.moveVals = append(s.moveVals, c.Role)
				return "?" // the row died now
			}
			return ""
		})
		s.moveInsert = "INSERT INTO " + quote(spec.DeadLetterTable) + " (" + into + ") SELECT " + sel + " FROM " + tq + where
		s.moveDelete = "DELETE FROM " + tq + where
	}
	return s
}

// texts lists the statements to prepare: the move's too, which checks it against the live
// schema although it runs inside a transaction.
func (s *settleSQL) texts() []string {
	return []string{s.ack, s.release, s.ackUnstarted, s.giveBack, s.retry, s.retryAfter, s.snooze, s.deadGroup, s.moveInsert, s.moveDelete}
}

var (
	errNoRetryAfter = errors.New("the table has no retry_after column")
	errNoDeadLetter = errors.New("the subscription has no dead letter (DeadLetterGroup or DeadLetterTable)")
)

// statement returns the text and arguments of a step's one statement. fence is appended
// after the id (the lease token). move reports a dead letter into a table, which runs as
// two statements in a transaction with args (move). An empty text with no error means
// the step writes nothing in this form.
func (s *settleSQL) statement(step dialects.Step, id int64, fence ...any) (text string, args []any, move bool, err error) {
	key := append([]any{id}, fence...)
	// with binds a statement's SET values, then the error, then the key.
	with := func(values ...any) []any {
		if s.hasErr {
			values = append(values, step.ErrorValue())
		}
		return append(values, key...)
	}
	switch step.Kind {
	case dialects.StepAck:
		text := s.ack
		if step.Unstarted {
			text = s.ackUnstarted
		}
		if s.ackNow {
			return text, with(dbTime(step.Now)), false, nil
		}
		return text, key, false, nil
	case dialects.StepRetry:
		if s.retry == "" || (s.retryNeedsError && step.Error == "") {
			return "", nil, false, nil
		}
		return s.retry, with(), false, nil
	case dialects.StepRelease:
		text := s.release
		if step.Unstarted {
			text = s.giveBack
		}
		if text != "" {
			return text, key, false, nil
		}
		return "", nil, false, nil
	case dialects.StepRetryAfter, dialects.StepSnooze:
		text := s.retryAfter
		if step.Kind == dialects.StepSnooze {
			text = s.snooze
		}
		if text == "" {
			return "", nil, false, errNoRetryAfter
		}
		return text, with(s.parkAt(step.At, fence)), false, nil
	case dialects.StepDeadLetter:
		switch {
		case s.deadGroup != "":
			if s.deadAt {
				return s.deadGroup, with(s.destGroup, dbTime(step.Now)), false, nil
			}
			return s.deadGroup, with(s.destGroup), false, nil
		case s.moveInsert != "":
			var args []any
			for _, role := range s.moveVals {
				if role == "Error" {
					args = append(args, step.ErrorValue())
				} else {
					args = append(args, dbTime(step.Now))
				}
			}
			return "", append(args, key...), true, nil
		}
		return "", nil, false, errNoDeadLetter
	}
	return "", nil, false, fmt.Errorf("unknown step %v", step.Kind)
}

// parkAt is the time a delayed row waits for. A row parked in its lease must change when
// parked, for MySQL counts only changed rows and an unchanged row reads as a lost lease:
// a time equal to the token (as stored) moves one microsecond on.
func (s *settleSQL) parkAt(at time.Time, fence []any) time.Time {
	at = dbTime(at)
	if s.parks && len(fence) > 0 {
		if token, ok := fence[0].(time.Time); ok && at.Equal(token) {
			at = at.Add(time.Microsecond)
		}
	}
	return at
}

// execer runs a statement: a pool, a transaction or a dedicated connection.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// move copies the row into the dead-letter table and deletes it inside tx, and reports
// whether both statements changed exactly the row. The caller commits only then: at READ
// COMMITTED the copy reads without locking, so a row taken by someone else between the
// two statements must not be committed as moved (it would exist twice).
func (q *queue) move(ctx context.Context, tx execer, args []any) (bool, error) {
	copied, err := affected(tx.ExecContext(ctx, q.settle.moveInsert, args...))
	if err != nil {
		return false, fmt.Errorf("copy: %w", err)
	}
	args = args[len(q.settle.moveVals):] // the copy's error and dead_at values; the delete names the row alone
	deleted, err := affected(tx.ExecContext(ctx, q.settle.moveDelete, args...))
	if err != nil {
		return false, fmt.Errorf("delete: %w", err)
	}
	return copied == 1 && deleted == 1, nil
}

func affected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// isolation maps a declared level to database/sql's; nothing declared is READ COMMITTED,
// since REPEATABLE READ's gap locks would block inserts while a claim is held.
func isolation(level dialects.Isolation) sql.IsolationLevel {
	switch level {
	case dialects.ReadUncommitted:
		return sql.LevelReadUncommitted
	case dialects.RepeatableRead:
		return sql.LevelRepeatableRead
	case dialects.Serializable:
		return sql.LevelSerializable
	}
	return sql.LevelReadCommitted
}

// txn is a transaction on a pool connection of its own, so that a connection whose
// transaction may still be open is closed rather than pooled: database/sql returns a
// connection to the pool after a failed COMMIT or ROLLBACK unless the driver marked it
// bad, and a server error does not.
type txn struct {
	conn *sql.Conn
	tx   *sql.Tx
	// stop ends the transaction's context (it outlives the call that began it in the
	// row lock form).
	stop context.CancelFunc
	once sync.Once
	// lent says the transaction is lent to a handler (lend): its connection runs with
	// autocommit off until the transaction ends, and end turns it back on.
	lent bool
	// killed says cutTx killed the transaction's server session: its connection is
	// discarded at the end, never returned to the pool.
	killed atomic.Bool
	// d prepares the texts the transaction ran unprepared (stmt) once it has ended.
	d          *Dialect
	unprepared []string
	// session is the connection's server session id, once read (sessionID).
	session int64
}

// prepareWait bounds how long prepareLater waits for a pool connection.
const prepareWait = 50 * time.Millisecond

// stmt returns text's statement for use in the transaction. A text the Dialect has not
// prepared yet (an id list of a length not met before) is prepared on the transaction's
// own connection, and for the pool once the transaction has ended: preparing it for the
// pool now would wait for a second connection while holding this one, and when every
// connection of a small pool is held so (claims, batched settlements), none is ever freed
// (seen: two subscriptions on a pool of 4, every claim stuck until its 30 s deadline).
func (x *txn) stmt(ctx context.Context, text string) (*sql.Stmt, error) {
	if s := x.d.stmts.Cached(text); s != nil {
		return x.tx.StmtContext(ctx, s), nil
	}
	x.unprepared = append(x.unprepared, text)
	return x.tx.PrepareContext(ctx, text)
}

// prepareLater prepares, for the pool, the texts the transaction prepared for itself
// alone; it runs after the transaction gave its connection back, holding none. It must
// not hold up its caller (a renewal round, a claim, a settlement) on a pool whose
// connections are all taken: it prepares only while a connection is idle, and waits at
// most prepareWait for one. A text not prepared is left to the next transaction, which
// prepares it for itself again.
func (x *txn) prepareLater() {
	if len(x.unprepared) == 0 || x.d == nil || x.d.db.Stats().Idle == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), prepareWait)
	defer cancel()
	for _, text := range x.unprepared {
		_, _ = x.d.stmts.Stmt(ctx, text)
	}
	x.unprepared = nil
}

// begin opens a transaction at level on a pool connection of its own (see beginTx).
func (d *Dialect) begin(ctx context.Context, level sql.IsolationLevel) (*txn, error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	tx, stop, err := beginTx(ctx, conn, level)
	if err != nil {
		discard(conn)
		return nil, err
	}
	return &txn{conn: conn, tx: tx, stop: stop, d: d}, nil
}

// beginTx opens a transaction at level on conn. The transaction's context is ctx's values
// without its end: the transaction lives until commit or rollback (or stop); ctx ends only
// the opening. database/sql's BeginTx with an isolation level makes the driver send SET
// TRANSACTION ISOLATION LEVEL (next transaction only) before START TRANSACTION. On an
// error the connection's state is unknown: the caller closes it.
func beginTx(ctx context.Context, conn *sql.Conn, level sql.IsolationLevel) (*sql.Tx, context.CancelFunc, error) {
	txCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	// While opening, ctx's end still cancels: the driver then closes the connection.
	unhook := context.AfterFunc(ctx, stop)
	tx, err := conn.BeginTx(txCtx, &sql.TxOptions{Isolation: level})
	if !unhook() && err == nil {
		// ctx ended just as the transaction opened: stop has run or is about to, and
		// would end the transaction under its user.
		_ = tx.Rollback()
		err = ctx.Err()
	}
	if err != nil {
		stop()
		return nil, nil, err
	}
	return tx, stop, nil
}

// commit commits and frees the connection; it closes the connection when the commit
// fails, so that no transaction left open reaches the pool.
func (x *txn) commit() error {
	err := x.tx.Commit()
	x.end(err)
	return err
}

// rollback rolls back and frees the connection, closing it when the rollback fails (the
// server then rolls back itself).
func (x *txn) rollback() error {
	err := x.tx.Rollback()
	if errors.Is(err, sql.ErrTxDone) {
		// Ended already, by its context: database/sql rolled it back, but whether that
		// worked is unknown, so the connection is closed all the same.
		x.end(err)
		return nil
	}
	x.end(err)
	return err
}

func (x *txn) end(err error) {
	x.once.Do(func() {
		x.stop()
		if err == nil && x.lent {
			err = restoreAutocommit(x.conn)
		}
		if err != nil || x.killed.Load() {
			discard(x.conn)
		} else {
			_ = x.conn.Close()
		}
		x.prepareLater()
	})
}

// A transaction lent to a handler (transactional mode) must never commit in part. When
// InnoDB ends a transaction on its own (a deadlock's victim is rolled back whole, its
// locks and savepoints with it), the driver does not know: the *sql.Tx still looks open,
// and with autocommit on, every later statement through it (the handler's, the
// settlement's) would commit on its own. So a lent transaction runs with autocommit off
// on its connection: a statement after the server's rollback opens an implicit
// transaction instead, which ends with the delivery's, rolled back. And the settlement
// first checks that the transaction is still the one begun (alive), by the savepoint set
// when it was lent: once the server rolled the transaction back, the savepoint is gone.
// When the transaction ends, autocommit is turned back on before the connection returns
// to the pool (restoreAutocommit), or the connection is closed.
//
// Cost per transactional delivery, in statements: SET autocommit = 0 and SAVEPOINT when
// lent (the row lock form's claimer already set its savepoint, now set here instead),
// RELEASE SAVEPOINT at the settlement that commits, SET autocommit = 1 at the end.

// savepoint is set when a transaction is lent: the row lock form rolls back to it to
// discard the handler's writes and keep the row; every form checks it is still there
// before committing.
const savepoint = "rowactor_claim"

// errNoSavepoint is ER_SP_DOES_NOT_EXIST: the savepoint named is not in the current
// transaction, which the server ended since it was set.
const errNoSavepoint = 1305

// sessionID is the server session (CONNECTION_ID) of the transaction's connection, read
// once, for killCut.
func (x *txn) sessionID(ctx context.Context) (int64, error) {
	if x.session == 0 {
		if err := x.tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&x.session); err != nil {
			return 0, fmt.Errorf("read the connection's id: %w", err)
		}
	}
	return x.session, nil
}

// cutTx kills the server session of x (id) when err is the failure of a statement whose
// context ended, while x still holds its connection: the caller then rolls x back, and its
// end discards the connection. Killed after the connection went back to the pool, the
// session could be another caller's by then.
func (d *Dialect) cutTx(ctx context.Context, x *txn, id int64, err error) {
	if id != 0 && ctx.Err() != nil && err != nil {
		x.killed.Store(true)
		d.killSession(id)
	}
}

// killCut kills server session id when err is the failure of a statement whose context
// ended. The driver gives up on such a statement by closing its socket, but the server
// does not notice while the statement waits in a row lock's queue: it would run the
// statement when the lock comes (and commit it, in autocommit) and hold the session's
// locks, transaction and GET_LOCK keys meanwhile. Killed, the session ends at once.
//
// Only a statement that failed because ctx ended is killed: the driver then closed its
// connection, which never returns to the pool. A statement that failed otherwise (a
// deadlock, say) as ctx ended may have left a healthy connection that the pool has lent
// to someone else by now: killing its session would end another caller's work.
func (d *Dialect) killCut(ctx context.Context, id int64, err error) {
	if id != 0 && ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		d.killSession(id)
	}
}

// killSession ends server session id, whose statement its caller gave up on (its
// connection is closed already): its transaction rolls back and its locks go at once.
func (d *Dialect) killSession(id int64) {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Best effort: a session that ended already (ER_NO_SUCH_THREAD) needs nothing, and
	// one that cannot be killed ends at its lock wait timeout, as before.
	_, _ = d.db.ExecContext(c, fmt.Sprintf("KILL CONNECTION %d", id))
}

// lend readies tx, just begun (or just claimed), for a handler: autocommit off on its
// connection, then the savepoint. The caller marks its txn lent before, so that the end
// turns autocommit back on whatever happened here.
func lend(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, "SET autocommit = 0"); err != nil {
		return fmt.Errorf("lend the transaction: %w", err)
	}
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+savepoint); err != nil {
		return fmt.Errorf("lend the transaction: %w", err)
	}
	return nil
}

// alive checks that a lent transaction is still the one begun, by releasing its savepoint
// (so it runs once, right before the settlement that commits). An error wraps
// dialects.ErrTxEnded when the server ended the transaction: the savepoint is gone, and
// whatever ran through the *sql.Tx since is in an implicit transaction that the caller
// rolls back; or the release itself is the first statement to learn of the end (1213).
func alive(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT "+savepoint)
	if err == nil {
		return nil
	}
	switch serverError(err) {
	case errNoSavepoint:
		return fmt.Errorf("%w (the savepoint set when it was lent is gone: %w)", dialects.ErrTxEnded, err)
	case errDeadlock:
		// The transaction ended while nothing ran through it: a Galera node's applier
		// aborted it (a write set from another node that conflicts with its locks), and
		// the next statement, this one, reports the abort as a deadlock.
		return fmt.Errorf("%w (aborted while idle: %w)", dialects.ErrTxEnded, err)
	}
	return fmt.Errorf("check the transaction: %w", err)
}

// ended wraps the error of a statement run in a lent transaction with dialects.ErrTxEnded
// when the server ended the transaction with it: a deadlock rolls the whole transaction
// back (a lock wait timeout only the statement).
func ended(err error) error {
	if err != nil && serverError(err) == errDeadlock && !errors.Is(err, dialects.ErrTxEnded) {
		return fmt.Errorf("%w: %w", dialects.ErrTxEnded, err)
	}
	return err
}

// serverError is the server's error number in err, 0 when it holds none.
func serverError(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// restoreAutocommit turns autocommit back on for a lent transaction's connection once the
// transaction ended cleanly (no transaction is open: SET autocommit = 1 commits nothing).
func restoreAutocommit(conn *sql.Conn) error {
	ctx, cancel := cleanupCtx(context.Background())
	defer cancel()
	if _, err := conn.ExecContext(ctx, "SET autocommit = 1"); err != nil {
		return fmt.Errorf("restore autocommit: %w", err)
	}
	return nil
}

// discard closes a dedicated connection instead of returning it to the pool. Raw's
// function returning driver.ErrBadConn makes database/sql close the driver connection
// (the server then ends the session: its transaction rolls back and its locks go); the
// *sql.Conn is done afterwards, so its Close only reports ErrConnDone.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// cleanupCtx bounds a rollback or an unlock that must run even when the caller's context
// is what ended the work.
func cleanupCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
}

// scanRow reads id, payload[, attempt][, headers] from the current row. A row whose values
// do not scan is returned flagged (Row.Fault), and the result goes on.
func (q *queue) scanRow(rows *sql.Rows) (dialects.Row, error) {
	r, _, err := q.scanRowAttempt(rows)
	return r, err
}

// scanRowAttempt is scanRow also keeping the attempt column as read, for a statement to
// compare with it (<=>): an int64, or nil when it is NULL (or the table has no attempt
// column). For a row returned flagged it is the value as the driver gave it (rawAttempt).
func (q *queue) scanRowAttempt(rows *sql.Rows) (dialects.Row, any, error) {
	var (
		r       dialects.Row
		attempt sql.NullInt64
	)
	dest := []any{&r.ID, &r.Payload}
	if q.hasAttempt {
		dest = append(dest, &attempt)
	}
	if q.hasHeaders {
		dest = append(dest, &r.Headers)
	}
	if err := rows.Scan(dest...); err != nil {
		r, err := sqlstmt.Unreadable(rows, q.name, err)
		if err != nil || !q.hasAttempt {
			return r, nil, err
		}
		return r, q.rawAttempt(rows), nil
	}
	if r.Payload == nil {
		r.Payload = []byte{}
	}
	r.Attempt = int(attempt.Int64)
	var read any
	if attempt.Valid {
		read = attempt.Int64
	}
	return r, read, nil
}
