package sqlite

import (
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

// keyOf is row id's key as the dialect renders it now.
func keyOf(t *testing.T, d *Dialect, tbl dialects.Table, id int64) string {
	t.Helper()
	expr, err := keyExpr(tbl.AdvisoryKey)
	if err != nil {
		t.Fatal(err)
	}
	var key string
	if err := d.DB().QueryRowContext(ctx, "SELECT "+expr+" FROM "+quote(tbl.Name)+" WHERE "+quote(tbl.ID)+" = ?", id).Scan(&key); err != nil {
		t.Fatal(err)
	}
	return key
}

// The take re-checks that the row's key still renders to the key the session locked: a
// row whose key column changed between the candidates and the take is not taken (the
// caller unlocks and passes it over), and its attempt is not counted. The comparison is
// exact, whatever the key column's collation.
func TestAdvisoryTakeRechecksTheKey(t *testing.T) {
	d := newDialect(t)
	tbl := advisoryTable("jobs")
	createTable(t, d, tbl)
	// A case-blind key column: the re-check compares bytes all the same.
	mustExec(t, d, "ALTER TABLE jobs RENAME COLUMN account TO account_old")
	mustExec(t, d, "ALTER TABLE jobs ADD COLUMN account TEXT COLLATE NOCASE")
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	id := publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	setAccount := func(v string) { mustExec(t, d, "UPDATE jobs SET account = ? WHERE id = ?", v, id) }
	setAccount("alice")
	for _, changed := range []string{"bob", "ALICE", "alice "} {
		cands, err := q.Candidates(ctx, t0, 1)
		if err != nil || len(cands) != 1 || cands[0].ID != id {
			t.Fatalf("candidates %v %v", cands, err)
		}
		locked := cands[0].Key
		setAccount(changed)
		s := newSession(t, q)
		if !tryLock(t, s, locked) {
			t.Fatal("lock refused")
		}
		if r, ok, err := s.Take(ctx, id, t0); ok || err != nil {
			t.Errorf("key %q locked, account now %q: take %+v %v %v, want not taken", locked, changed, r, ok, err)
		}
		if n := count(t, d, "SELECT attempt FROM jobs WHERE id = ?", id); n != 1 {
			t.Errorf("account %q: attempt %d after a take of a changed key, want 1", changed, n)
		}
		if _, err := s.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		setAccount("alice")
	}
	// The key unchanged: taken, and counted.
	cands, err := q.Candidates(ctx, t0, 1)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates %v %v", cands, err)
	}
	s := newSession(t, q)
	if !tryLock(t, s, cands[0].Key) {
		t.Fatal("lock refused")
	}
	r, ok, err := s.Take(ctx, id, t0)
	if !ok || err != nil || r.Key != cands[0].Key || r.Attempt != 1 {
		t.Fatalf("take %+v %v %v", r, ok, err)
	}
	if n := count(t, d, "SELECT attempt FROM jobs WHERE id = ?", id); n != 2 {
		t.Errorf("attempt %d after the take, want 2", n)
	}
	if _, err := s.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// A session that holds no key has nothing to re-check against: refused.
	if _, ok, err := newSession(t, q).Take(ctx, id, t0.Add(1)); ok || err == nil {
		t.Errorf("a take without a key held: %v %v, want an error", ok, err)
	}
}
