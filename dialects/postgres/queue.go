package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

// Open checks the subscription against the live database, builds its statements once and
// prepares each of them against the live table.
func (d *Dialect) Open(ctx context.Context, spec dialects.QueueSpec) (dialects.Queue, error) {
	moveCols, err := d.checkSpec(ctx, spec)
	if err != nil {
		return nil, err
	}
	t := spec.Table
	max, err := d.attemptMax(ctx, t)
	if err != nil {
		return nil, err
	}
	base := queue{
		d:          d,
		attemptMax: max,
		name:       t.Name,
		group:      spec.Group,
		dest:       spec.DeadLetterGroup,
		hasAttempt: t.Attempt != "",
		hasHeaders: t.Headers != "",

		transactional: spec.Transactional,
		txOptions:     txOptions(t.Isolation),
		beginText:     beginSQL(t.Isolation),
	}
	events, err := d.compileEvents(ctx, spec)
	if err != nil {
		return nil, err
	}
	base.events = events
	var (
		q     dialects.Queue
		stmts []stmt
	)
	switch t.Form() {
	case dialects.FormLease:
		base.settle = buildSettle(spec, dialects.FormLease, max, moveCols)
		lq := newLeaseQueue(base, t)
		if t.FIFO {
			lq.claim, lq.guard = fifoLeaseClaim(t, max), guardSQL(t)
		}
		q, stmts = lq, append(lq.settle.all(), lq.claim, lq.guard, lq.extend, stmt{text: lq.confirm},
			stmt{text: lq.batch.ack}, stmt{text: lq.batch.release})
		switch {
		case spec.Transactional && t.FIFO:
			q = fifoTxLeaseQueue{&txLeaseQueue{lq}}
		case spec.Transactional:
			q = &txLeaseQueue{lq}
		case t.FIFO:
			q = fifoLeaseQueue{lq}
		}
	case dialects.FormAdvisory:
		base.settle = buildSettle(spec, dialects.FormAdvisory, max, moveCols)
		aq, err := newAdvisoryQueue(base, t)
		if err != nil {
			return nil, err
		}
		q, stmts = aq, append(aq.settle.all(), aq.candidates, aq.take, stmt{text: lockText}, stmt{text: unlockText})
	default:
		base.settle = buildSettle(spec, dialects.FormRowLock, max, moveCols)
		if t.FIFO {
			fq := newFIFORowLockQueue(base, t)
			q, stmts = fq, fq.stmts()
			break
		}
		rq := newRowLockQueue(base, t)
		q, stmts = rq, append(rq.settle.all(), rq.claim, rq.claimN, rq.claimSkip, rq.claimNSkip)
	}
	if err := d.prepare(ctx, t.Name, stmts); err != nil {
		return nil, err
	}
	return q, nil
}

// queue is what every form shares: the table, the subscription's group, the settlements.
type queue struct {
	d *Dialect
	// attemptMax is where the attempt counter stops: the column type's largest value.
	attemptMax int64
	name       string
	group      string
	dest       string // the dead-letter group
	hasAttempt bool
	hasHeaders bool
	settle     settleSQL
	// events are the subscription's own statements by name, in $n syntax.
	events map[string]dialects.Event

	// transactional lends each delivery a transaction, opened with txOptions (the
	// table's isolation level; the row lock claim transaction opens with it too).
	transactional bool
	txOptions     pgx.TxOptions
	// beginText opens a transaction as txOptions does, for a BEGIN sent with the
	// statement that follows it (a row lock claim's: connTx).
	beginText string
}

// Close has nothing to release: pgx prepares and caches statements per connection.
func (q *queue) Close() error { return nil }

func (q *queue) errorf(op string, err error) error {
	return fmt.Errorf("postgres: %s on table %s: %w", op, q.name, err)
}

// bind starts a statement's values with the subscription's own.
func (q *queue) bind() bind { return bind{group: q.group, dest: q.dest} }

// querier runs statements: the pool, a connection, or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// exec runs one write statement and reports whether it changed a row.
func (q *queue) exec(ctx context.Context, db querier, op string, s stmt, b *bind) (bool, error) {
	tag, err := db.Exec(ctx, s.text, s.args(b)...)
	if err != nil {
		return false, q.errorf(op, err)
	}
	return tag.RowsAffected() > 0, nil
}

// settleSQL holds one subscription's settlement statements. The lease form's are fenced
// by the token and clear the lease; the row lock and advisory forms' name the id only,
// since the row lock or the key excludes every other delivery. An empty text is a step
// the table cannot run, or (retry, release) one with nothing to write.
type settleSQL struct {
	ack     stmt
	release stmt // lease form: clear the lease
	// ackUnstarted and giveBack are the ack and the release of a delivery whose handler
	// never started (Step.Unstarted): they also give back the attempt the lease and
	// advisory forms' claim counted. giveBack is empty where nothing needs writing (the
	// row lock form, an advisory table without an attempt column).
	ackUnstarted stmt
	giveBack     stmt
	// retry returns the row at once: the row lock form counts the attempt, the lease form
	// clears the lease; either writes the outcome's error into the error column. The
	// advisory form writes only the error (the take counted; the unlock returns the row),
	// and runs it only for a step that carries one (retryNeedsError).
	retry           stmt
	retryNeedsError bool
	retryAfter      stmt
	snooze          stmt
	deadGroup       stmt
	move            stmt // into the dead-letter table, in one statement
}

func (s *settleSQL) all() []stmt {
	return []stmt{s.ack, s.release, s.ackUnstarted, s.giveBack, s.retry, s.retryAfter, s.snooze, s.deadGroup, s.move}
}

// buildSettle builds the settlements; attemptMax is where the row lock form's count stops,
// moveCols the columns a move into the dead-letter table copies (deadLetterColumns).
//
// A lease table without a retry_after column delays a row (retry_after, snooze) by
// leaving it leased until then: locked_until = at (see dialects.StepRetryAfter).
func buildSettle(spec dialects.QueueSpec, form dialects.Form, attemptMax int64, moveCols []adminsql.MoveColumn) settleSQL {
	p := newSettleParts(spec.Table, form, attemptMax)
	var s settleSQL
	s.ack, s.ackUnstarted = p.ack(""), p.ack(p.uncount)
	s.release, s.giveBack = p.returns()
	s.retry, s.retryNeedsError = p.retry()
	if p.delay != "" {
		s.retryAfter, s.snooze = p.delayed()
	}
	switch {
	case spec.DeadLetterGroup != "":
		s.deadGroup = p.deadGroup()
	case spec.DeadLetterTable != "":
		s.move = p.move(spec.DeadLetterTable, moveCols)
	}
	return s
}

// settleParts is what buildSettle's statements share: the table, the form, and the
// assignments a settlement adds to its SET list.
type settleParts struct {
	t     dialects.Table
	tq    string
	form  dialects.Form
	lease bool
	// unlease clears the lease (lease form only).
	unlease string
	// count counts the attempt: the row lock form counts it when a retry returns the row.
	count string
	// uncount gives back the attempt the claim counted (lease and advisory forms): a
	// snooze, and a row given back unstarted.
	uncount string
	// delay is the column a delayed row waits in, and delayUnlease what else its
	// statement sets.
	delay, delayUnlease string
}

func newSettleParts(t dialects.Table, form dialects.Form, attemptMax int64) settleParts {
	p := settleParts{t: t, tq: quote(t.Name), form: form, lease: form == dialects.FormLease}
	if p.lease {
		p.unlease = ", " + quote(t.LockedUntil) + " = NULL"
	}
	if form == dialects.FormRowLock && t.Attempt != "" {
		p.count = ", " + quote(t.Attempt) + " = " + sqlpart.CountAttempt(quote(t.Attempt), attemptMax)
	}
	if form != dialects.FormRowLock && t.Attempt != "" {
		p.uncount = ", " + quote(t.Attempt) + " = " + sqlpart.UncountAttempt(quote(t.Attempt))
	}
	p.delay, p.delayUnlease = t.RetryAfter, p.unlease
	if p.lease && p.delay == "" {
		p.delay, p.delayUnlease = t.LockedUntil, ""
	}
	return p
}

// where writes the fence: the id, and the token in the lease form.
func (p *settleParts) where(w *builder) {
	w.w(" WHERE ", quote(p.t.ID), " = ", w.p(pID))
	if p.lease {
		w.w(" AND ", quote(p.t.LockedUntil), " = ", w.p(pToken))
	}
}

// keepErr writes the outcome's error, or keeps the column's, in a statement that
// returns or moves the row.
func (p *settleParts) keepErr(w *builder) string {
	if p.t.Error == "" {
		return ""
	}
	return ", " + quote(p.t.Error) + " = " + sqlpart.KeepError(quote(p.t.Error), w.p(pErr))
}

// ack writes the ack; extra is what else it sets (the unstarted ack's uncount).
func (p *settleParts) ack(extra string) stmt {
	t := p.t
	var w builder
	if t.ProcessedAt != "" {
		w.w("UPDATE ", p.tq, " SET ", quote(t.ProcessedAt), " = ", w.p(pNow), p.unlease, t.ClearUniqueKey(quote), extra)
		if t.Error != "" {
			// An ack writes the outcome's error as is: NULL clears a failed attempt's.
			w.w(", ", quote(t.Error), " = ", w.p(pErr))
		}
	} else {
		w.w("DELETE FROM ", p.tq) // the row is gone: no count to give back
	}
	p.where(&w)
	return w.stmt()
}

// returns builds the statements that return a row unsettled: release (lease form) and
// giveBack, which also gives back the attempt the claim counted. In the advisory form
// giveBack only uncounts: the unlock that follows returns the row.
func (p *settleParts) returns() (release, giveBack stmt) {
	var w builder
	if p.lease {
		w.w("UPDATE ", p.tq, " SET ", quote(p.t.LockedUntil), " = NULL")
		p.where(&w)
		release = w.stmt()
		w = builder{}
		w.w("UPDATE ", p.tq, " SET ", quote(p.t.LockedUntil), " = NULL", p.uncount)
		p.where(&w)
		return release, w.stmt()
	}
	if p.uncount != "" {
		w.w("UPDATE ", p.tq, " SET ", p.uncount[2:])
		p.where(&w)
		giveBack = w.stmt()
	}
	return release, giveBack
}

// retry builds the retry: the lease form ends the lease and records the error, the row
// lock form counts the attempt and records the error, the advisory form records the
// error only, and needsError says it runs only for a step that carries one.
func (p *settleParts) retry() (retry stmt, needsError bool) {
	t := p.t
	var w builder
	switch {
	case p.lease:
		w.w("UPDATE ", p.tq, " SET ", quote(t.LockedUntil), " = NULL", p.keepErr(&w))
		p.where(&w)
		return w.stmt(), false
	case p.form == dialects.FormRowLock && (t.Attempt != "" || t.Error != ""):
		set := p.count + p.keepErr(&w)
		w.w("UPDATE ", p.tq, " SET ", set[2:])
		p.where(&w)
		return w.stmt(), false
	case p.form == dialects.FormAdvisory && t.Error != "":
		w.w("UPDATE ", p.tq, " SET ", p.keepErr(&w)[2:])
		p.where(&w)
		return w.stmt(), true
	}
	return stmt{}, false
}

// delayed builds retry_after, which counts as a retry does, and snooze, which gives the
// claim's count back; both make the row due at the step's time.
func (p *settleParts) delayed() (retryAfter, snooze stmt) {
	var w builder
	w.w("UPDATE ", p.tq, " SET ", quote(p.delay), " = ", w.p(pAt), p.delayUnlease, p.count, p.keepErr(&w))
	p.where(&w)
	retryAfter = w.stmt()
	w = builder{}
	w.w("UPDATE ", p.tq, " SET ", quote(p.delay), " = ", w.p(pAt), p.delayUnlease, p.uncount, p.keepErr(&w))
	p.where(&w)
	return retryAfter, w.stmt()
}

// deadGroup builds the move to the dead-letter group: the row changes group.
func (p *settleParts) deadGroup() stmt {
	t := p.t
	var w builder
	w.w("UPDATE ", p.tq, " SET ", quote(t.Group), " = ", w.p(pDest))
	if t.DeadAt != "" {
		w.w(", ", quote(t.DeadAt), " = ", w.p(pNow)) // the row died now
	}
	w.w(p.unlease, p.keepErr(&w))
	p.where(&w)
	return w.stmt()
}

// move builds the move into the dead-letter table dest: the whole row, every column both
// tables share (moveCols, read from the catalog at Open), in one statement.
func (p *settleParts) move(dest string, moveCols []adminsql.MoveColumn) stmt {
	var w builder
	into, sel := adminsql.MoveLists(moveCols, false, quote, func(c adminsql.MoveColumn) string {
		switch {
		case c.Role == "UniqueKey":
			return "NULL" // the key is free again: the queue table no longer holds the row
		case p.lease && c.Role == "LockedUntil":
			return "NULL" // the moved row arrives without a lease
		case c.Role == "Error":
			return sqlpart.KeepError(quote(c.Name), w.p(pErr))
		case c.Role == "DeadAt":
			return w.p(pNow) // the row died now
		}
		return ""
	})
	returning := make([]string, len(moveCols))
	for i, c := range moveCols {
		returning[i] = quote(c.Name)
	}
	w.w("WITH moved AS (DELETE FROM ", p.tq)
	p.where(&w)
	// OVERRIDING SYSTEM VALUE keeps the row's id even when the dead-letter table's id
	// is GENERATED ALWAYS; it changes nothing for other tables.
	w.w(" RETURNING ", strings.Join(returning, ", "), ") INSERT INTO ", quote(dest), " (", into,
		") OVERRIDING SYSTEM VALUE SELECT ", sel, " FROM moved")
	return w.stmt()
}

var (
	errNoRetryAfter = errors.New("the table has no retry_after column")
	errNoDeadLetter = errors.New("the subscription has no dead letter (DeadLetterGroup or DeadLetterTable)")
)

// deadLetter returns the dead-letter statement, or an error when the subscription has none.
func (s *settleSQL) deadLetter() (stmt, error) {
	switch {
	case s.deadGroup.text != "":
		return s.deadGroup, nil
	case s.move.text != "":
		return s.move, nil
	}
	return stmt{}, errNoDeadLetter
}

// pick returns a built-in step's statement; an empty one writes nothing (a row lock
// release, a retry with nothing to count or record). It refuses a step the table cannot
// run.
func (s *settleSQL) pick(step dialects.Step) (stmt, error) {
	switch step.Kind {
	case dialects.StepAck:
		if step.Unstarted {
			return s.ackUnstarted, nil
		}
		return s.ack, nil
	case dialects.StepRetry:
		if s.retryNeedsError && step.Error == "" {
			return stmt{}, nil
		}
		return s.retry, nil
	case dialects.StepRelease:
		if step.Unstarted {
			return s.giveBack, nil
		}
		return s.release, nil
	case dialects.StepRetryAfter:
		if s.retryAfter.text == "" {
			return stmt{}, errNoRetryAfter
		}
		return s.retryAfter, nil
	case dialects.StepSnooze:
		if s.snooze.text == "" {
			return stmt{}, errNoRetryAfter
		}
		return s.snooze, nil
	case dialects.StepDeadLetter:
		return s.deadLetter()
	}
	return stmt{}, fmt.Errorf("unknown step %v", step.Kind)
}

// stepBind is the bind of a built-in step for row id.
func (q *queue) stepBind(step dialects.Step, id int64) bind {
	b := q.bind()
	b.id, b.now, b.at, b.err = id, step.Now, step.At, step.ErrorValue()
	return b
}

// scanRow reads id, payload[, attempt][, headers][, key]. A row whose values do not scan
// is returned flagged (Row.Fault), and the result goes on (scanValues).
func (q *queue) scanRow(rows pgx.Rows, withKey bool) (dialects.Row, error) {
	return q.rowScanner(withKey).scan(rows)
}

// rowScanner returns a scanner of a statement's rows, its destinations made once for all
// of them, in one allocation: a row scanned on its own put each destination on the heap,
// four allocations a row.
func (q *queue) rowScanner(withKey bool) *rowScanner {
	s := &rowScanner{q: q}
	s.dest = append(s.destBuf[:0], &s.r.ID, &s.r.Payload)
	if q.hasAttempt {
		s.dest = append(s.dest, &s.attempt)
	}
	if q.hasHeaders {
		s.dest = append(s.dest, &s.r.Headers)
	}
	if withKey {
		s.dest = append(s.dest, &s.key)
	}
	return s
}

type rowScanner struct {
	q       *queue
	r       dialects.Row
	attempt *int64
	key     *string
	dest    []any
	destBuf [5]any
}

// scan reads the row rows stands on. The payload and headers are the row's own: pgx
// copies a bytea column into a new slice.
func (s *rowScanner) scan(rows pgx.Rows) (dialects.Row, error) {
	s.r, s.attempt, s.key = dialects.Row{}, nil, nil
	if err := scanValues(rows, s.dest...); err != nil {
		return s.q.unreadable(rows, err)
	}
	r := s.r
	if r.Payload == nil {
		r.Payload = []byte{}
	}
	if s.attempt != nil {
		r.Attempt = int(*s.attempt)
	}
	if s.key != nil {
		r.Key = *s.key
	}
	return r, nil
}
