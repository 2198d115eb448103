package postgres

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

func advisoryTable(name string) dialects.Table { return dialecttest.AdvisoryTableKeyed(name, "'s") }

func unlock(t *testing.T, s dialects.Session) bool {
	t.Helper()
	closed, err := s.Unlock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return closed
}

// locksHeld counts the advisory locks any session holds on keys.
func locksHeld(t *testing.T, d *Dialect, keys ...string) int {
	t.Helper()
	return count(t, d, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
		AND ((classid::bigint << 32) | objid::bigint) IN (SELECT hashtextextended(k, 0) FROM unnest($1::text[]) AS k)`, keys)
}

func TestAdvisoryKeyExcludesOtherSessions(t *testing.T) {
	d1, d2 := newDialect(t), newDialect(t) // two processes
	tbl := advisoryTable(tableName(t, d1))
	createTable(t, d1, tbl)
	q1 := dialecttest.OpenAdvisory(t, d1, dialects.QueueSpec{Table: tbl})
	q2 := dialecttest.OpenAdvisory(t, d2, dialects.QueueSpec{Table: tbl})
	k, other := tbl.Name+"-k", tbl.Name+"-other"

	s1, s2 := dialecttest.NewSession(t, q1), dialecttest.NewSession(t, q2)
	if !dialecttest.TryLock(t, s1, k) {
		t.Fatal("first lock refused")
	}
	if locksHeld(t, d1, k) != 1 {
		t.Fatal("the lock is not in pg_locks")
	}
	if dialecttest.TryLock(t, s2, k) {
		t.Fatal("another process locked a held key")
	}
	s3 := dialecttest.NewSession(t, q1)
	if dialecttest.TryLock(t, s3, k) {
		t.Fatal("another session of the same process locked a held key")
	}
	if unlock(t, s3) {
		t.Fatal("a session holding nothing closed its connection")
	}
	if !dialecttest.TryLock(t, s2, other) {
		t.Fatal("a free key was refused")
	}
	if _, err := s2.TryLock(ctx, k); err == nil {
		t.Fatal("a session locked a second key")
	}
	if unlock(t, s1) {
		t.Fatal("a confirmed unlock closed the connection")
	}
	if closed, err := s1.Unlock(ctx); closed || err != nil {
		t.Fatalf("a second unlock: %v %v", closed, err)
	}
	s4 := dialecttest.NewSession(t, q2)
	if !dialecttest.TryLock(t, s4, k) {
		t.Fatal("an unlocked key stayed held")
	}
	if err := s4.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s4.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	s5 := dialecttest.NewSession(t, q1)
	if !dialecttest.TryLock(t, s5, k) {
		t.Fatal("an aborted key stayed held")
	}
	unlock(t, s2)
	if n := locksHeld(t, d1, k, other); n != 1 {
		t.Fatalf("%d locks held, want the last one", n)
	}
	unlock(t, s5)
	if n := locksHeld(t, d1, k, other); n != 0 {
		t.Fatalf("%d locks left", n)
	}
}

// A confirmed unlock returns the connection to the pool; anything else closes it.
func TestAdvisoryUnlockReturnsTheConnection(t *testing.T) {
	d := newDialect(t)
	tbl := advisoryTable(tableName(t, d))
	createTable(t, d, tbl)
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	key := tbl.Name + "-k"
	stat := func() (acquired, total int32) {
		s := d.Pool().Stat()
		return s.AcquiredConns(), s.TotalConns()
	}

	s := dialecttest.NewSession(t, q)
	if a, _ := stat(); a != 1 {
		t.Fatalf("a session holds %d connections", a)
	}
	dialecttest.TryLock(t, s, key)
	_, total := stat()
	if unlock(t, s) {
		t.Fatal("closed")
	}
	if a, tot := stat(); a != 0 || tot != total {
		t.Fatalf("after a confirmed unlock: %d acquired, %d total (was %d)", a, tot, total)
	}

	// The server does not confirm the release (the key was released behind the
	// session's back): the connection is closed, not pooled.
	s = dialecttest.NewSession(t, q)
	dialecttest.TryLock(t, s, key)
	mustExecOn(t, s, "SELECT pg_advisory_unlock(hashtextextended($1, 0))", key)
	_, total = stat()
	if !unlock(t, s) {
		t.Fatal("an unconfirmed unlock kept the connection")
	}
	if a, tot := stat(); a != 0 || tot != total-1 {
		t.Fatalf("after an unconfirmed unlock: %d acquired, %d total (was %d)", a, tot, total)
	}

	// A failed unlock closes the connection too, and reports the error.
	s = dialecttest.NewSession(t, q)
	dialecttest.TryLock(t, s, key)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if closed, err := s.Unlock(cctx); !closed || err == nil {
		t.Fatalf("an unlock that failed: %v %v", closed, err)
	}

	// Abort always closes.
	s = dialecttest.NewSession(t, q)
	dialecttest.TryLock(t, s, key)
	_, total = stat()
	if err := s.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if a, tot := stat(); a != 0 || tot != total-1 {
		t.Fatalf("after abort: %d acquired, %d total (was %d)", a, tot, total)
	}

	// A session whose lock statement failed may hold the key: it is closed.
	s = dialecttest.NewSession(t, q)
	cctx, cancel = context.WithCancel(ctx)
	cancel()
	if _, err := s.TryLock(cctx, key); err == nil {
		t.Fatal("a lock with an ended context succeeded")
	}
	if !unlock(t, s) {
		t.Fatal("a doubtful session was pooled")
	}
	if n := locksHeld(t, d, key); n != 0 {
		t.Fatalf("%d locks left", n)
	}
	if a, _ := stat(); a != 0 {
		t.Fatalf("%d connections acquired", a)
	}
}

func mustExecOn(t *testing.T, s dialects.Session, query string, args ...any) {
	t.Helper()
	if _, err := s.(*session).conn.Exec(ctx, query, args...); err != nil {
		t.Fatal(err)
	}
}

func TestAdvisoryTakeAndSettle(t *testing.T) {
	d := newDialect(t)
	tbl := advisoryTable(tableName(t, d))
	tbl.Group, tbl.Headers = "grp", "headers"
	createTable(t, d, tbl)
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
	var keys []string

	// take claims the first candidate on a session of its own.
	take := func(t *testing.T) (dialects.Session, dialects.Row) {
		t.Helper()
		s, cand := dialecttest.LockFirst(t, q)
		keys = append(keys, cand.Key)
		r, ok, err := s.Take(ctx, cand.ID, t0)
		if err != nil || !ok {
			t.Fatalf("take: %v %v", ok, err)
		}
		if r.Key != cand.Key {
			t.Fatalf("take read key %q, candidate %q", r.Key, cand.Key)
		}
		return s, r
	}
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p"), Headers: []byte(`{"a":"b"}`)})
	mustExec(t, d, "UPDATE "+quote(tbl.Name)+" SET account = 'acct'")

	s, r := take(t)
	if r.ID != id || r.Attempt != 1 || string(r.Payload) != "p" || len(r.Headers) == 0 || r.Key != tbl.Name+"-acct's" {
		t.Fatalf("took %+v", r)
	}
	if st, _ := stateOf(t, d, tbl, id); st.Attempt != 2 {
		t.Fatalf("the take did not count: %+v", st)
	}
	// Retry runs nothing: the unlock returns the row.
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepRetry}, id); err != nil {
		t.Fatal(err)
	}
	unlock(t, s)

	s, r = take(t)
	if r.Attempt != 2 {
		t.Fatalf("second take read attempt %d", r.Attempt)
	}
	at := t0.Add(time.Hour)
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepRetryAfter, At: at}, id); err != nil {
		t.Fatal(err)
	}
	unlock(t, s)
	if st, _ := stateOf(t, d, tbl, id); !sameTime(st.RetryAfter, at) || st.Attempt != 3 {
		t.Fatalf("after retry after: %+v", st)
	}
	// Not due: a take refuses it even with the key held.
	s2 := dialecttest.NewSession(t, q)
	dialecttest.TryLock(t, s2, "unrelated-"+tbl.Name)
	keys = append(keys, "unrelated-"+tbl.Name)
	if _, ok, err := s2.Take(ctx, id, t0); ok || err != nil {
		t.Fatalf("took a row not due: %v %v", ok, err)
	}
	unlock(t, s2)

	mustExec(t, d, "UPDATE "+quote(tbl.Name)+" SET retry_after = NULL")
	s, _ = take(t)
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, id); err != nil {
		t.Fatal(err)
	}
	unlock(t, s)
	if st, _ := stateOf(t, d, tbl, id); st.Group != "dead" {
		t.Fatalf("after dead letter: %+v", st)
	}

	id = dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("q")})
	s, _ = take(t)
	now := t0.Add(time.Second)
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: now}, id); err != nil {
		t.Fatal(err)
	}
	unlock(t, s)
	if st, _ := stateOf(t, d, tbl, id); !sameTime(st.ProcessedAt, now) {
		t.Fatalf("after ack: %+v", st)
	}
	if cands, _ := q.Candidates(ctx, t0, 10); len(cands) != 0 {
		t.Fatalf("candidates left: %v", cands)
	}
	if n := locksHeld(t, d, keys...); n != 0 {
		t.Fatalf("%d locks left", n)
	}
}

// Without an attempt column the take only reads; into a dead-letter table the move is
// one statement.
func TestAdvisoryMinimalTableAndMove(t *testing.T) {
	d := newDialect(t)
	tbl := dialects.Table{Name: tableName(t, d), ID: "id", Payload: "payload"}
	tbl.AdvisoryKey = tbl.Name + "-{id}"
	createTable(t, d, tbl)
	dead := tbl
	dead.Name = tableName(t, d)
	createTable(t, d, dead)
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl, DeadLetterTable: dead.Name})
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("poison")})
	cands, err := q.Candidates(ctx, t0, 5)
	if err != nil || len(cands) != 1 || cands[0].Key != tbl.Name+"-"+strconv.FormatInt(id, 10) {
		t.Fatalf("candidates %v %v", cands, err)
	}
	s := dialecttest.NewSession(t, q)
	dialecttest.TryLock(t, s, cands[0].Key)
	r, ok, err := s.Take(ctx, id, t0)
	if err != nil || !ok || r.Attempt != 0 || string(r.Payload) != "poison" {
		t.Fatalf("take %+v %v %v", r, ok, err)
	}
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, id); err != nil {
		t.Fatal(err)
	}
	// A second move finds no row: still settled.
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, id); err != nil {
		t.Fatal(err)
	}
	if closed, err := s.Unlock(ctx); closed || err != nil {
		t.Fatal(closed, err)
	}
	if _, exists := stateOf(t, d, tbl, id); exists {
		t.Fatal("the row stayed")
	}
	if n := count(t, d, "SELECT count(*) FROM "+quote(dead.Name)+" WHERE id = $1", id); n != 1 {
		t.Fatalf("%d copies", n)
	}
	// Gone: a take reports false.
	s = dialecttest.NewSession(t, q)
	dialecttest.TryLock(t, s, cands[0].Key)
	if _, ok, err := s.Take(ctx, id, t0); ok || err != nil {
		t.Fatalf("took a moved row: %v %v", ok, err)
	}
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepRetryAfter}, id); err == nil {
		t.Fatal("retry after without a retry_after column succeeded")
	}
	unlock(t, s)
	if n := locksHeld(t, d, cands[0].Key); n != 0 {
		t.Fatalf("%d locks left", n)
	}
}
