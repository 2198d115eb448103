package dialecttest

import (
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// advisoryScenarios are the advisory lock form (AdvisoryQueue, Session).
var advisoryScenarios = []scenario{
	{name: "AdvisoryCandidatesSkipHeldKeys", run: testAdvisoryCandidatesSkipHeldKeys},
	{name: "AdvisoryTake", run: testAdvisoryTake},
	{name: "AdvisoryTakeWithoutAttempt", run: testAdvisoryTakeWithoutAttempt},
	{name: "AdvisoryTakeRechecksTheKey", run: testAdvisoryTakeRechecksTheKey},
	{name: "AdvisorySettle", run: testAdvisorySettle},
	{name: "AdvisoryDeadLetter", run: testAdvisoryDeadLetter},
}

// firstID is the lowest id of a table.
func (e *env) firstID(table string) int64 {
	e.t.Helper()
	return int64(e.count("SELECT MIN(id) FROM " + e.q(table)))
}

// Candidates come in claim order with their keys (a NULL key column renders empty), pass
// over rows not due or processed, and pass over keys held by a session of the queue or,
// where the database can tell (KeyInspector), by anyone; the limit still fills. The probe
// leaves no lock behind.
func testAdvisoryCandidatesSkipHeldKeys(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_cand", advisoryTable)
	table := e.q(tbl.Name)
	e.exec("INSERT INTO " + table + " (payload, account) VALUES ('a', 'x'), ('b', 'x'), ('c', 'y'), ('d', NULL), ('e', 'z')")
	e.exec("INSERT INTO "+table+" (payload, account, retry_after) VALUES ('f', 'w', ?)", h.TimeArg(t0.Add(time.Second)))
	e.exec("INSERT INTO "+table+" (payload, account, processed_at) VALUES ('g', 'v', ?)", h.TimeArg(t0))
	q := e.openAdvisory(dialects.QueueSpec{Table: tbl})
	first := e.firstID(tbl.Name)
	c := func(i int64, account string) dialects.Candidate {
		return dialects.Candidate{ID: first + i, Key: keyOf(tbl.Name, account)}
	}
	inspector, _ := h.(KeyInspector)

	cands, err := q.Candidates(ctx, t0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if want := []dialects.Candidate{c(0, "x"), c(1, "x"), c(2, "y"), c(3, ""), c(4, "z")}; !slices.Equal(cands, want) {
		t.Fatalf("candidates %v, want %v", cands, want)
	}

	s := e.session(q)
	if !tryLock(t, s, keyOf(tbl.Name, "x")) {
		t.Fatal("lock refused")
	}
	// The held key's rows are passed over and the limit still fills.
	cands, err = q.Candidates(ctx, t0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := []dialects.Candidate{c(2, "y"), c(3, "")}; !slices.Equal(cands, want) {
		t.Fatalf("candidates with x held: %v, want %v", cands, want)
	}
	if inspector == nil {
		return
	}
	// The probe's locks end with the statement.
	if n := inspector.LocksHeld(t, e.d, keyOf(tbl.Name, "y"), keyOf(tbl.Name, ""), keyOf(tbl.Name, "z")); n != 0 {
		t.Fatalf("the candidates query left %d locks", n)
	}
	// A key locked by anyone, as another service would, is passed over too.
	release := inspector.HoldKey(t, e.d, keyOf(tbl.Name, "y"))
	defer release()
	cands, err = q.Candidates(ctx, t0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if want := []dialects.Candidate{c(3, ""), c(4, "z")}; !slices.Equal(cands, want) {
		t.Fatalf("candidates with x and y held: %v, want %v", cands, want)
	}
	release()
	unlock(t, s)
	if n := inspector.LocksHeld(t, e.d, keyOf(tbl.Name, "x"), keyOf(tbl.Name, "y")); n != 0 {
		t.Fatalf("%d locks left", n)
	}
}

// The take counts the attempt and reads the row (attempt as it stood, headers, key); a
// row processed, delayed or missing is not taken and nothing is counted. Retry and
// release write nothing; a retry after delays the row.
func testAdvisoryTake(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_take", func(name string) dialects.Table {
		tbl := advisoryTable(name)
		tbl.Headers = "headers"
		return tbl
	})
	e.exec("INSERT INTO " + e.q(tbl.Name) + " (payload, account, headers) VALUES ('a', 'x', '{}'), ('b', 'y', NULL)")
	a := e.firstID(tbl.Name)
	q := e.openAdvisory(dialects.QueueSpec{Table: tbl})
	advisoryTakeCountsAndAcks(t, e, tbl, q, a)
	advisoryTakeRetryAndDelay(t, e, tbl, q, a+1)
}

// advisoryTakeCountsAndAcks: the take of row a (key "x") counts its attempt and reads
// it; once acked, or missing, a row is not taken and nothing is counted.
func advisoryTakeCountsAndAcks(t *testing.T, e *env, tbl dialects.Table, q dialects.AdvisoryQueue, a int64) {
	t.Helper()
	s := e.session(q)
	if !tryLock(t, s, keyOf(tbl.Name, "x")) {
		t.Fatal("lock refused")
	}
	r, ok, err := s.Take(ctx, a, t0)
	if err != nil || !ok {
		t.Fatalf("take: %v %v", ok, err)
	}
	if r.ID != a || string(r.Payload) != "a" || r.Attempt != 1 || r.Key != keyOf(tbl.Name, "x") || string(r.Headers) != "{}" {
		t.Errorf("took %+v", r)
	}
	if st, _ := e.state(tbl, a); st.Attempt != 2 {
		t.Errorf("attempt stored %d, want 2", st.Attempt)
	}
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, a); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Take(ctx, a, t0); ok || err != nil {
		t.Fatalf("a processed row was taken: %v %v", ok, err)
	}
	if _, ok, err := s.Take(ctx, a+1000, t0); ok || err != nil {
		t.Fatalf("take of a missing row: %v %v", ok, err)
	}
	if st, _ := e.state(tbl, a); st.Attempt != 2 {
		t.Errorf("a refused take counted: attempt %d", st.Attempt)
	}
	unlock(t, s)
}

// advisoryTakeRetryAndDelay: on row b (key "y", no headers) retry and release write
// nothing, retry_after delays the row, and an unstarted release gives back the count.
func advisoryTakeRetryAndDelay(t *testing.T, e *env, tbl dialects.Table, q dialects.AdvisoryQueue, b int64) {
	t.Helper()
	s := e.session(q)
	if !tryLock(t, s, keyOf(tbl.Name, "y")) {
		t.Fatal("lock refused")
	}
	if r, ok, err := s.Take(ctx, b, t0); !ok || err != nil || r.Headers != nil {
		t.Fatalf("take: %+v %v %v", r, ok, err)
	}
	// Retry and release write nothing; retry_after delays the row.
	for _, k := range []dialects.StepKind{dialects.StepRetry, dialects.StepRelease} {
		if err := s.Settle(ctx, dialects.Step{Kind: k}, b); err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := e.state(tbl, b); st.Attempt != 2 || st.RetryAfter != nil || st.ProcessedAt != nil {
		t.Errorf("retry and release wrote: %+v", st)
	}
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepRetryAfter, At: t0.Add(time.Hour)}, b); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Take(ctx, b, t0); ok || err != nil {
		t.Fatalf("a delayed row was taken before it was due: %v %v", ok, err)
	}
	if st, _ := e.state(tbl, b); st.Attempt != 2 {
		t.Errorf("a refused take counted: attempt %d", st.Attempt)
	}
	if _, ok, _ := s.Take(ctx, b, t0.Add(time.Hour)); !ok {
		t.Fatal("a due row was refused")
	}
	// A release of a row whose handler never started gives back the attempt the take
	// counted; the unlock then returns the row.
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepRelease, Unstarted: true}, b); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.state(tbl, b); st.Attempt != 2 || st.RetryAfter == nil || st.ProcessedAt != nil {
		t.Errorf("a release of a row never started left %+v, want attempt 2 (as before the take)", st)
	}
}

// Without an attempt column the take is a guarded read; ack deletes.
func testAdvisoryTakeWithoutAttempt(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_take0", func(name string) dialects.Table {
		tbl := advisoryTable(name)
		tbl.Attempt, tbl.ProcessedAt = "", ""
		return tbl
	})
	q := e.openAdvisory(dialects.QueueSpec{Table: tbl})
	id := e.publish(tbl, dialects.Message{Payload: []byte("\x01\x02"), NotBefore: t0.Add(time.Minute)})
	s := e.session(q)
	if !tryLock(t, s, keyOf(tbl.Name, "")) {
		t.Fatal("lock refused")
	}
	if _, ok, err := s.Take(ctx, id, t0); ok || err != nil {
		t.Fatalf("take of a delayed row: %v %v", ok, err)
	}
	r, ok, err := s.Take(ctx, id, t0.Add(time.Minute))
	if err != nil || !ok || r.ID != id || r.Attempt != 0 || r.Key != keyOf(tbl.Name, "") || string(r.Payload) != "\x01\x02" {
		t.Fatalf("take: %+v %v %v", r, ok, err)
	}
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepAck}, id); err != nil {
		t.Fatal(err)
	}
	if e.count("SELECT COUNT(*) FROM "+e.q(tbl.Name)) != 0 {
		t.Error("ack did not delete")
	}
}

// The take re-checks that the row's key still renders to the key the session locked: a
// row whose key column changed between the candidates and the take is not taken (the
// caller unlocks and passes it over), and its attempt is not counted. The comparison is
// exact: a change of letter case or of trailing spaces is a change, also where the key
// column's collation would call those equal (Types.CaseBlindText; MySQL's default).
func testAdvisoryTakeRechecksTheKey(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_takek", advisoryTable)
	if blind := e.caps.Types.CaseBlindText; blind != "" {
		e.exec("ALTER TABLE " + e.q(tbl.Name) + " RENAME COLUMN account TO account_old")
		e.exec("ALTER TABLE " + e.q(tbl.Name) + " ADD COLUMN account " + blind)
	}
	q := e.openAdvisory(dialects.QueueSpec{Table: tbl})
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	setAccount := func(v string) {
		e.exec("UPDATE "+e.q(tbl.Name)+" SET account = ? WHERE id = ?", v, id)
	}
	setAccount("alice")
	for _, changed := range []string{"bob", "ALICE", "alice "} {
		cands, err := q.Candidates(ctx, t0, 1)
		if err != nil || len(cands) != 1 || cands[0].ID != id {
			t.Fatalf("candidates %v %v", cands, err)
		}
		locked := cands[0].Key
		setAccount(changed)
		s := e.session(q)
		if !tryLock(t, s, locked) {
			t.Fatal("lock refused")
		}
		if r, ok, err := s.Take(ctx, id, t0); ok || err != nil {
			t.Errorf("key %q locked, account now %q: take %+v %v %v, want not taken", locked, changed, r, ok, err)
		}
		if st, _ := e.state(tbl, id); st.Attempt != 1 {
			t.Errorf("account %q: attempt %d after a take of a changed key, want 1", changed, st.Attempt)
		}
		unlock(t, s)
		setAccount("alice")
	}
	// The key unchanged: taken, and counted.
	cands, err := q.Candidates(ctx, t0, 1)
	if err != nil || len(cands) != 1 || cands[0].Key != keyOf(tbl.Name, "alice") {
		t.Fatalf("candidates %v %v", cands, err)
	}
	s := e.session(q)
	if !tryLock(t, s, cands[0].Key) {
		t.Fatal("lock refused")
	}
	r, ok, err := s.Take(ctx, id, t0)
	if !ok || err != nil || r.Key != cands[0].Key || r.Attempt != 1 {
		t.Fatalf("take %+v %v %v", r, ok, err)
	}
	if st, _ := e.state(tbl, id); st.Attempt != 2 {
		t.Errorf("attempt %d after the take, want 2", st.Attempt)
	}
	unlock(t, s)
	// A session that holds no key has nothing to re-check against: refused.
	s = e.session(q)
	if _, ok, err := s.Take(ctx, id, t0.Add(1)); ok || err == nil {
		t.Errorf("a take without a key held: %v %v, want an error", ok, err)
	}
	unlock(t, s)
}

// Each step runs on the session holding the key; an ended session settles nothing (unless
// Caps.EndedSessionWorks).
func testAdvisorySettle(t *testing.T, h Harness) {
	at := t0.Add(time.Hour)
	cases := []struct {
		name  string
		step  dialects.Step
		check func(t *testing.T, s RowState, exists bool)
	}{
		{"ack marks processed", dialects.Step{Kind: dialects.StepAck, Now: t0}, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.Attempt != 2 {
				t.Errorf("row %+v (exists %v)", s, exists)
			}
			sameTime(t, "processed_at", s.ProcessedAt, t0)
		}},
		{"retry writes nothing", dialects.Step{Kind: dialects.StepRetry}, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.Attempt != 2 || s.ProcessedAt != nil || s.RetryAfter != nil {
				t.Errorf("row %+v (exists %v)", s, exists)
			}
		}},
		{"retry after", dialects.Step{Kind: dialects.StepRetryAfter, At: at}, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.Attempt != 2 || s.ProcessedAt != nil {
				t.Errorf("row %+v (exists %v)", s, exists)
			}
			sameTime(t, "retry_after", s.RetryAfter, at)
		}},
		{"dead-letter group", dialects.Step{Kind: dialects.StepDeadLetter}, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.Group != "dead" {
				t.Errorf("row %+v (exists %v)", s, exists)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := setup(t, h)
			tbl := e.table("ra_advs", func(name string) dialects.Table {
				tbl := advisoryTable(name)
				tbl.Group = "grp"
				return tbl
			})
			q := e.openAdvisory(dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
			id := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("p")})
			s := e.session(q)
			if !tryLock(t, s, keyOf(tbl.Name, "")) {
				t.Fatal("lock refused")
			}
			if _, ok, err := s.Take(ctx, id, t0); !ok || err != nil {
				t.Fatalf("take %v %v", ok, err)
			}
			if err := s.Settle(ctx, c.step, id); err != nil {
				t.Fatal(err)
			}
			st, exists := e.state(tbl, id)
			c.check(t, st, exists)
			unlock(t, s)
			if err := s.Settle(ctx, c.step, id); err == nil && !e.caps.EndedSessionWorks {
				t.Error("an ended session settled")
			}
		})
	}
}

// A dead letter moves the row into the dead-letter table with its columns (one statement,
// on the session), or into the dead-letter group.
func testAdvisoryDeadLetter(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_advd", advisoryTable)
	dead := e.table("ra_advd_dead", advisoryTable)
	q := e.openAdvisory(dialects.QueueSpec{Table: tbl, DeadLetterTable: dead.Name})
	id := e.publish(tbl, dialects.Message{Payload: []byte("poison")})
	e.exec("UPDATE "+e.q(tbl.Name)+" SET account = 'acc' WHERE id = ?", id)
	s := e.session(q)
	if !tryLock(t, s, keyOf(tbl.Name, "acc")) {
		t.Fatal("lock refused")
	}
	if _, ok, err := s.Take(ctx, id, t0); !ok || err != nil {
		t.Fatalf("take %v %v", ok, err)
	}
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, id); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.state(tbl, id); ok {
		t.Fatal("row still in the queue")
	}
	if n := e.count("SELECT COUNT(*) FROM "+e.q(dead.Name)+" WHERE id = ? AND account = 'acc' AND attempt = 2", id); n != 1 {
		t.Fatal("row not copied with its columns")
	}
	unlock(t, s)

	// Into the dead-letter group, on a session that holds no key.
	g := e.table("ra_advg", func(name string) dialects.Table {
		tbl := advisoryTable(name)
		tbl.Group = "grp"
		return tbl
	})
	gid := e.publish(g, dialects.Message{Group: "g", Payload: []byte("a")})
	gq := e.openAdvisory(dialects.QueueSpec{Table: g, Group: "g", DeadLetterGroup: "dead"})
	if err := e.session(gq).Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, gid); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.state(g, gid); st.Group != "dead" {
		t.Errorf("row not moved to the dead-letter group: %+v", st)
	}
}
