package claimer

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

func cand(id int64) dialects.Candidate { return dialects.Candidate{ID: id, Key: fmt.Sprint("k", id)} }

func TestKeptCandidatesServeInReadOrderButNotKeysTakenOrHeldOrStaleOnes(t *testing.T) {
	k := &Kept{}
	p := &Poison{}
	k.keep([]dialects.Candidate{cand(1), cand(2), cand(3), cand(4), cand(5)}, map[string]struct{}{"k2": {}}, map[string]struct{}{"k5": {}}, time.Now())
	var got []int64
	for {
		c, ok := k.take(p)
		if !ok {
			break
		}
		got = append(got, c.ID)
	}
	if fmt.Sprint(got) != "[1 3 4]" {
		t.Fatalf("took %v; want [1 3 4]: in read order, without the key the claim took or found held", got)
	}
	k.keep([]dialects.Candidate{cand(1), {ID: 7, Key: "k1"}, cand(3)}, nil, nil, time.Now())
	k.drop("k1")
	if c, ok := k.take(p); !ok || c.ID != 3 {
		t.Fatalf("took %v after key k1 was dropped; want row 3", c)
	}
	k.keep([]dialects.Candidate{cand(5)}, nil, nil, time.Now().Add(-keptFor-time.Millisecond))
	if c, ok := k.take(p); ok {
		t.Fatalf("took %v, read longer than %v ago", c, keptFor)
	}
	var nilKept *Kept
	nilKept.keep([]dialects.Candidate{cand(6)}, nil, nil, time.Now())
	nilKept.drop("k6")
	if _, ok := nilKept.take(p); ok || nilKept.read(3) != 3 {
		t.Fatal("a nil Kept kept something, or read more than asked")
	}
	if k.read(3) != keptRead || k.read(40) != 40 {
		t.Fatalf("read %d and %d; want %d and 40", k.read(3), k.read(40), keptRead)
	}
}

// keptDB is one database the claim tests run on, with a table of its own.
type keptDB struct {
	name string
	d    dialects.Dialect
	exec func(t *testing.T, query string)
}

// keptDBs opens SQLite, PostgreSQL and MariaDB; a server that is down fails the test.
func keptDBs(t *testing.T) []keptDB {
	ctx := context.Background()
	lite, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "kept.db"))
	if err != nil {
		t.Fatal(err)
	}
	pg, err := postgres.Open(ctx, dialecttest.Env("ROWACTOR_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
	if err != nil {
		t.Fatalf("PostgreSQL is unreachable: %v", err)
	}
	my, err := mysql.Open(ctx, dialecttest.Env("ROWACTOR_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test?parseTime=true"))
	if err != nil {
		t.Fatalf("MariaDB is unreachable: %v", err)
	}
	for _, d := range []dialects.Dialect{lite, pg, my} {
		t.Cleanup(func() { d.Close() })
	}
	return []keptDB{
		{"sqlite", lite, func(t *testing.T, q string) {
			t.Helper()
			if _, err := lite.DB().ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}},
		{"postgres", pg, func(t *testing.T, q string) {
			t.Helper()
			if _, err := pg.Pool().Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}},
		{"mysql", my, func(t *testing.T, q string) {
			t.Helper()
			if _, err := my.DB().ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}},
	}
}

// keptTable creates a table of keys (one row each, ids from 1) on db, named for the test
// and the process, and opens its advisory queue.
func keptTable(t *testing.T, db keptDB, name string, keys ...string) (dialects.AdvisoryQueue, string) {
	t.Helper()
	tbl := dialects.Table{Name: fmt.Sprintf("%s_%d", name, time.Now().UnixNano()%1e9), ID: "id", Payload: "payload", Attempt: "attempt"}
	tbl.AdvisoryKey = tbl.Name + "-{payload}" // keys are database-wide
	dialecttest.CreateTable(t, db.d, tbl, func(stmt string) { db.exec(t, stmt) })
	t.Cleanup(func() { db.exec(t, "DROP TABLE "+tbl.Name) })
	for i, k := range keys {
		db.exec(t, fmt.Sprintf("INSERT INTO %s (id, payload) VALUES (%d, '%s')", tbl.Name, i+1, k))
	}
	q, err := db.d.Open(context.Background(), dialects.QueueSpec{Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q.(dialects.AdvisoryQueue), tbl.Name
}

func unlockAll(t *testing.T, cs []Claim) {
	t.Helper()
	for _, cl := range cs {
		if _, err := cl.Session.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAdvisoryClaimReadsAfreshWhenItsKeptCandidatesAreGone: candidates kept from the last
// read whose rows were taken meanwhile do not make a claim come back short while the
// table holds a due row: the claim reads afresh.
func TestAdvisoryClaimReadsAfreshWhenItsKeptCandidatesAreGone(t *testing.T) {
	for _, db := range keptDBs(t) {
		t.Run(db.name, func(t *testing.T) {
			ctx := context.Background()
			q, tbl := keptTable(t, db, "kept_gone", "a", "b", "c", "d", "e")
			kept := &Kept{For: time.Hour} // the second claim meets the kept candidates, however slow the machine
			c := &claimer{cfg: Config{Kept: kept, Poison: &Poison{}, Ctx: ctx}, ctx: ctx}
			first, err := c.claimAdvisory(q, time.Now(), 1, 1, 0)
			if err != nil || fmt.Sprint(rowIDs(first)) != "[1]" {
				t.Fatalf("first claim %v, %v; want row 1", rowIDs(first), err)
			}
			defer unlockAll(t, first)
			if n := len(kept.cands); n != 4 {
				t.Fatalf("%d candidates kept; want rows 2 to 5", n)
			}
			// Another process takes rows 2 to 5; row 6 comes in.
			db.exec(t, "DELETE FROM "+tbl+" WHERE id BETWEEN 2 AND 5")
			db.exec(t, "INSERT INTO "+tbl+" (id, payload) VALUES (6, 'f')")
			second, err := c.claimAdvisory(q, time.Now(), 1, 1, 0)
			defer unlockAll(t, second)
			if err != nil || fmt.Sprint(rowIDs(second)) != "[6]" {
				t.Fatalf("second claim %v, %v; want row 6, read afresh once the kept candidates were gone", rowIDs(second), err)
			}
		})
	}
}

// TestKeptCandidatesKeepAKeysRowsInReadOrder: a key found held elsewhere when its row is
// tried has its later rows dropped from the kept candidates, so that once the key is free
// its first row is claimed before them, as a fresh read gives them. Another session takes
// the key between the read and the try (reads pass over keys held as they read).
func TestKeptCandidatesKeepAKeysRowsInReadOrder(t *testing.T) {
	for _, db := range keptDBs(t) {
		t.Run(db.name, func(t *testing.T) {
			ctx := context.Background()
			real, _ := keptTable(t, db, "kept_order", "a", "b", "a", "c")
			var other dialects.Session
			q := &afterRead{AdvisoryQueue: real, then: func(cands []dialects.Candidate) {
				other = dialecttest.NewSession(t, real) // another holder of row 1's key, from now on
				if !dialecttest.TryLock(t, other, cands[0].Key) {
					t.Fatalf("key %q was not free", cands[0].Key)
				}
			}}
			c := &claimer{cfg: Config{Kept: &Kept{For: time.Hour}, Poison: &Poison{}, Ctx: ctx}, ctx: ctx}
			first, err := c.claimAdvisory(q, time.Now(), 1, 1, 0)
			defer unlockAll(t, first)
			if err != nil || fmt.Sprint(rowIDs(first)) != "[2]" {
				t.Fatalf("first claim %v, %v; want row 2 (row 1's key taken elsewhere)", rowIDs(first), err)
			}
			if _, err := other.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			second, err := c.claimAdvisory(q, time.Now(), 2, 2, 0)
			defer unlockAll(t, second)
			if err != nil || fmt.Sprint(rowIDs(second)) != "[4 1]" {
				t.Fatalf("second claim %v, %v; want rows 4 (kept) and 1 (read afresh), never row 3 (row 1's key) ahead of row 1",
					rowIDs(second), err)
			}
		})
	}
}

// afterRead runs then once, right after the first candidates read.
type afterRead struct {
	dialects.AdvisoryQueue
	then func([]dialects.Candidate)
}

func (q *afterRead) Candidates(ctx context.Context, now time.Time, limit int) ([]dialects.Candidate, error) {
	cands, err := q.AdvisoryQueue.Candidates(ctx, now, limit)
	if f := q.then; f != nil && err == nil && len(cands) > 0 {
		q.then = nil
		f(cands)
	}
	return cands, err
}

func rowIDs(cs []Claim) []int64 {
	ids := make([]int64, len(cs))
	for i, c := range cs {
		ids[i] = c.Row.ID
	}
	return ids
}
