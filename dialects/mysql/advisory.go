package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

// advisoryQueue serves the advisory lock form with GET_LOCK, each key on a dedicated pool
// connection.
//
// Candidate.Key is the key text (e.g. "jobs-7"), as in the other dialects, and it is what
// a delivery reports as its key. The lock name is derived from it in SQL by one rendering
// (lockNameExpr): Candidates applies it to the row's key text to pass over keys in use,
// and sessions apply it to the key text they are given, so both name the same lock
// whatever the database's name or the key's characters; LockName computes it in Go.
type advisoryQueue struct {
	queue
	cl claimable
	// candidates: claimable args, then the limit.
	candidates string
	// read reads the row if it is still claimable and its key still renders to the key
	// locked: id, claimable args, key.
	read string
	// count counts the attempt (saturating at the column type's maximum, see
	// sqlpart.CountAttempt) if the row is still claimable, its key the one locked, and
	// its attempt the one read: id, claimable args, key, attempt. Empty without an
	// attempt column.
	count string
	// lock and unlock take the key text lockArgs times.
	lock, unlock string
	lockArgs     int
	// level is the table's isolation level, for transactional sessions.
	level sql.IsolationLevel
	// transactional: sessions lend a transaction to the handler (txSession).
	transactional bool
}

var _ dialects.AdvisoryQueue = (*advisoryQueue)(nil)

func newAdvisoryQueue(base queue, t dialects.Table) (*advisoryQueue, error) {
	key, err := keyText(t.AdvisoryKey)
	if err != nil {
		return nil, err
	}
	tq, id := quote(t.Name), quote(t.ID)
	cl := newClaimable(t, false)
	q := &advisoryQueue{
		queue: base,
		cl:    cl,
		candidates: "SELECT " + id + ", " + key + " FROM " + tq + " WHERE " + cl.where +
			" AND IS_USED_LOCK(" + lockNameExpr(key) + ") IS NULL ORDER BY " + t.ClaimOrder(quote, "") + " LIMIT ?",
		level: isolation(t.Isolation),
	}
	// The key compares as bytes: the column's collation could call keys equal that differ
	// in letter case or trailing spaces, and those name other locks.
	sameKey := "CAST(" + key + " AS BINARY) = CAST(" + utf8mb4("?") + " AS BINARY)"
	q.read = "SELECT " + rowColumns(t, false) + " FROM " + tq + " WHERE " + id + " = ? AND " + cl.where + " AND " + sameKey
	if t.Attempt != "" {
		at := quote(t.Attempt)
		q.count = "UPDATE " + tq + " SET " + at + " = " + sqlpart.CountAttempt(at, base.attemptMax) +
			" WHERE " + id + " = ? AND " + cl.where + " AND " + sameKey + " AND " + at + " <=> ?"
	}
	name := lockNameExpr(utf8mb4("?"))
	// The connection's id comes with the lock, for killCut.
	q.lock = "SELECT GET_LOCK(" + name + ", 0), CONNECTION_ID()"
	q.unlock = "SELECT RELEASE_LOCK(" + name + ")"
	q.lockArgs = strings.Count(name, "?")
	return q, nil
}

func (q *advisoryQueue) texts() []string {
	return []string{q.candidates, q.read, q.count, q.lock, q.unlock}
}

// Candidates passes over rows whose key's lock is held by any session (IS_USED_LOCK),
// this process's included, so the limit fills with keys that may be free.
func (q *advisoryQueue) Candidates(ctx context.Context, now time.Time, limit int) ([]dialects.Candidate, error) {
	if limit <= 0 {
		return nil, nil
	}
	s, err := q.d.stmt(ctx, q.candidates)
	if err != nil {
		return nil, q.errorf("candidates", err)
	}
	rows, err := s.QueryContext(ctx, append(q.cl.args(nil, q.group, now), limit)...)
	if err != nil {
		return nil, q.errorf("candidates", err)
	}
	defer rows.Close()
	var out []dialects.Candidate
	for rows.Next() {
		var c dialects.Candidate
		if err := rows.Scan(&c.ID, &c.Key); err != nil {
			return nil, q.errorf("candidates", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, q.errorf("candidates", err)
	}
	return out, nil
}

// Session takes a pool connection for one key: GET_LOCK locks belong to the connection's
// server session, so it is held until the key is unlocked.
func (q *advisoryQueue) Session(ctx context.Context) (dialects.Session, error) {
	conn, err := q.d.db.Conn(ctx)
	if err != nil {
		return nil, q.errorf("advisory session", err)
	}
	s := &session{q: q, conn: conn}
	if q.transactional {
		return txSession{s}, nil
	}
	return s, nil
}

// session is a dedicated connection holding at most one key. Its statements run in
// autocommit, as text (database/sql prepares statements per pool, not per *sql.Conn).
type session struct {
	q *advisoryQueue

	// mu serialises the session's statements: a shutdown may abort it while its delivery
	// settles.
	mu   sync.Mutex
	conn *sql.Conn // nil once ended
	key  string
	held bool
	// id is the connection's server session, read with its lock: a settlement cut short
	// while it waits for a row another session holds kills it (killCut), which ends the
	// statement, the transaction and the key on the server.
	id int64
	// dirty says the connection may hold state the pool must not get back: a lock whose
	// GET_LOCK failed midway, or a transaction whose end failed.
	dirty bool

	// A transactional session's transaction (txSession): tx is open from Begin until
	// Commit or Rollback; stopTx ends its context. txLeft says a transaction may still be
	// open on the server (its end failed): the key is then never released by statement,
	// the connection is closed instead. txFailed is the error of a settlement that rolled
	// the transaction back, which a later Commit reports.
	tx       *sql.Tx
	stopTx   context.CancelFunc
	txLeft   bool
	txFailed error
	// lent says the open transaction was lent (lend): autocommit is off on the
	// connection until endTx turns it back on. checked says its savepoint was found
	// (alive) by the settlement, so Commit need not look again.
	lent, checked bool
}

var (
	errSessionEnded = errors.New("the advisory session has ended")
	errNoKey        = errors.New("the session holds no key (TryLock the row's key first)")
	errTxLeft       = errors.New("the session's transaction did not end cleanly, and may still be open")
)

func (s *session) lockArgs() []any {
	args := make([]any, s.q.lockArgs)
	for i := range args {
		args[i] = s.key
	}
	return args
}

// TryLock runs GET_LOCK with no wait: 1 is locked; 0 (held elsewhere) or NULL is not.
func (s *session) TryLock(ctx context.Context, key string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.q
	if s.conn == nil {
		return false, q.errorf("lock", errSessionEnded)
	}
	if s.held {
		return false, q.errorf("lock", fmt.Errorf("the session already holds key %q", s.key))
	}
	s.key = key
	var got sql.NullInt64
	if err := s.conn.QueryRowContext(ctx, q.lock, s.lockArgs()...).Scan(&got, &s.id); err != nil {
		// The lock may have been taken before the failure.
		s.dirty = true
		return false, q.errorf("lock", err)
	}
	if got.Valid && got.Int64 == 1 {
		s.held = true
		return true, nil
	}
	return false, nil
}

// Take reads the row if it is still claimable and its key still renders to the key the
// session locked (a key column changed since the candidates were read names another lock:
// the row is not taken, and the caller unlocks and passes it over), then counts its
// attempt, fenced by the attempt it read: the count and the read take effect together or
// not at all. A read that fails counts nothing; a count that finds the row changed since
// the read (settled, taken, delayed, counted, re-keyed) reports the row not taken, with
// nothing counted; a count that fails delivers nothing. The delivery reports the attempt
// read, the one before the count. Both are autocommit statements on the session's
// connection, as many as a count then a read: no transaction is needed to make them one.
// Without an attempt column the take is the guarded read alone. A session holding no key
// has none to check the row against: its take is refused.
//
// An attempt read at the cap (the column type's maximum, or beyond it), or NULL, is one
// the count leaves as it is, and MySQL reports a row it leaves unchanged as not changed
// (unless the DSN sets clientFoundRows), matched or not: so the take decides from the
// read (counts) and does not run the count, which would tell it nothing; the take of
// such a row is the guarded read alone, as without an attempt column. A row whose data
// does not scan is taken and returned flagged (Row.Fault), its count fenced by the
// attempt value as the driver gave it.
func (s *session) Take(ctx context.Context, id int64, now time.Time) (dialects.Row, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.q
	if s.conn == nil {
		return dialects.Row{}, false, q.errorf("take", errSessionEnded)
	}
	if !s.held {
		return dialects.Row{}, false, q.errorf("take", errNoKey)
	}
	args := append(q.cl.args([]any{id}, q.group, now), s.key)
	r, read, err := q.scanOneAttempt(s.conn.QueryContext(ctx, q.read, args...))
	if errors.Is(err, sql.ErrNoRows) {
		// Settled, taken, delayed or re-keyed meanwhile: nothing to deliver, nothing counted.
		return dialects.Row{}, false, nil
	}
	if err != nil {
		return dialects.Row{}, false, q.errorf("take", err)
	}
	if q.count != "" && q.counts(read) {
		// read is the attempt as read: an int64 below the cap or, for a row returned
		// flagged, the value as the driver gave it.
		n, err := affected(s.conn.ExecContext(ctx, q.count, append(args, read)...))
		if err != nil {
			return dialects.Row{}, false, q.errorf("take", err)
		}
		if n == 0 {
			return dialects.Row{}, false, nil
		}
	}
	r.Key = s.key
	return r, true, nil
}

// Settle runs the step's statement on the session, in autocommit; a dead letter into a
// table moves the row in a transaction on the session. A statement that changes no row
// still settles: the key kept every other delivery away. While a transactional session's
// transaction is open, the statement runs inside it instead (see settleTx). A step naming
// an event of the subscription's runs the event in place of its statement, the same way
// (a retry included, which otherwise writes nothing).
func (s *session) Settle(ctx context.Context, step dialects.Step, id int64) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.q
	op := step.Kind.String()
	if s.conn == nil {
		return q.errorf(op, errSessionEnded)
	}
	op, text, args, move, err := q.statement(step, id)
	if err != nil {
		return q.errorf(op, err)
	}
	defer func() { q.d.killCut(ctx, s.id, err) }()
	if s.tx != nil {
		return s.settleTx(ctx, op, id, text, args, move)
	}
	if s.txLeft {
		// A statement now might run inside a transaction the server still holds open,
		// and never commit.
		return q.errorf(op, errTxLeft)
	}
	if move {
		if _, err := withRetry(ctx, func() (bool, error) { return s.move(ctx, args) }); err != nil {
			return q.errorf("dead-letter move", err)
		}
		return nil
	}
	if text == "" {
		// Retry: the take counted the attempt; the unlock returns the row.
		return nil
	}
	if _, err := s.conn.ExecContext(ctx, text, args...); err != nil {
		return q.errorf(op, err)
	}
	return nil
}

// move copies the row into the dead-letter table and deletes it in one READ COMMITTED
// transaction on the session's connection.
func (s *session) move(ctx context.Context, args []any) (bool, error) {
	tx, err := s.conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		s.dirty = true
		return false, err
	}
	moved, err := s.q.move(ctx, tx, args)
	if err != nil || !moved {
		if rerr := tx.Rollback(); rerr != nil {
			s.dirty = true
		}
		return false, err
	}
	if err := tx.Commit(); err != nil {
		s.dirty = true
		return false, fmt.Errorf("commit: %w", err)
	}
	return true, nil
}

// Unlock releases the key and ends the session. The connection returns to the pool only
// when RELEASE_LOCK answers 1; otherwise (0: held by another session, NULL: not held, or
// an error) it is closed, which ends the server session and any lock it still held. A
// transaction still open is rolled back first; when that fails the key is not released by
// statement but with the connection, which is closed.
func (s *session) Unlock(ctx context.Context) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return false, nil
	}
	var rerr error
	if s.tx != nil {
		// The key is released only once the transaction ended.
		rerr = s.rollbackTx()
	}
	conn := s.conn
	s.conn = nil
	if s.txLeft {
		// A transaction may still be open: closing the connection ends it, and the key
		// with the server session.
		s.held = false
		discard(conn)
		if rerr != nil {
			return true, s.q.errorf("unlock", fmt.Errorf("roll back the open transaction (the connection was closed instead): %w", rerr))
		}
		return true, nil
	}
	if !s.held {
		if s.dirty {
			discard(conn)
			return true, nil
		}
		_ = conn.Close()
		return false, nil
	}
	s.held = false
	var got sql.NullInt64
	err := conn.QueryRowContext(ctx, s.q.unlock, s.lockArgs()...).Scan(&got)
	if err == nil && got.Valid && got.Int64 == 1 && !s.dirty {
		_ = conn.Close()
		return false, nil
	}
	discard(conn)
	if err != nil {
		return true, s.q.errorf("unlock", err)
	}
	return true, nil
}

// Abort releases the key if it can and always closes the connection: whatever state the
// session was in (a statement cut off, a transaction open), the server forgets it. An open
// transaction is rolled back before the key is released.
func (s *session) Abort(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return nil
	}
	if s.tx != nil {
		// Rolled back first, so the key is released only once the transaction ended; a
		// failed rollback leaves the release to the connection's close.
		_ = s.rollbackTx()
	}
	conn := s.conn
	s.conn = nil
	var err error
	held := s.held
	s.held = false
	if held && !s.txLeft {
		// Released first so the key is free when Abort returns; the server would free it
		// when the connection closes, but not necessarily before another claim looks.
		rctx, cancel := cleanupCtx(ctx)
		var got sql.NullInt64
		err = conn.QueryRowContext(rctx, s.q.unlock, s.lockArgs()...).Scan(&got)
		cancel()
	}
	discard(conn)
	if err != nil {
		return s.q.errorf("abort", fmt.Errorf("release the key (the connection was closed instead): %w", err))
	}
	return nil
}

// txSession is a session of a transactional subscription: after the take it opens a
// transaction on the connection holding the key, lent to the handler; Settle runs inside
// it while it is open. GET_LOCK locks belong to the server session, not the transaction:
// the key outlives COMMIT and ROLLBACK until Unlock.
//
// Statements inside the transaction are never retried after a deadlock or a lock wait
// timeout: the handler's writes cannot be replayed.
type txSession struct{ *session }

var _ dialects.TxSession = txSession{}

// Tx is the open transaction, a *sql.Tx; nil before Begin and after the transaction ended.
func (s txSession) Tx() any {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tx == nil {
		return nil
	}
	return s.tx
}

// Begin opens the transaction on the session's connection at the table's isolation level
// (READ COMMITTED when none is declared).
func (s txSession) Begin(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.q
	switch {
	case s.conn == nil:
		return q.errorf("begin", errSessionEnded)
	case s.tx != nil:
		return q.errorf("begin", errors.New("the session's transaction is open already"))
	case s.txLeft:
		return q.errorf("begin", errTxLeft)
	}
	tx, stop, err := beginTx(ctx, s.conn, q.level)
	if err != nil {
		s.dirty = true
		return q.errorf("begin", err)
	}
	s.tx, s.stopTx, s.txFailed = tx, stop, nil
	s.lent, s.checked = true, false
	if err := lend(ctx, tx); err != nil {
		return q.errorf("begin", errors.Join(err, s.rollbackTx()))
	}
	return nil
}

// Commit commits the handler's writes with the settlement's. It is a no-op once the
// transaction ended, except after a settlement that failed and rolled it back, whose
// error it reports: nothing was committed. A failed commit closes the connection at
// Unlock rather than pooling it, and the key goes with it.
func (s txSession) Commit(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tx == nil {
		if s.txFailed != nil {
			return s.q.errorf("commit", fmt.Errorf("the transaction was rolled back: %w", s.txFailed))
		}
		return nil
	}
	if !s.checked {
		// A transaction the server ended must not commit what ran since.
		if err := alive(ctx, s.tx); err != nil {
			s.txFailed = err
			return s.q.errorf("commit", errors.Join(err, s.rollbackTx()))
		}
	}
	err := s.tx.Commit()
	s.endTx(err)
	if err != nil {
		return s.q.errorf("commit", err)
	}
	return nil
}

// Interrupt ends the session while its handler may still be using the lent transaction,
// as Abort does: the transaction is rolled back (database/sql serialises the rollback
// behind a statement the handler is running through the *sql.Tx, and fails its later
// ones), the key released, and the connection closed.
func (s txSession) Interrupt(ctx context.Context) error { return s.Abort(ctx) }

// Rollback discards the transaction (a no-op once it ended).
func (s txSession) Rollback(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tx == nil {
		return nil
	}
	if err := s.rollbackTx(); err != nil {
		return s.q.errorf("rollback", err)
	}
	return nil
}

// settleTx runs a settlement inside the open transaction. A failed statement, or a move
// whose copy or delete matched no row, rolls the transaction back (a deadlock has rolled
// all of it back already, a lock wait timeout only the statement) and returns the error:
// the handler's writes are never replayed, nor committed without the settlement.
func (s *session) settleTx(ctx context.Context, op string, id int64, text string, args []any, move bool) error {
	if !move && text == "" {
		// Retry: the take counted the attempt; the unlock returns the row.
		return nil
	}
	if !s.checked {
		// A transaction the server ended must not commit what ran since, nor run the
		// settlement in an implicit transaction of its own.
		if err := alive(ctx, s.tx); err != nil {
			s.txFailed = err
			return s.q.errorf(op, errors.Join(err, s.rollbackTx()))
		}
		s.checked = true
	}
	var err error
	switch {
	case move:
		op = "dead-letter move"
		var moved bool
		moved, err = s.q.move(ctx, s.tx, args)
		if err == nil && !moved {
			err = fmt.Errorf("row %d was not moved: the copy or the delete changed no row", id)
		}
	default:
		_, err = s.tx.ExecContext(ctx, text, args...)
	}
	if err != nil {
		err = ended(err)
		s.txFailed = err
		return s.q.errorf(op, errors.Join(err, s.rollbackTx()))
	}
	return nil
}

// rollbackTx rolls the open transaction back and forgets it. When the rollback fails, or
// the transaction had ended already by its context (database/sql rolled it back, with an
// outcome unknown), a transaction may be left open: txLeft, and the connection is closed
// at Unlock or Abort.
func (s *session) rollbackTx() error {
	err := s.tx.Rollback()
	if errors.Is(err, sql.ErrTxDone) {
		s.endTx(err)
		return nil
	}
	s.endTx(err)
	return err
}

// endTx forgets the transaction once its COMMIT or ROLLBACK returned err, and turns
// autocommit back on after a lent transaction that ended cleanly. A connection whose
// transaction may still be open, or that stays with autocommit off, is txLeft: the
// session runs nothing more on it, and it is closed.
func (s *session) endTx(err error) {
	s.stopTx()
	s.tx, s.stopTx = nil, nil
	if err == nil && s.lent {
		err = restoreAutocommit(s.conn)
	}
	s.lent, s.checked = false, false
	if err != nil {
		s.txLeft = true
		s.dirty = true
	}
}
