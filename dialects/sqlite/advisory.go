package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

type advisoryQueue struct {
	queue
	candidates string
	take       string
	// takeAll is take for several rows, each named with its key as an (id, key) pair of
	// a VALUES list (TakeAll).
	takeAll *valuesList
	// takeWrites says whether the take counts the attempt (an UPDATE, in the writer's
	// turn) or only re-reads the row (a SELECT, with no write lock to wait for).
	takeWrites bool
}

var (
	_ dialects.AdvisoryQueue = (*advisoryQueue)(nil)
	_ dialects.TakesTogether = (*advisoryQueue)(nil)
)

func newAdvisoryQueue(base queue, t dialects.Table) (*advisoryQueue, error) {
	key, err := keyExpr(t.AdvisoryKey)
	if err != nil {
		return nil, err // CheckDescription has already refused a malformed template
	}
	tq, id := quote(t.Name), quote(t.ID)
	where := claimable(t, false)
	q := &advisoryQueue{
		queue: base,
		candidates: "SELECT " + id + ", " + key + " FROM " + tq + " WHERE " + where + " AND " + key +
			" NOT IN (SELECT value FROM json_each(:held)) ORDER BY " + t.ClaimOrder(quote, "") + " LIMIT " + limitParam,
		takeWrites: t.Attempt != "",
	}
	var cols strings.Builder
	cols.WriteString(id + ", " + quote(t.Payload))
	if t.Attempt != "" {
		cols.WriteString(", " + quote(t.Attempt) + " - 1")
	}
	if t.Headers != "" {
		cols.WriteString(", " + quote(t.Headers))
	}
	cols.WriteString(", " + key)
	// The row's key must still render to the key the session locked, byte for byte
	// whatever the key columns' collations.
	sameKey := key + " = :key COLLATE BINARY"
	// Each row's key must render to the key bound beside its id, as in take. The keys
	// are bound as they are, not carried in JSON, which cannot hold bytes that are not
	// UTF-8 (a BLOB key column's).
	pairs := "(" + id + ", " + key + " COLLATE BINARY) IN (VALUES "
	if q.takeWrites {
		set := "UPDATE " + tq + " SET " + quote(t.Attempt) + " = " + sqlpart.CountAttempt(quote(t.Attempt), attemptMax) + " WHERE "
		q.take = set + id + " = :id AND " + where + " AND " + sameKey + " RETURNING " + cols.String()
		q.takeAll = &valuesList{prefix: set + pairs, suffix: ") AND " + where + " RETURNING " + cols.String()}
	} else {
		from := "SELECT " + cols.String() + " FROM " + tq + " WHERE "
		q.take = from + id + " = :id AND " + where + " AND " + sameKey
		q.takeAll = &valuesList{prefix: from + pairs, suffix: ") AND " + where}
	}
	return q, nil
}

func (q *advisoryQueue) prepare(ctx context.Context) error {
	if err := q.d.prepareAll(ctx, append(q.settle.texts(), q.candidates, q.take)...); err != nil {
		return q.errorf("prepare", err)
	}
	return nil
}

// Candidates passes over the keys this process holds on the file by naming them in the
// query: SQLite cannot see keys in work itself, and merely widening the limit by their
// number falls short when one held key covers several rows.
func (q *advisoryQueue) Candidates(ctx context.Context, now time.Time, limit int) ([]dialects.Candidate, error) {
	if limit <= 0 {
		return nil, nil
	}
	held, err := json.Marshal(q.f.heldKeys())
	if err != nil {
		return nil, q.errorf("candidates", err)
	}
	rows, err := q.query(ctx, q.candidates,
		sql.Named("now", formatTime(now)),
		sql.Named("group", q.group),
		sql.Named("held", string(held)),
		sql.Named("limit", int64(limit)))
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
		// A key locked since the query began is passed over as well.
		if !q.f.keyHeld(c.Key) {
			out = append(out, c)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, q.errorf("candidates", err)
	}
	return out, nil
}

// Session opens a slot in the process's key registry: SQLite has no session locks, so no
// connection is set aside.
func (q *advisoryQueue) Session(ctx context.Context) (dialects.Session, error) {
	return &session{q: q}, nil
}

var errNoKey = errors.New("the session holds no key (TryLock the row's key first)")

type session struct {
	q *advisoryQueue
	// mu guards key and held: a shutdown may abort a session while its delivery ends it.
	mu  sync.Mutex
	key string
	// held says whether key is this session's in the registry.
	held bool
	// ended says Unlock or Abort ended the session: it settles and begins nothing more,
	// as a server session whose connection went back to its pool cannot.
	ended bool
	// tx is the transaction Begin opened (txn.go); Tx lends it until the next Begin.
	tx *deliveryTx
}

func (s *session) TryLock(ctx context.Context, key string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held {
		return false, s.q.errorf("lock", fmt.Errorf("the session already holds key %q", s.key))
	}
	if !s.q.f.tryKey(key) {
		return false, nil
	}
	s.key, s.held = key, true
	return true, nil
}

// Take counts the attempt and reads the row in one statement, if the row is still
// claimable and its key still renders to the key the session locked: a row whose key
// column changed since the candidates were read is not taken (the caller unlocks and
// passes it over). A session holding no key has none to check the row against: its take
// is refused.
func (s *session) Take(ctx context.Context, id int64, now time.Time) (dialects.Row, bool, error) {
	q := s.q
	s.mu.Lock()
	key, held := s.key, s.held
	s.mu.Unlock()
	if !held {
		return dialects.Row{}, false, q.errorf("take", errNoKey)
	}
	if q.takeWrites {
		if err := q.f.lockWriter(ctx); err != nil {
			return dialects.Row{}, false, q.errorf("take", err)
		}
		defer q.f.unlockWriter()
	}
	rows, err := q.query(ctx, q.take,
		sql.Named("id", id),
		sql.Named("now", formatTime(now)),
		sql.Named("group", q.group),
		sql.Named("key", key))
	if err != nil {
		return dialects.Row{}, false, q.errorf("take", err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return dialects.Row{}, false, q.errorf("take", err)
		}
		return dialects.Row{}, false, nil
	}
	r, err := q.scanRow(rows, true)
	if err != nil {
		return dialects.Row{}, false, q.errorf("take", err)
	}
	// Close now so an error finishing the statement (and its commit) is not lost.
	if err := rows.Close(); err != nil {
		return dialects.Row{}, false, q.errorf("take", err)
	}
	return r, true, nil
}

// TakeAll takes the rows of several sessions in one statement, each only if it is still
// claimable and its key still renders to the key its session locked, as Take does. The
// statement is one write for all of them: SQLite's keys are the process's, so nothing of
// the server's own ties a take to its session.
//
// It runs in a transaction of its own, committed once every row it returned was read:
// an UPDATE … RETURNING counts every attempt as it starts, so a read cut short (its
// context ended) must roll back, or rows would come back with an attempt spent and no
// take to show for it.
func (q *advisoryQueue) TakeAll(ctx context.Context, now time.Time, takes []dialects.Take) error {
	if len(takes) == 1 {
		t := &takes[0]
		var err error
		t.Row, t.OK, err = t.Session.Take(ctx, t.ID, now)
		return err
	}
	pairs, at, err := q.takePairs(takes)
	if err != nil {
		return err
	}
	chunks, err := q.takeChunks(ctx, now, pairs)
	if err != nil {
		return q.errorf("take", err)
	}
	var got []dialects.Row
	if q.takeWrites {
		got, err = q.takeAllInTx(ctx, chunks)
	} else {
		got, err = q.readAll(ctx, chunks, func(st *sql.Stmt) *sql.Stmt { return st })
	}
	if err != nil {
		return q.errorf("take", err)
	}
	for _, r := range got {
		t := &takes[at[r.ID]]
		t.Row, t.OK = r, true
	}
	return nil
}

// takePairs checks each take's session (one of this queue's, holding a key) and returns
// the (id, key) pairs to bind, with each id's place in takes. It resets the takes.
func (q *advisoryQueue) takePairs(takes []dialects.Take) ([]any, map[int64]int, error) {
	pairs := make([]any, 0, 2*len(takes))
	at := make(map[int64]int, len(takes))
	for i := range takes {
		t := &takes[i]
		t.Row, t.OK = dialects.Row{}, false
		s, ok := t.Session.(*session)
		if !ok || s.q != q {
			return nil, nil, q.errorf("take", fmt.Errorf("row %d: the session is not one of this queue's", t.ID))
		}
		s.mu.Lock()
		key, held := s.key, s.held
		s.mu.Unlock()
		if !held {
			return nil, nil, q.errorf("take", fmt.Errorf("row %d: %w", t.ID, errNoKey))
		}
		if _, dup := at[t.ID]; dup {
			return nil, nil, q.errorf("take", fmt.Errorf("row %d asked for twice", t.ID))
		}
		at[t.ID] = i
		pairs = append(pairs, t.ID, key)
	}
	return pairs, at, nil
}

// takeChunk is one statement of a TakeAll: at most maxSettle pairs, padded with the
// last pair (which names its row once more) to the length of a prepared text.
type takeChunk struct {
	st   *sql.Stmt
	args []any
}

// takeChunks prepares the statements that take pairs. Preparing takes a pool connection
// of its own (sqlstmt.Cache.Stmt), so it comes before a transaction takes one.
func (q *advisoryQueue) takeChunks(ctx context.Context, now time.Time, pairs []any) ([]takeChunk, error) {
	var chunks []takeChunk
	for start := 0; start < len(pairs); start += 2 * maxSettle {
		pairs := pairs[start:min(start+2*maxSettle, len(pairs))]
		slot, n := pairSlot(len(pairs) / 2)
		args := make([]any, 0, 2*n+2)
		args = append(args, pairs...)
		for len(args) < 2*n {
			args = append(args, pairs[len(pairs)-2:]...)
		}
		args = append(args, sql.Named("now", formatTime(now)), sql.Named("group", q.group))
		st, err := q.d.stmt(ctx, q.takeAll.text(slot))
		if err != nil {
			return nil, err
		}
		chunks = append(chunks, takeChunk{st: st, args: args})
	}
	return chunks, nil
}

// readAll runs the chunks, each statement made by on (the pool's, or a transaction's),
// and reads every row.
func (q *advisoryQueue) readAll(ctx context.Context, chunks []takeChunk, on func(*sql.Stmt) *sql.Stmt) ([]dialects.Row, error) {
	var got []dialects.Row
	sc := q.rowScanner(true)
	for _, c := range chunks {
		rows, err := on(c.st).QueryContext(ctx, c.args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			r, err := sc.scan(rows)
			if err != nil {
				rows.Close()
				return nil, err
			}
			got = append(got, r)
		}
		// Close reports an error finishing the statement.
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return nil, err
		}
	}
	return got, nil
}

// takeAllInTx runs the chunks in one transaction on a connection of its own, in this
// process's writer turn, and commits once every row was read.
func (q *advisoryQueue) takeAllInTx(ctx context.Context, chunks []takeChunk) ([]dialects.Row, error) {
	if err := q.f.lockWriter(ctx); err != nil {
		return nil, err
	}
	defer q.f.unlockWriter()
	conn, err := q.d.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// A deferred BEGIN takes no lock; the UPDATE, the transaction's first statement,
	// takes the write lock, waiting in the busy handler as an autocommit write does.
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	got, err := q.readAll(ctx, chunks, func(st *sql.Stmt) *sql.Stmt { return tx.StmtContext(ctx, st) })
	if err == nil {
		err = tx.Commit()
	} else if rerr := tx.Rollback(); rerr == nil || errors.Is(rerr, sql.ErrTxDone) {
		return nil, err // rolled back (by database/sql, when ctx ended)
	}
	if err != nil {
		// A rollback or a commit that failed may leave the transaction open (a commit
		// refused with SQLITE_BUSY in rollback-journal mode): the connection must not
		// go back to the pool holding the write lock.
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		return nil, err
	}
	return got, nil
}

// Settle runs the step's statement: inside the session's transaction while one is open
// (txn.go), on the pool otherwise. A statement that changes no row still settles: the key
// kept every other delivery away, so the row was settled by nobody else's claim.
func (s *session) Settle(ctx context.Context, step dialects.Step, id int64) error {
	if s.isEnded() {
		return s.q.errorf("settle", errSessionEnded)
	}
	st, err := s.q.advisorySettlement(step, id)
	if err != nil {
		return err
	}
	if t := s.openTx(); t != nil {
		return t.settle(ctx, st)
	}
	_, err = s.q.run(ctx, st)
	return err
}

// advisorySettlement picks the step's statement, by id alone: a step naming an event runs
// the event instead (a retry included, which otherwise writes nothing).
func (q *advisoryQueue) advisorySettlement(step dialects.Step, id int64) (settlement, error) {
	if step.Event != "" {
		return q.eventSettlement(step, id)
	}
	return q.settlement(step, sql.Named("id", id))
}

func (s *session) isEnded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// errSessionEnded refuses a statement on a session Unlock or Abort ended.
var errSessionEnded = errors.New("the advisory session has ended (Unlock or Abort): its key is no longer held")

// Unlock ends a transaction still open (rolling it back) and releases the key. It
// reports closed when that transaction's connection had to be closed.
func (s *session) Unlock(ctx context.Context) (bool, error) {
	closed, err := s.endTx()
	s.release()
	return closed, err
}

// Abort rolls back a transaction still open and releases the key; the server has no
// session to forget. A transaction whose rollback fails has its connection closed, which
// SQLite rolls back.
func (s *session) Abort(ctx context.Context) error {
	_, err := s.endTx()
	s.release()
	return err
}

func (s *session) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	if s.held {
		s.q.f.releaseKey(s.key)
		s.key, s.held = "", false
	}
}
