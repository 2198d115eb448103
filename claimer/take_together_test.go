package claimer

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// takeSpy is a queue that takes rows together, counting its TakeAll calls; before the
// first it runs before (another process settling rows between the read and the take).
type takeSpy struct {
	dialects.AdvisoryQueue
	together dialects.TakesTogether
	before   func()
	calls    [][]int64
}

func (q *takeSpy) TakeAll(ctx context.Context, now time.Time, takes []dialects.Take) error {
	if f := q.before; f != nil {
		q.before = nil
		f()
	}
	ids := make([]int64, len(takes))
	for i, t := range takes {
		ids[i] = t.ID
	}
	q.calls = append(q.calls, ids)
	return q.together.TakeAll(ctx, now, takes)
}

// TestAdvisoryClaimTakesItsRowsTogetherAndReplacesThoseGone: on a queue that takes rows
// together (SQLite), a claim locks its keys and takes their rows in one statement; rows
// settled by another process between the read and the take are replaced from the
// candidates left, in read order, and their keys are unlocked. Only the rows taken have
// their attempt counted.
func TestAdvisoryClaimTakesItsRowsTogetherAndReplacesThoseGone(t *testing.T) {
	ctx := context.Background()
	real, tbl, exec, d := openTogether(t, "together", "a", "b", "c", "d", "e", "f")
	attempts := func() string {
		rows, err := d.DB().QueryContext(ctx, "SELECT id, attempt FROM "+tbl+" ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var id, a int
			if err := rows.Scan(&id, &a); err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%d:%d", id, a))
		}
		return fmt.Sprint(out)
	}
	before := attempts()
	q := &takeSpy{AdvisoryQueue: real, together: real.(dialects.TakesTogether),
		before: func() { exec("DELETE FROM " + tbl + " WHERE id IN (1, 2)") }}
	c := &claimer{cfg: Config{Poison: &Poison{}, Ctx: ctx}, ctx: ctx}
	claims, err := c.claimAdvisory(q, time.Now(), 3, 6, 0)
	defer unlockAll(t, claims)
	if err != nil || fmt.Sprint(rowIDs(claims)) != "[3 4 5]" {
		t.Fatalf("claim %v, %v; want rows 3, 4 and 5", rowIDs(claims), err)
	}
	if fmt.Sprint(q.calls) != "[[1 2 3] [4 5]]" {
		t.Errorf("TakeAll calls %v; want rows 1 to 3 in one, then 4 and 5 in place of the two gone", q.calls)
	}
	// Rows 3 to 5 counted an attempt each; row 6 was not taken.
	if before != "[1:1 2:1 3:1 4:1 5:1 6:1]" {
		t.Fatalf("attempts before the claim %s", before)
	}
	if got := attempts(); got != "[3:2 4:2 5:2 6:1]" {
		t.Errorf("attempts after the claim %s; want rows 3 to 5 counted once, row 6 untouched", got)
	}
	// The keys of the rows gone were unlocked; those of the rows taken are held.
	for _, k := range []string{"a", "b"} {
		s := dialecttest.NewSession(t, real)
		if !dialecttest.TryLock(t, s, tbl+"-"+k) {
			t.Errorf("key %s of a row gone is still held", k)
		}
		if _, err := s.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if dialecttest.TryLock(t, dialecttest.NewSession(t, real), tbl+"-c") {
		t.Error("key c of a row taken is not held")
	}
}

// openTogether opens a SQLite table of one row per key (ids from 1), its advisory queue
// (which takes rows together), a statement runner on it, and the dialect.
func openTogether(t *testing.T, name string, keys ...string) (dialects.AdvisoryQueue, string, func(string), *sqlite.Dialect) {
	t.Helper()
	ctx := context.Background()
	d, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "together.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() }) // after the table's own cleanup drops it
	exec := func(q string) {
		t.Helper()
		if _, err := d.DB().ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	q, tbl := keptTable(t, keptDB{name: "sqlite", d: d, exec: func(t *testing.T, q string) { exec(q) }}, name, keys...)
	return q, tbl, exec, d
}

// keyFree reports whether key can be locked (and unlocks it again).
func keyFree(t *testing.T, q dialects.AdvisoryQueue, key string) bool {
	t.Helper()
	s := dialecttest.NewSession(t, q)
	ok := dialecttest.TryLock(t, s, key)
	if _, err := s.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestAdvisoryClaimTriesAKeysNextRowWhenItsFirstIsGone: two candidates of one key, the
// first settled by another process between the read and the take. The key's next row is
// tried in the same claim, in the order read, as a take one row at a time does: the
// claim does not come back short while that row is due.
func TestAdvisoryClaimTriesAKeysNextRowWhenItsFirstIsGone(t *testing.T) {
	real, tbl, exec, _ := openTogether(t, "dupkey", "a", "a", "b")
	q := &takeSpy{AdvisoryQueue: real, together: real.(dialects.TakesTogether),
		before: func() { exec("DELETE FROM " + tbl + " WHERE id = 1") }}
	ctx := context.Background()
	c := &claimer{cfg: Config{Poison: &Poison{}, Ctx: ctx}, ctx: ctx}
	claims, err := c.claimAdvisory(q, time.Now(), 2, 3, 0)
	defer unlockAll(t, claims)
	if err != nil || fmt.Sprint(rowIDs(claims)) != "[2 3]" {
		t.Fatalf("claim %v, %v (TakeAll calls %v); want rows 2 and 3: row 2 of key a is due once row 1 is gone", rowIDs(claims), err, q.calls)
	}
}

// failingSessions is a queue that takes rows together and fails to open its nth session.
type failingSessions struct {
	dialects.AdvisoryQueue
	dialects.TakesTogether
	n, calls int
}

func (f *failingSessions) Session(ctx context.Context) (dialects.Session, error) {
	if f.calls++; f.calls >= f.n {
		return nil, errors.New("injected: no session")
	}
	return f.AdvisoryQueue.Session(ctx)
}

// TestAdvisoryClaimThatFailsUnlocksTheKeysItHadNotTakenYet: a claim that fails while it
// holds keys locked for rows it has not taken yet unlocks them: nobody else would, and
// their rows would never be claimed again.
func TestAdvisoryClaimThatFailsUnlocksTheKeysItHadNotTakenYet(t *testing.T) {
	real, tbl, _, _ := openTogether(t, "leak", "a", "b", "c")
	q := &failingSessions{AdvisoryQueue: real, TakesTogether: real.(dialects.TakesTogether), n: 3}
	ctx := context.Background()
	c := &claimer{cfg: Config{Poison: &Poison{}, Ctx: ctx}, ctx: ctx}
	claims, err := c.claimAdvisory(q, time.Now(), 3, 3, 0)
	unlockAll(t, claims)
	if err == nil || len(claims) != 0 {
		t.Fatalf("claim %v, %v; want the injected error and no row", rowIDs(claims), err)
	}
	for _, k := range []string{"a", "b"} {
		if !keyFree(t, real, tbl+"-"+k) {
			t.Errorf("key %s, locked by the claim that failed, is still held", k)
		}
	}
}

// TestTransactionalAdvisoryClaimTakesItsRowsOneByOne: a transactional claim takes each
// row as it locks its key and opens the row's transaction right after, never several
// rows in one statement first: on SQLite an IMMEDIATE transaction holds the write lock,
// and rows taken together ahead of it would have their attempts counted and then fail to
// begin (given back with an attempt spent, their handlers never run).
func TestTransactionalAdvisoryClaimTakesItsRowsOneByOne(t *testing.T) {
	real, _, _, _ := openTogether(t, "txone", "a", "b", "c")
	q := &takeSpy{AdvisoryQueue: real, together: real.(dialects.TakesTogether)}
	ctx := context.Background()
	c := &claimer{cfg: Config{Poison: &Poison{}, Ctx: ctx, Transactional: true}, ctx: ctx}
	claims, err := c.claimAdvisory(q, time.Now(), 3, 3, 0)
	defer func() {
		for _, cl := range claims {
			if err := cl.Session.Abort(ctx); err != nil {
				t.Error(err)
			}
		}
	}()
	if err != nil || fmt.Sprint(rowIDs(claims)) != "[1 2 3]" {
		t.Fatalf("claim %v, %v; want rows 1 to 3", rowIDs(claims), err)
	}
	if len(q.calls) != 0 {
		t.Errorf("TakeAll calls %v in a transactional claim; want none (each row taken as its key is locked)", q.calls)
	}
}
