package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// takeAllFixture is a table of rows keyed by account, each with its key locked on a
// session of its own, ready for TakeAll.
type takeAllFixture struct {
	d     *Dialect
	tbl   dialects.Table
	q     *advisoryQueue
	ids   map[string]int64 // by account
	takes []dialects.Take  // in the order of accounts
}

func newTakeAllFixture(t *testing.T, tbl dialects.Table, accounts ...string) *takeAllFixture {
	t.Helper()
	f := &takeAllFixture{d: newDialect(t), tbl: tbl, ids: map[string]int64{}}
	createTable(t, f.d, tbl)
	f.q = dialecttest.OpenAdvisory(t, f.d, dialects.QueueSpec{Table: tbl}).(*advisoryQueue)
	for _, a := range accounts {
		mustExec(t, f.d, "INSERT INTO "+quote(tbl.Name)+" (payload, account) VALUES (?, ?)", "p-"+a, a)
		f.ids[a] = int64(count(t, f.d, "SELECT MAX(id) FROM "+quote(tbl.Name)))
	}
	for _, a := range accounts {
		s := dialecttest.NewSession(t, f.q)
		if !dialecttest.TryLock(t, s, tbl.Name+"-"+a+"'s") {
			t.Fatalf("lock of %s refused", a)
		}
		f.takes = append(f.takes, dialects.Take{Session: s, ID: f.ids[a]})
	}
	return f
}

func (f *takeAllFixture) attempt(t *testing.T, account string) int {
	t.Helper()
	return count(t, f.d, "SELECT attempt FROM "+quote(f.tbl.Name)+" WHERE id = ?", f.ids[account])
}

// TakeAll takes, in one statement, exactly the rows Take would take one by one: each
// still claimable (not settled, not delayed) and whose key still renders, byte for byte,
// to the key its session locked. Only those have their attempt counted; each comes back
// on its own take, with its payload and key. Keys with quotes, backslashes, other
// scripts, and bytes that are not UTF-8 (as a BLOB key column holds) match as they are.
func TestTakeAllTakesOnlyClaimableRowsOfTheirKeys(t *testing.T) {
	tbl := advisoryTable("jobs")
	accounts := []string{"a", `q"uo\te`, "ünï", "\xff\xfe", "gone", "changed", "later", "case"}
	f := newTakeAllFixture(t, tbl, accounts...)
	table := quote(tbl.Name)
	mustExec(t, f.d, "UPDATE "+table+" SET processed_at = ? WHERE id = ?", formatTime(t0), f.ids["gone"])
	mustExec(t, f.d, "UPDATE "+table+" SET account = 'other' WHERE id = ?", f.ids["changed"])
	mustExec(t, f.d, "UPDATE "+table+" SET retry_after = ? WHERE id = ?", formatTime(t0.Add(time.Minute)), f.ids["later"])
	mustExec(t, f.d, "UPDATE "+table+" SET account = 'CASE' WHERE id = ?", f.ids["case"])

	before := map[string]int{}
	for _, a := range accounts {
		before[a] = f.attempt(t, a)
	}
	if err := f.q.TakeAll(ctx, t0, f.takes); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"a": true, `q"uo\te`: true, "ünï": true, "\xff\xfe": true}
	for i, a := range accounts {
		tk := f.takes[i]
		if tk.OK != want[a] {
			t.Errorf("account %q: taken %v, want %v", a, tk.OK, want[a])
			continue
		}
		wantAttempt := before[a]
		if want[a] {
			wantAttempt++
			// Row.Attempt is as Take reads it: the attempt the take counted.
			if tk.Row.ID != f.ids[a] || string(tk.Row.Payload) != "p-"+a || tk.Row.Key != tbl.Name+"-"+a+"'s" || tk.Row.Attempt != before[a] {
				t.Errorf("account %q: row %+v", a, tk.Row)
			}
		}
		if got := f.attempt(t, a); got != wantAttempt {
			t.Errorf("account %q: attempt %d in the table, want %d", a, got, wantAttempt)
		}
	}
	// A second TakeAll of the same rows takes them again (the key excludes every other
	// claim, as for Take) and counts a second attempt.
	if err := f.q.TakeAll(ctx, t0, f.takes[:2]); err != nil || !f.takes[0].OK || !f.takes[1].OK || f.takes[0].Row.Attempt != before["a"]+1 {
		t.Fatalf("second take: %v %+v", err, f.takes[:2])
	}
}

// A table without an attempt column is read, not written, by TakeAll, with the same
// checks.
func TestTakeAllWithoutAnAttemptColumnReadsTheRows(t *testing.T) {
	tbl := advisoryTable("jobs")
	tbl.Attempt = ""
	f := newTakeAllFixture(t, tbl, "a", "b", "changed")
	mustExec(t, f.d, "UPDATE "+quote(tbl.Name)+" SET account = 'other' WHERE id = ?", f.ids["changed"])
	if err := f.q.TakeAll(ctx, t0, f.takes); err != nil {
		t.Fatal(err)
	}
	if !f.takes[0].OK || !f.takes[1].OK || f.takes[2].OK {
		t.Fatalf("takes %+v, want a and b taken", f.takes)
	}
	if string(f.takes[1].Row.Payload) != "p-b" {
		t.Errorf("row b %+v", f.takes[1].Row)
	}
}

// TakeAll refuses, before it takes anything, a session that holds no key, one of another
// queue, and a row named twice: the error names the row.
func TestTakeAllRefusesSessionsItCannotCheck(t *testing.T) {
	tbl := advisoryTable("jobs")
	f := newTakeAllFixture(t, tbl, "a", "b")
	other := dialecttest.OpenAdvisory(t, f.d, dialects.QueueSpec{Table: tbl})
	cases := map[string]func() dialects.Take{
		"no key held": func() dialects.Take {
			return dialects.Take{Session: dialecttest.NewSession(t, f.q), ID: f.ids["b"]}
		},
		"another queue's session": func() dialects.Take {
			s := dialecttest.NewSession(t, other)
			return dialects.Take{Session: s, ID: f.ids["b"]}
		},
		"a row twice": func() dialects.Take { return dialects.Take{Session: f.takes[0].Session, ID: f.ids["a"]} },
	}
	attemptA := f.attempt(t, "a")
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			takes := []dialects.Take{f.takes[0], bad()}
			err := f.q.TakeAll(ctx, t0, takes)
			if err == nil {
				t.Fatal("no error")
			}
			dialecttest.Contains(t, err.Error(), fmt.Sprintf("row %d", takes[1].ID))
			if takes[0].OK || takes[1].OK {
				t.Errorf("takes %+v after an error", takes)
			}
			if a := f.attempt(t, "a"); a != attemptA {
				t.Errorf("attempt of a %d after a refused TakeAll, want %d", a, attemptA)
			}
		})
	}
}

// TestTakeAllFindsItsRowsByID: the take names its rows by id, so it looks each up by its
// key rather than reading the table, whatever the table's size; a claim of n rows costs
// n lookups.
func TestTakeAllFindsItsRowsByID(t *testing.T) {
	for _, writes := range []bool{true, false} {
		tbl := advisoryTable("jobs")
		if !writes {
			tbl.Attempt = ""
		}
		f := newTakeAllFixture(t, tbl, "a", "b", "c")
		mustExec(t, f.d, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) INSERT INTO "+quote(tbl.Name)+" (payload, account) SELECT 'x', 'k' || i FROM n")
		mustExec(t, f.d, "ANALYZE")
		slot, n := pairSlot(3)
		args := make([]any, 0, 2*n+2)
		for i := range n {
			args = append(args, f.ids["a"]+int64(i%3), "k")
		}
		args = append(args, sql.Named("now", formatTime(t0)), sql.Named("group", ""))
		rows, err := f.d.DB().QueryContext(ctx, "EXPLAIN QUERY PLAN "+f.q.takeAll.text(slot), args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		text := strings.Join(plan, "; ")
		if !strings.Contains(text, "SEARCH "+tbl.Name) || strings.Contains(text, "SCAN "+tbl.Name) {
			t.Errorf("writes %v: plan %q; want the table searched by id, never scanned", writes, text)
		}
	}
}

// TestTakeAllCutShortCountsNoAttempt: a TakeAll whose context ends while it runs or reads
// its rows back reports an error and every take not taken; the table's attempts then
// read as before (the UPDATE counted them as it started, so the read must roll back).
// Without the error, every row is taken and counted once. Large payloads make the read
// back long enough for the cuts, at fractions of an uncut TakeAll's time, to land in it.
func TestTakeAllCutShortCountsNoAttempt(t *testing.T) {
	const n = 40
	big := strings.Repeat("x", 1<<18)
	tbl := advisoryTable("jobs")
	run := func(cut time.Duration) (took time.Duration, taken, counted int, err error) {
		d := newDialect(t)
		createTable(t, d, tbl)
		q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl}).(*advisoryQueue)
		for i := range n {
			mustExec(t, d, "INSERT INTO "+quote(tbl.Name)+" (payload, account) VALUES (?, ?)", big, fmt.Sprint("a", i))
		}
		takes := lockedTakes(t, q, n)
		sum := "SELECT SUM(attempt) FROM " + quote(tbl.Name)
		before := count(t, d, sum)
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if cut > 0 {
			time.AfterFunc(cut, cancel)
		}
		start := time.Now()
		err = q.TakeAll(cctx, t0, takes)
		took = time.Since(start)
		for _, tk := range takes {
			if tk.OK {
				taken++
			}
		}
		return took, taken, count(t, d, sum) - before, err
	}
	whole, taken, counted, err := run(0)
	if err != nil || taken != n || counted != n {
		t.Fatalf("uncut: %v, %d taken, %d counted", err, taken, counted)
	}
	cutShort := 0
	for i := 1; i <= 12; i++ {
		cut := whole * time.Duration(i) / 13
		_, taken, counted, err := run(cut)
		switch {
		case err != nil:
			cutShort++
			if taken != 0 || counted != 0 {
				t.Errorf("cut at %v of %v: %v, yet %d taken and %d attempts counted; want none", cut, whole, err, taken, counted)
			}
		case taken != n || counted != n:
			t.Errorf("cut at %v of %v: no error, %d taken and %d counted; want %d each", cut, whole, taken, counted, n)
		}
	}
	t.Logf("an uncut TakeAll took %v; %d of 12 cuts ended it early", whole, cutShort)
}

// TestTakeAllOfMoreRowsThanOneStatementNames: more takes than one statement names
// (maxSettle pairs) run as several statements in the one transaction; every row is taken
// and counted once, the last chunk padded as the first.
func TestTakeAllOfMoreRowsThanOneStatementNames(t *testing.T) {
	const n = maxSettle + 3
	tbl := advisoryTable("jobs")
	d := newDialect(t)
	createTable(t, d, tbl)
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl}).(*advisoryQueue)
	mustExec(t, d, fmt.Sprintf("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %d) "+
		"INSERT INTO %s (payload, account) SELECT 'p', 'k' || i FROM n", n, quote(tbl.Name)))
	takes := lockedTakes(t, q, n)
	sum := "SELECT SUM(attempt) FROM " + quote(tbl.Name)
	before := count(t, d, sum)
	if err := q.TakeAll(ctx, t0, takes); err != nil {
		t.Fatal(err)
	}
	for _, tk := range takes {
		if !tk.OK || tk.Row.ID != tk.ID {
			t.Fatalf("take of row %d: %+v", tk.ID, tk)
		}
	}
	if got := count(t, d, sum) - before; got != n {
		t.Errorf("%d attempts counted, want %d", got, n)
	}
}

// lockedTakes reads q's first n candidates and locks each one's key on a session of its
// own: the takes of a claim about to take them together.
func lockedTakes(t *testing.T, q *advisoryQueue, n int) []dialects.Take {
	t.Helper()
	cands, err := q.Candidates(ctx, t0, n)
	if err != nil || len(cands) != n {
		t.Fatalf("candidates %d, %v", len(cands), err)
	}
	takes := make([]dialects.Take, 0, n)
	for _, c := range cands {
		s := dialecttest.NewSession(t, q)
		if !dialecttest.TryLock(t, s, c.Key) {
			t.Fatalf("lock of %q refused", c.Key)
		}
		takes = append(takes, dialects.Take{Session: s, ID: c.ID})
	}
	return takes
}
