package mysql

import (
	"database/sql"
	"slices"
	"strings"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

var advisoryTable = dialecttest.AdvisoryTable

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
	q1 := dialecttest.OpenAdvisory(t, d1, dialects.QueueSpec{Table: tbl})
	q2 := dialecttest.OpenAdvisory(t, d2, dialects.QueueSpec{Table: tbl})
	key := tbl.Name + "-x's"
	name := LockName(databaseName(t, d1.DB()), key)

	s1, s2 := dialecttest.NewSession(t, q1), dialecttest.NewSession(t, q2)
	if !dialecttest.TryLock(t, s1, key) {
		t.Fatal("first lock refused")
	}
	if got := usedBy(t, d1.DB(), name); got != sessionConnID(t, s1) {
		t.Fatalf("lock %q held by connection %d, not the session's", name, got)
	}
	if dialecttest.TryLock(t, s2, key) {
		t.Fatal("another dialect locked a held key")
	}
	if _, err := s1.TryLock(ctx, "other"); err == nil {
		t.Fatal("a session took a second key")
	}
	if !dialecttest.TryLock(t, s2, key+"2") {
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

	s3 := dialecttest.NewSession(t, q2)
	if !dialecttest.TryLock(t, s3, key) {
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
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	s := dialecttest.NewSession(t, q)
	if !dialecttest.TryLock(t, s, "k") {
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

// Names longer than 64 characters are locked by their SHA-256 hex, computed alike in SQL
// and by LockName, and keys of any character survive the trip.
func TestAdvisoryLockNames(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_name", func(name string) dialects.Table {
		return dialects.Table{Name: name, ID: "id", Payload: "payload", AdvisoryKey: "{account}"}
	})
	db := d.DB()
	dbName := databaseName(t, db)
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl})
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
		s := dialecttest.NewSession(t, q)
		if !dialecttest.TryLock(t, s, key) {
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

// A session whose statement failed still unlocks; one whose connection died is closed.
func TestAdvisorySessionDies(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_die", advisoryTable)
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	s := dialecttest.NewSession(t, q)
	if !dialecttest.TryLock(t, s, "k") {
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
