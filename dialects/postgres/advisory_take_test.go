package postgres

import (
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

// abortedLater opens a session that is aborted when the test ends, so that a failing test
// gives its connection back.
func abortedLater(t *testing.T, q dialects.AdvisoryQueue) dialects.Session {
	t.Helper()
	s := newSession(t, q)
	t.Cleanup(func() { s.Abort(ctx) })
	return s
}

// The take re-checks that the row's key still renders to the key the session locked: a
// row whose key column changed between the candidates and the take is not taken (the
// caller unlocks and passes it over), and its attempt is not counted. The comparison is
// exact (a change of letter case is a change).
func TestAdvisoryTakeRechecksTheKey(t *testing.T) {
	d := newDialect(t)
	tbl := advisoryTable(tableName(t, d))
	createTable(t, d, tbl)
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	id := publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	setAccount := func(v string) {
		mustExec(t, d, "UPDATE "+quote(tbl.Name)+" SET account = $1 WHERE id = $2", v, id)
	}
	setAccount("alice")
	for _, changed := range []string{"bob", "ALICE", "alice "} {
		cands, err := q.Candidates(ctx, t0, 1)
		if err != nil || len(cands) != 1 || cands[0].ID != id {
			t.Fatalf("candidates %v %v", cands, err)
		}
		locked := cands[0].Key
		setAccount(changed)
		s := abortedLater(t, q)
		if !tryLock(t, s, locked) {
			t.Fatal("lock refused")
		}
		if r, ok, err := s.Take(ctx, id, t0); ok || err != nil {
			t.Errorf("key %q locked, account now %q: take %+v %v %v, want not taken", locked, changed, r, ok, err)
		}
		if st, _ := stateOf(t, d, tbl, id); st.Attempt != 1 {
			t.Errorf("account %q: attempt %d after a take of a changed key, want 1", changed, st.Attempt)
		}
		if closed, err := s.Unlock(ctx); closed || err != nil {
			t.Fatalf("unlock %v %v", closed, err)
		}
		setAccount("alice")
	}
	// The key unchanged: taken, and counted.
	cands, err := q.Candidates(ctx, t0, 1)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates %v %v", cands, err)
	}
	s := abortedLater(t, q)
	if !tryLock(t, s, cands[0].Key) {
		t.Fatal("lock refused")
	}
	r, ok, err := s.Take(ctx, id, t0)
	if !ok || err != nil || r.Key != cands[0].Key || r.Attempt != 1 {
		t.Fatalf("take %+v %v %v", r, ok, err)
	}
	if st, _ := stateOf(t, d, tbl, id); st.Attempt != 2 {
		t.Errorf("attempt %d after the take, want 2", st.Attempt)
	}
	if _, err := s.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// A session that holds no key has nothing to re-check against: refused.
	s = abortedLater(t, q)
	if _, ok, err := s.Take(ctx, id, t0.Add(1)); ok || err == nil {
		t.Errorf("a take without a key held: %v %v, want an error", ok, err)
	}
	if _, err := s.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
