package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

// lockText and unlockText lock and unlock a key's 64-bit hash on the session. Each runs
// as a statement of its own, exactly once per call: inside a WHERE the planner might
// evaluate the lock for rows it then discards, or twice.
const (
	lockText   = "SELECT pg_try_advisory_lock(hashtextextended($1::text, 0))"
	unlockText = "SELECT pg_advisory_unlock(hashtextextended($1::text, 0))"
)

type advisoryQueue struct {
	queue
	candidates stmt
	take       stmt
}

var _ dialects.AdvisoryQueue = (*advisoryQueue)(nil)

func newAdvisoryQueue(base queue, t dialects.Table) (*advisoryQueue, error) {
	key, err := keyExpr(t.AdvisoryKey)
	if err != nil {
		return nil, err // CheckDescription has already refused a malformed template
	}
	tq, id := quote(t.Name), quote(t.ID)

	// Candidates pass over keys held elsewhere by probing each candidate's key with a
	// shared transaction-level advisory lock: it conflicts only with the exclusive
	// session locks deliveries hold (not with other probes), it is taken row by row over
	// the ordered subquery (OFFSET 0 keeps the probe out of it) so probing stops at the
	// limit, and it ends with the statement's own implicit transaction, a moment later.
	// A probe can make a TryLock elsewhere that runs in that moment fail; that row is
	// only passed over until the next claim. The alternative, excluding the hashes listed
	// in pg_locks, reads the whole lock table on every claim and must decode each hash
	// from its two 32-bit halves.
	var c builder
	c.w("SELECT k.", id, ", k.key FROM (SELECT ", id, ", ", key, " AS key FROM ", tq,
		" WHERE ", claimable(&c, t, "", false), " ORDER BY ", t.ClaimOrder(quote, ""), " OFFSET 0) AS k",
		" WHERE pg_try_advisory_xact_lock_shared(hashtextextended(k.key, 0)) LIMIT ", c.p(pLimit))

	// The take re-checks the row (still claimable, and its key still the one the session
	// locked, compared byte for byte) and counts the attempt in one autocommit statement;
	// RETURNING sees the counted value, and the delivery reports the one before.
	var w builder
	if t.Attempt != "" {
		a := quote(t.Attempt)
		w.w("UPDATE ", tq, " SET ", a, " = ", sqlpart.CountAttempt(a, base.attemptMax), " WHERE ", id, " = ", w.p(pID),
			" AND ", claimable(&w, t, "", false), " AND ", key, " = ", w.p(pKey), "::text COLLATE \"C\"",
			" RETURNING ", rowColumns(t, "", a+" - 1"), ", ", key)
	} else {
		w.w("SELECT ", rowColumns(t, "", ""), ", ", key, " FROM ", tq, " WHERE ", id, " = ", w.p(pID),
			" AND ", claimable(&w, t, "", false), " AND ", key, " = ", w.p(pKey), "::text COLLATE \"C\"")
	}
	return &advisoryQueue{queue: base, candidates: c.stmt(), take: w.stmt()}, nil
}

func (q *advisoryQueue) Candidates(ctx context.Context, now time.Time, limit int) ([]dialects.Candidate, error) {
	if limit <= 0 {
		return nil, nil
	}
	b := q.bind()
	b.now, b.limit = now, int64(limit)
	rows, err := q.d.pool.Query(ctx, q.candidates.text, q.candidates.args(&b)...)
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

// Session sets a pool connection aside for one key. It returns to the pool only when the
// server confirms the key's release; otherwise it is closed.
func (q *advisoryQueue) Session(ctx context.Context) (dialects.Session, error) {
	conn, err := q.d.pool.Acquire(ctx)
	if err != nil {
		return nil, q.errorf("session", err)
	}
	s := &session{q: q, conn: conn}
	if q.transactional {
		return &txSession{s}, nil
	}
	return s, nil
}

// session holds at most one key on a dedicated connection.
type session struct {
	q *advisoryQueue

	// mu serialises the session's calls: a connection runs one statement at a time, and
	// a shutdown may abort a session while its delivery ends it.
	mu   sync.Mutex
	conn *pgxpool.Conn // nil once the session ended
	key  string
	// held says the session may hold key: set before the lock statement runs, so a lock
	// whose answer was lost still counts as held.
	held bool
	// doubtful says the session's state is unknown (a lock statement failed): it must
	// be closed, never pooled.
	doubtful bool
	// tx is the transaction a transactional session lends (nil before Begin); open says
	// it has not ended.
	tx   pgx.Tx
	open bool
}

var _ dialects.Session = (*session)(nil)

var (
	errSessionEnded = errors.New("the advisory session has ended")
	errNoKey        = errors.New("the session holds no key (TryLock the row's key first)")
)

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
	s.key, s.held = key, true
	var ok bool
	if err := s.conn.QueryRow(ctx, lockText, key).Scan(&ok); err != nil {
		s.doubtful = true
		return false, q.errorf("lock", err)
	}
	if !ok {
		s.key, s.held = "", false
	}
	return ok, nil
}

// Take counts the attempt and reads the row in one statement, if the row is still
// claimable and its key still renders to the key the session locked: a row whose key
// column changed since the candidates were read names another lock, so it is not taken
// (the caller unlocks and passes it over). A session holding no key has none to check
// the row against: its take is refused.
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
	b := q.bind()
	b.id, b.now, b.key = id, now, s.key
	rows, err := s.conn.Query(ctx, q.take.text, q.take.args(&b)...)
	if err != nil {
		return dialects.Row{}, false, q.errorf("take", err)
	}
	var r dialects.Row
	found := rows.Next()
	if found {
		r, err = q.scanRow(rows, true)
	}
	// Close reads the statement to its end (and its commit) before the error is judged.
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return dialects.Row{}, false, q.errorf("take", err)
	}
	return r, found, nil
}

// Settle runs the step's statement on the session, in autocommit, or inside the session's
// transaction while one is open. A statement that changes no row still settles: the key
// kept every other delivery away.
func (s *session) Settle(ctx context.Context, step dialects.Step, id int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.q
	if s.conn == nil {
		return q.errorf(step.Kind.String(), errSessionEnded)
	}
	var db querier = s.conn
	if s.open {
		if err := settleable(s.conn); err != nil {
			return q.errorf(step.Kind.String(), err)
		}
		db = s.tx
	}
	if step.Event != "" {
		_, err := q.runEvent(ctx, db, step, id)
		if s.open {
			err = ended(err)
		}
		return err
	}
	st, err := q.settle.pick(step)
	switch {
	case err != nil:
		err = q.errorf(step.Kind.String(), err)
	case st.text != "":
		// A retry or a release writes nothing but a retry's error: the take counted the
		// attempt, and releasing the key returns the row.
		b := q.stepBind(step, id)
		_, err = q.exec(ctx, db, step.Kind.String(), st, &b)
	}
	if s.open {
		err = ended(err)
	}
	return err
}

// Unlock releases the key and ends the session: the connection returns to the pool only
// when the server confirms the release and the connection is idle outside a transaction;
// otherwise it is closed, which ends the server's session and every lock it held. A
// transaction still open is rolled back first: the key is unlocked only after it ended.
func (s *session) Unlock(ctx context.Context) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return false, nil
	}
	if err := s.rollback(ctx); err != nil {
		// The connection's state is unknown: closing it ends the transaction and the key.
		s.close()
		return true, s.q.errorf("rollback", err)
	}
	if s.doubtful {
		s.close()
		return true, nil
	}
	if s.held {
		var released bool
		if err := s.conn.QueryRow(ctx, unlockText, s.key).Scan(&released); err != nil {
			s.close()
			return true, s.q.errorf("unlock", err)
		}
		if !released {
			s.close()
			return true, nil
		}
		s.key, s.held = "", false
	}
	if s.conn.Conn().PgConn().TxStatus() != 'I' {
		// A transaction left open on the session would reach the pool's next user.
		s.close()
		return true, nil
	}
	s.conn.Release()
	s.conn = nil
	return false, nil
}

// Abort tries to release the key, then closes the connection whatever the answer: the
// server forgets the session and everything it held.
func (s *session) Abort(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return nil
	}
	// The transaction ends before the key is unlocked; when it cannot be, the close
	// ends both.
	err := s.rollback(ctx)
	if err != nil {
		err = s.q.errorf("rollback", err)
	}
	if s.held && !s.doubtful {
		// The unlock is worth trying even when ctx has ended (a shutdown past its
		// deadline): a confirmed release is cleaner than the server's cleanup.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
		var released bool
		if uerr := s.conn.QueryRow(uctx, unlockText, s.key).Scan(&released); uerr != nil {
			err = s.q.errorf("unlock", uerr)
		}
		cancel()
	}
	s.close()
	return err
}

func (s *session) close() {
	_ = closeConn(s.conn)
	s.conn, s.key, s.held, s.open = nil, "", false, false
}

// rollback ends the session's open transaction, if it has one, even when ctx has ended.
// A failed rollback leaves the session doubtful. The caller holds mu.
func (s *session) rollback(ctx context.Context) error {
	if !s.open {
		return nil
	}
	s.open = false
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	err := s.tx.Rollback(rctx)
	if errors.Is(err, pgx.ErrTxClosed) {
		err = nil // ended already (the handler's own commit or rollback)
	}
	if err != nil {
		s.doubtful = true
	}
	return err
}

// txSession is a transactional subscription's session: after the take it opens a
// transaction on the connection holding the key and lends it to the handler.
type txSession struct {
	*session
}

var _ dialects.TxSession = (*txSession)(nil)

// Tx returns the session's pgx.Tx; nil before Begin.
func (s *txSession) Tx() any {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tx == nil {
		return nil
	}
	return s.tx
}

// SQLTx returns the session's transaction as a *sql.Tx until end (see lend); nil before
// Begin.
func (s *txSession) SQLTx() (*sql.Tx, func()) {
	s.mu.Lock()
	tx := s.tx
	s.mu.Unlock()
	if tx == nil {
		return nil, func() {}
	}
	return s.q.d.lend(tx)
}

// Begin opens the transaction at the table's isolation level (plain BEGIN when none is
// declared). A BEGIN that failed leaves the session doubtful: it will be closed.
func (s *txSession) Begin(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.q
	if s.conn == nil {
		return q.errorf("begin", errSessionEnded)
	}
	if s.open {
		return q.errorf("begin", errors.New("the session's transaction is already open"))
	}
	tx, err := s.conn.BeginTx(ctx, q.txOptions)
	if err != nil {
		s.doubtful = true
		return q.errorf("begin", err)
	}
	s.tx, s.open = tx, true
	return nil
}

// Commit commits the transaction: the handler's writes and the settlement's. It is an
// error without an open transaction, so a commit never reports writes it did not make.
// A commit that failed has ended the transaction (pgx closes a connection left inside
// one, and the session is then closed, never pooled).
func (s *txSession) Commit(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.q
	if s.conn == nil {
		return q.errorf("commit", errSessionEnded)
	}
	if !s.open {
		return q.errorf("commit", errTxEnded)
	}
	if err := inTx(s.conn); err != nil {
		s.open = false
		return q.errorf("commit", err)
	}
	if err := settleable(s.conn); err != nil {
		// Aborted: the transaction can only roll back.
		return q.errorf("commit", errors.Join(err, s.rollback(ctx)))
	}
	s.open = false
	if err := s.tx.Commit(ctx); err != nil {
		if pc := s.conn.Conn().PgConn(); pc.IsClosed() || pc.TxStatus() != 'I' {
			s.doubtful = true
		}
		return q.errorf("commit", ended(err))
	}
	return nil
}

// Interrupt ends the session while its handler may still be using the lent transaction
// (see sever): the server rolls the transaction back and releases the key as the session
// ends. Later calls end nothing more.
func (s *txSession) Interrupt(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return nil
	}
	err := sever(s.conn)
	s.conn, s.key, s.held, s.open = nil, "", false, false
	if err != nil {
		return s.q.errorf("interrupt", err)
	}
	return nil
}

// Rollback discards the transaction; a no-op once it ended. A rollback that failed leaves
// the session doubtful: Unlock closes it.
func (s *txSession) Rollback(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return nil
	}
	if err := s.rollback(ctx); err != nil {
		return s.q.errorf("rollback", err)
	}
	return nil
}
