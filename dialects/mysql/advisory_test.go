package mysql

import (
	"database/sql"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

func advisoryTable(name string) dialects.Table {
	return dialects.Table{Name: name, ID: "id", Payload: "payload", Attempt: "attempt", ProcessedAt: "processed_at",
		RetryAfter: "retry_after", AdvisoryKey: name + "-{account}'s\\"}
}

func newSession(t *testing.T, q dialects.AdvisoryQueue) dialects.Session {
	t.Helper()
	s, err := q.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Abort(ctx) })
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

func databaseName(t *testing.T, db *sql.DB) string {
	t.Helper()
	var name string
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

// usedBy reports the connection holding a lock name (0: free).
func usedBy(t *testing.T, db *sql.DB, name string) int64 {
	t.Helper()
	var id sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", name).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id.Int64
}

func sessionConnID(t *testing.T, s dialects.Session) int64 {
	t.Helper()
	var id int64
	if err := s.(*session).conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func TestAdvisoryLockExcludesOtherSessions(t *testing.T) {
	d1, d2 := newDialect(t), newDialect(t)
	tbl := newTable(t, d1, "ra_adv", advisoryTable)
	q1 := openAdvisory(t, d1, dialects.QueueSpec{Table: tbl})
	q2 := openAdvisory(t, d2, dialects.QueueSpec{Table: tbl})
	key := tbl.Name + "-x's"
	name := LockName(databaseName(t, d1.DB()), key)

	s1, s2 := newSession(t, q1), newSession(t, q2)
	if !tryLock(t, s1, key) {
		t.Fatal("first lock refused")
	}
	if got := usedBy(t, d1.DB(), name); got != sessionConnID(t, s1) {
		t.Fatalf("lock %q held by connection %d, not the session's", name, got)
	}
	if tryLock(t, s2, key) {
		t.Fatal("another dialect locked a held key")
	}
	if _, err := s1.TryLock(ctx, "other"); err == nil {
		t.Fatal("a session took a second key")
	}
	if !tryLock(t, s2, key+"2") {
		t.Fatal("a free key was refused")
	}
	if closed, err := s2.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock: %v %v", closed, err)
	}

	conn := sessionConnID(t, s1)
	if closed, err := s1.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock: %v %v", closed, err)
	}
	if got := usedBy(t, d1.DB(), name); got != 0 {
		t.Fatalf("after unlock IS_USED_LOCK is %d, want NULL", got)
	}
	// A confirmed release returns the connection to the pool.
	if !connectionAlive(t, d1.DB(), conn) {
		t.Error("the session's connection was closed after a confirmed unlock")
	}
	if closed, err := s1.Unlock(ctx); closed || err != nil {
		t.Fatalf("second unlock: %v %v", closed, err)
	}
	if _, err := s1.TryLock(ctx, key); err == nil {
		t.Error("an ended session locked")
	}

	s3 := newSession(t, q2)
	if !tryLock(t, s3, key) {
		t.Fatal("an unlocked key stayed held")
	}
	conn = sessionConnID(t, s3)
	if err := s3.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s3.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if got := usedBy(t, d1.DB(), name); got != 0 {
		t.Fatalf("after abort IS_USED_LOCK is %d, want NULL", got)
	}
	waitGone(t, d1.DB(), conn)
}

// A session refused its key returns its connection to the pool; one whose release the
// server does not confirm closes it.
func TestAdvisoryUnlockUnconfirmed(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_unc", advisoryTable)
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	s := newSession(t, q)
	if !tryLock(t, s, "k") {
		t.Fatal("lock refused")
	}
	conn := sessionConnID(t, s)
	// Released behind the session's back: RELEASE_LOCK then answers NULL.
	if _, err := s.(*session).conn.ExecContext(ctx, "DO RELEASE_LOCK(?)", LockName(databaseName(t, d.DB()), "k")); err != nil {
		t.Fatal(err)
	}
	closed, err := s.Unlock(ctx)
	if !closed || err != nil {
		t.Fatalf("unconfirmed unlock: closed %v err %v", closed, err)
	}
	waitGone(t, d.DB(), conn)
}

func TestAdvisoryCandidatesSkipHeldKeys(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_cand", advisoryTable)
	table := quote(tbl.Name)
	mustExec(t, d.DB(), "INSERT INTO "+table+" (payload, account) VALUES ('a', 'x'), ('b', 'x'), ('c', 'y'), ('d', NULL), ('e', 'z')")
	mustExec(t, d.DB(), "INSERT INTO "+table+" (payload, account, retry_after) VALUES ('f', 'w', ?)", dbTime(t0.Add(time.Second)))
	mustExec(t, d.DB(), "INSERT INTO "+table+" (payload, account, processed_at) VALUES ('g', 'v', ?)", dbTime(t0))
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	first := count(t, d.DB(), "SELECT MIN(id) FROM "+table)
	id := func(i int) int64 { return int64(first + i) }
	k := func(account string) string { return tbl.Name + "-" + account + "'s\\" }

	cands, err := q.Candidates(ctx, t0, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []dialects.Candidate{{ID: id(0), Key: k("x")}, {ID: id(1), Key: k("x")}, {ID: id(2), Key: k("y")}, {ID: id(3), Key: k("")}, {ID: id(4), Key: k("z")}}
	if !slices.Equal(cands, want) {
		t.Fatalf("candidates %v, want %v", cands, want)
	}

	// A key locked by anyone (here a plain connection, as another service would) is
	// passed over, and the limit still fills.
	other, err := d.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer discard(other)
	var got int
	if err := other.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", LockName(databaseName(t, d.DB()), k("x"))).Scan(&got); err != nil || got != 1 {
		t.Fatalf("GET_LOCK: %v %v", got, err)
	}
	cands, err = q.Candidates(ctx, t0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cands, []dialects.Candidate{{ID: id(2), Key: k("y")}, {ID: id(3), Key: k("")}}) {
		t.Fatalf("candidates with x held: %v", cands)
	}
	// A session of the queue's holding y is seen too.
	s := newSession(t, q)
	if !tryLock(t, s, k("y")) {
		t.Fatal("lock refused")
	}
	cands, err = q.Candidates(ctx, t0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cands, []dialects.Candidate{{ID: id(3), Key: k("")}, {ID: id(4), Key: k("z")}}) {
		t.Fatalf("candidates with x and y held: %v", cands)
	}
}

// Names longer than 64 characters are locked by their SHA-256 hex, computed alike in SQL
// and by LockName, and keys of any character survive the trip.
func TestAdvisoryLockNames(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_name", func(name string) dialects.Table {
		return dialects.Table{Name: name, ID: "id", Payload: "payload", AdvisoryKey: "{account}"}
	})
	db := d.DB()
	dbName := databaseName(t, db)
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	short := "k-é-🙂"
	exact := strings.Repeat("e", 64-len(strings.ToLower(dbName)+"."))
	long := exact + "x"
	for _, key := range []string{short, exact, long, strings.Repeat("🙂", 70)} {
		mustExec(t, db, "INSERT INTO "+quote(tbl.Name)+" (payload, account) VALUES ('p', ?)", key)
		name := LockName(dbName, key)
		hashed := len([]rune(strings.ToLower(dbName)+"."+key)) > 64
		if hashed != (len(name) == 64 && !strings.Contains(name, ".")) {
			t.Errorf("key %q: name %q", key, name)
		}
		s := newSession(t, q)
		if !tryLock(t, s, key) {
			t.Fatalf("key %q refused", key)
		}
		if got := usedBy(t, db, name); got != sessionConnID(t, s) {
			t.Fatalf("key %q: LockName %q is not the lock the session holds", key, name)
		}
		cands, err := q.Candidates(ctx, t0, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cands {
			if c.Key == key {
				t.Fatalf("key %q held, yet a candidate", key)
			}
		}
		if closed, err := s.Unlock(ctx); closed || err != nil {
			t.Fatalf("unlock %v %v", closed, err)
		}
		if usedBy(t, db, name) != 0 {
			t.Fatalf("key %q still locked", key)
		}
		cands, err = q.Candidates(ctx, t0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(cands, func(c dialects.Candidate) bool { return c.Key == key }) {
			t.Fatalf("key %q: no candidate carries it back: %v", key, cands)
		}
	}
	if got := LockName("App", "jobs-7"); got != "app.jobs-7" {
		t.Errorf("LockName = %q", got)
	}
}

func TestAdvisoryTake(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_take", advisoryTable)
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	id := publish(t, d, tbl, dialects.Message{Payload: []byte("p"), Headers: nil})
	s := newSession(t, q)
	key := keyOf(t, d, tbl, id)
	if !tryLock(t, s, key) {
		t.Fatal("lock refused")
	}
	r, ok, err := s.Take(ctx, id, t0)
	if err != nil || !ok {
		t.Fatalf("take: %v %v", ok, err)
	}
	if r.ID != id || string(r.Payload) != "p" || r.Attempt != 1 || r.Key != key {
		t.Fatalf("took %+v", r)
	}
	if st, _ := stateOf(t, d, tbl, id); st.Attempt != 2 {
		t.Fatalf("attempt column %d, want 2", st.Attempt)
	}
	// Settled meanwhile (or not due): not taken, nothing counted.
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET retry_after = ? WHERE id = ?", dbTime(t0.Add(time.Minute)), id)
	if _, ok, err := s.Take(ctx, id, t0); ok || err != nil {
		t.Fatalf("take of a delayed row: %v %v", ok, err)
	}
	if _, ok, err := s.Take(ctx, id+1000, t0); ok || err != nil {
		t.Fatalf("take of a missing row: %v %v", ok, err)
	}
	if st, _ := stateOf(t, d, tbl, id); st.Attempt != 2 {
		t.Fatalf("attempt column %d, want 2", st.Attempt)
	}
}

// Without an attempt column the take is a guarded read.
func TestAdvisoryTakeWithoutAttempt(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_take0", func(name string) dialects.Table {
		tbl := advisoryTable(name)
		tbl.Attempt = ""
		return tbl
	})
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	id := publish(t, d, tbl, dialects.Message{Payload: []byte("p"), NotBefore: t0.Add(time.Minute)})
	s := newSession(t, q)
	if !tryLock(t, s, keyOf(t, d, tbl, id)) {
		t.Fatal("lock refused")
	}
	if _, ok, err := s.Take(ctx, id, t0); ok || err != nil {
		t.Fatalf("take of a delayed row: %v %v", ok, err)
	}
	r, ok, err := s.Take(ctx, id, t0.Add(time.Minute))
	if err != nil || !ok || r.ID != id || r.Attempt != 0 {
		t.Fatalf("take: %+v %v %v", r, ok, err)
	}
}

func TestAdvisorySettle(t *testing.T) {
	at := t0.Add(time.Hour)
	cases := []struct {
		name  string
		step  dialects.Step
		check func(t *testing.T, s rowState, exists bool)
	}{
		{"ack marks processed", dialects.Step{Kind: dialects.StepAck, Now: t0}, func(t *testing.T, s rowState, exists bool) {
			sameTime(t, "processed_at", s.ProcessedAt, t0)
		}},
		{"retry writes nothing", dialects.Step{Kind: dialects.StepRetry}, func(t *testing.T, s rowState, exists bool) {
			if !exists || s.Attempt != 2 || s.ProcessedAt != nil || s.RetryAfter != nil {
				t.Errorf("row %+v", s)
			}
		}},
		{"retry after", dialects.Step{Kind: dialects.StepRetryAfter, At: at}, func(t *testing.T, s rowState, exists bool) {
			if s.Attempt != 2 {
				t.Errorf("row %+v", s)
			}
			sameTime(t, "retry_after", s.RetryAfter, at)
		}},
		{"dead-letter group", dialects.Step{Kind: dialects.StepDeadLetter}, func(t *testing.T, s rowState, exists bool) {
			if s.Group != "dead" {
				t.Errorf("row %+v", s)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newDialect(t)
			tbl := newTable(t, d, "ra_advs", func(name string) dialects.Table {
				tbl := advisoryTable(name)
				tbl.Group = "grp"
				return tbl
			})
			q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
			id := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
			s := newSession(t, q)
			if !tryLock(t, s, keyOf(t, d, tbl, id)) {
				t.Fatal("lock refused")
			}
			if _, ok, err := s.Take(ctx, id, t0); !ok || err != nil {
				t.Fatalf("take %v %v", ok, err)
			}
			if err := s.Settle(ctx, c.step, id); err != nil {
				t.Fatal(err)
			}
			st, exists := stateOf(t, d, tbl, id)
			c.check(t, st, exists)
			if closed, err := s.Unlock(ctx); closed || err != nil {
				t.Fatalf("unlock %v %v", closed, err)
			}
			if err := s.Settle(ctx, c.step, id); err == nil {
				t.Error("an ended session settled")
			}
		})
	}
}

func TestAdvisoryDeadLetterTable(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_advd", advisoryTable)
	dead := newTable(t, d, "ra_advd_dead", advisoryTable)
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl, DeadLetterTable: dead.Name})
	id := publish(t, d, tbl, dialects.Message{Payload: []byte("poison")})
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET account = 'acc' WHERE id = ?", id)
	s := newSession(t, q)
	if !tryLock(t, s, keyOf(t, d, tbl, id)) {
		t.Fatal("lock refused")
	}
	if _, ok, err := s.Take(ctx, id, t0); !ok || err != nil {
		t.Fatalf("take %v %v", ok, err)
	}
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, id); err != nil {
		t.Fatal(err)
	}
	if _, ok := stateOf(t, d, tbl, id); ok {
		t.Fatal("row still in the queue")
	}
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(dead.Name)+" WHERE id = ? AND account = 'acc' AND attempt = 2", id); n != 1 {
		t.Fatal("row not copied with its columns")
	}
	if closed, err := s.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock %v %v", closed, err)
	}
}

// A session whose statement failed still unlocks; one whose connection died is closed.
func TestAdvisorySessionDies(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_die", advisoryTable)
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	s := newSession(t, q)
	if !tryLock(t, s, "k") {
		t.Fatal("lock refused")
	}
	conn := sessionConnID(t, s)
	mustExec(t, d.DB(), "KILL ?", conn)
	waitGone(t, d.DB(), conn)
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, 1); err == nil {
		t.Error("a settlement on a killed connection succeeded")
	}
	closed, err := s.Unlock(ctx)
	if !closed || err == nil {
		t.Fatalf("unlock on a killed connection: closed %v err %v", closed, err)
	}
	if usedBy(t, d.DB(), LockName(databaseName(t, d.DB()), "k")) != 0 {
		t.Fatal("the key outlived its session")
	}
	for range 5 {
		if err := d.DB().PingContext(ctx); err != nil {
			t.Fatalf("the pool kept a dead connection: %v", err)
		}
	}
}
