package sqlite

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

func advisoryTable(name string) dialects.Table {
	return dialects.Table{Name: name, ID: "id", Payload: "payload", Attempt: "attempt", ProcessedAt: "processed_at",
		RetryAfter: "retry_after", AdvisoryKey: name + "-{account}'s"}
}

func newSession(t *testing.T, q dialects.AdvisoryQueue) dialects.Session {
	t.Helper()
	s, err := q.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func tryLock(t *testing.T, s dialects.Session, key string) bool {
	t.Helper()
	ok, err := s.TryLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestAdvisoryRegistrySharedByFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.db")
	d1, d2 := openFile(t, path), openFile(t, path)
	tbl := advisoryTable("jobs")
	createTable(t, d1, tbl)
	q1 := openAdvisory(t, d1, dialects.QueueSpec{Table: tbl})
	q2 := openAdvisory(t, d2, dialects.QueueSpec{Table: tbl})

	s1, s2 := newSession(t, q1), newSession(t, q2)
	if !tryLock(t, s1, "k") {
		t.Fatal("first lock refused")
	}
	if tryLock(t, s2, "k") {
		t.Fatal("a second Dialect on the same file locked a held key")
	}
	if !tryLock(t, s2, "other") {
		t.Fatal("a free key was refused")
	}
	if closed, err := s1.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock: %v %v", closed, err)
	}
	if _, err := s1.Unlock(ctx); err != nil {
		t.Fatal("a second unlock failed")
	}
	s3 := newSession(t, q2)
	if !tryLock(t, s3, "k") {
		t.Fatal("an unlocked key stayed held")
	}
	if err := s3.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s3.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if !tryLock(t, newSession(t, q1), "k") {
		t.Fatal("an aborted key stayed held")
	}

	// Another file has its own keys.
	q3 := openAdvisory(t, func() *Dialect { d := newDialect(t); createTable(t, d, tbl); return d }(), dialects.QueueSpec{Table: tbl})
	if !tryLock(t, newSession(t, q3), "k") {
		t.Fatal("a key held on another file was refused")
	}
}

func TestAdvisoryCandidatesSkipHeldKeys(t *testing.T) {
	d := newDialect(t)
	tbl := advisoryTable("jobs")
	createTable(t, d, tbl)
	mustExec(t, d, "INSERT INTO jobs (payload, account) VALUES ('a', 'x'), ('b', 'x'), ('c', 'y'), ('d', NULL), ('e', 'z')")
	mustExec(t, d, "INSERT INTO jobs (payload, account, retry_after) VALUES ('f', 'w', ?)", formatTime(t0.Add(time.Second)))
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl})

	cands, err := q.Candidates(ctx, t0, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []dialects.Candidate{{ID: 1, Key: "jobs-x's"}, {ID: 2, Key: "jobs-x's"}, {ID: 3, Key: "jobs-y's"}, {ID: 4, Key: "jobs-'s"}, {ID: 5, Key: "jobs-z's"}}
	if !equalCandidates(cands, want) {
		t.Fatalf("candidates %v, want %v", cands, want)
	}

	s := newSession(t, q)
	if !tryLock(t, s, "jobs-x's") {
		t.Fatal("lock refused")
	}
	// The held key's rows are passed over and the limit still fills.
	cands, err = q.Candidates(ctx, t0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !equalCandidates(cands, []dialects.Candidate{{ID: 3, Key: "jobs-y's"}, {ID: 4, Key: "jobs-'s"}}) {
		t.Fatalf("candidates with x held: %v", cands)
	}
}

func equalCandidates(a, b []dialects.Candidate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestAdvisoryTake(t *testing.T) {
	d := newDialect(t)
	tbl := advisoryTable("jobs")
	tbl.Headers = "headers"
	createTable(t, d, tbl)
	mustExec(t, d, "INSERT INTO jobs (payload, account, headers) VALUES ('a', 'x', '{}'), ('b', 'y', NULL)")
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	s := newSession(t, q)
	if !tryLock(t, s, "jobs-x's") {
		t.Fatal("lock refused")
	}

	r, ok, err := s.Take(ctx, 1, t0)
	if err != nil || !ok {
		t.Fatalf("take: %v %v", ok, err)
	}
	if r.ID != 1 || string(r.Payload) != "a" || r.Attempt != 1 || r.Key != "jobs-x's" || string(r.Headers) != "{}" {
		t.Errorf("took %+v", r)
	}
	if n := count(t, d, "SELECT attempt FROM jobs WHERE id = 1"); n != 2 {
		t.Errorf("attempt stored %d, want 2", n)
	}

	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, 1); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Take(ctx, 1, t0); ok || err != nil {
		t.Fatalf("a processed row was taken: %v %v", ok, err)
	}
	if n := count(t, d, "SELECT attempt FROM jobs WHERE id = 1"); n != 2 {
		t.Errorf("a refused take counted: attempt %d", n)
	}
	if _, ok, _ := s.Take(ctx, 99, t0); ok {
		t.Fatal("a missing row was taken")
	}
	if _, err := s.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	s = newSession(t, q)
	if !tryLock(t, s, "jobs-y's") {
		t.Fatal("lock refused")
	}

	// Retry and release write nothing; retry_after delays the row.
	for _, k := range []dialects.StepKind{dialects.StepRetry, dialects.StepRelease} {
		if err := s.Settle(ctx, dialects.Step{Kind: k}, 2); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepRetryAfter, At: t0.Add(time.Hour)}, 2); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Take(ctx, 2, t0); ok {
		t.Fatal("a delayed row was taken before it was due")
	}
	if _, ok, _ := s.Take(ctx, 2, t0.Add(time.Hour)); !ok {
		t.Fatal("a due row was refused")
	}
}

func TestAdvisoryTakeWithoutAttempt(t *testing.T) {
	d := newDialect(t)
	mustExec(t, d, "CREATE TABLE j (id INTEGER PRIMARY KEY, payload BLOB)")
	mustExec(t, d, "INSERT INTO j (payload) VALUES (x'0102')")
	tbl := dialects.Table{Name: "j", ID: "id", Payload: "payload", AdvisoryKey: "{id}"}
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	s := newSession(t, q)
	if !tryLock(t, s, "1") {
		t.Fatal("lock refused")
	}
	r, ok, err := s.Take(ctx, 1, t0)
	if err != nil || !ok || r.Attempt != 0 || r.Key != "1" || string(r.Payload) != "\x01\x02" {
		t.Fatalf("take: %+v %v %v", r, ok, err)
	}
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepAck}, 1); err != nil {
		t.Fatal(err)
	}
	if count(t, d, "SELECT count(*) FROM j") != 0 {
		t.Error("ack did not delete")
	}
}

func TestAdvisoryDeadLetter(t *testing.T) {
	d := newDialect(t)
	tbl := advisoryTable("jobs")
	createTable(t, d, tbl)
	createTable(t, d, advisoryTable("graveyard"))
	mustExec(t, d, "INSERT INTO jobs (payload, account) VALUES ('a', 'x')")
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl, DeadLetterTable: "graveyard"})
	s := newSession(t, q)
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, 1); err != nil {
		t.Fatal(err)
	}
	if count(t, d, "SELECT count(*) FROM jobs") != 0 || count(t, d, "SELECT count(*) FROM graveyard WHERE account = 'x'") != 1 {
		t.Error("row not moved")
	}

	g := advisoryTable("grouped")
	g.Group = "grp"
	createTable(t, d, g)
	mustExec(t, d, "INSERT INTO grouped (payload, grp) VALUES ('a', 'g')")
	gq := openAdvisory(t, d, dialects.QueueSpec{Table: g, Group: "g", DeadLetterGroup: "dead"})
	if err := newSession(t, gq).Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, 1); err != nil {
		t.Fatal(err)
	}
	if count(t, d, "SELECT count(*) FROM grouped WHERE grp = 'dead'") != 1 {
		t.Error("row not moved to the dead-letter group")
	}
}
