package postgres

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

func TestClaimLeases(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	a := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("a"), Headers: []byte(`{"k":"v"}`)})
	b := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("b")})
	c := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("c")})
	publish(t, d, tbl, dialects.Message{Group: "other", Payload: []byte("x")})
	publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("later"), NotBefore: t0.Add(time.Hour)})
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})

	until := t0.Add(30 * time.Second)
	rows, err := q.ClaimLeases(ctx, t0, until, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].ID != a || rows[1].ID != b {
		t.Fatalf("claimed %+v, want rows %d and %d", rows, a, b)
	}
	for _, r := range rows {
		if r.Attempt != 1 || !r.Token.Equal(until) {
			t.Errorf("row %d: attempt %d token %v", r.ID, r.Attempt, r.Token)
		}
		s, _ := stateOf(t, d, tbl, r.ID)
		if s.Attempt != 2 || !sameTime(s.LockedUntil, until) {
			t.Errorf("row %d stored %+v", r.ID, s)
		}
	}
	var h map[string]string
	if err := json.Unmarshal(rows[0].Headers, &h); err != nil || h["k"] != "v" {
		t.Errorf("headers %q: %v", rows[0].Headers, err)
	}
	if string(rows[0].Payload) != "a" || rows[1].Headers != nil {
		t.Errorf("payload %q headers %q", rows[0].Payload, rows[1].Headers)
	}

	// Leased rows, other groups and rows not yet due are passed over.
	rows, err = q.ClaimLeases(ctx, t0.Add(time.Second), until.Add(time.Second), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ID != c {
		t.Fatalf("second claim %+v, want row %d only", rows, c)
	}

	// Expired leases are claimable again, and the attempt keeps counting.
	later := until.Add(time.Second)
	rows, err = q.ClaimLeases(ctx, later, later.Add(time.Minute), 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(rows); !slices.Equal(got, []int64{a, b, c}) {
		t.Fatalf("claim after expiry took %v", got)
	}
	if rows[0].Attempt != 2 || rows[2].Attempt != 2 {
		t.Errorf("attempts %d %d, want 2", rows[0].Attempt, rows[2].Attempt)
	}
	if rows, err := q.ClaimLeases(ctx, later, later, 0); rows != nil || err != nil {
		t.Errorf("a claim of 0 rows: %v %v", rows, err)
	}
}

// A text payload reads as its bytes, and a table of only the required columns plus the
// lease works.
func TestClaimLeasesMinimalTable(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d)
	mustExec(t, d, "CREATE TABLE "+quote(name)+" (k integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text NOT NULL, lease timestamptz)")
	mustExec(t, d, "INSERT INTO "+quote(name)+" (body) VALUES ('hello'), ('world')")
	tbl := dialects.Table{Name: name, ID: "k", Payload: "body", LockedUntil: "lease"}
	q := openLease(t, d, dialects.QueueSpec{Table: tbl})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Second), 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || string(rows[0].Payload) != "hello" || rows[0].Attempt != 0 || rows[1].ID <= rows[0].ID {
		t.Fatalf("claimed %+v", rows)
	}
	if id := publish(t, d, tbl, dialects.Message{Payload: []byte("text")}); id == 0 {
		t.Fatal("no id")
	}
}

// Two claims at once never take the same row.
func TestClaimLeasesConcurrently(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	const n = 200
	mustExec(t, d, "INSERT INTO "+quote(tbl.Name)+" (payload) SELECT 'p' FROM generate_series(1, $1)", n)
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: ""})
	results := make(chan []int64, 4)
	for range 4 {
		go func() {
			var got []int64
			for {
				rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 7)
				if err != nil {
					t.Error(err)
					break
				}
				if len(rows) == 0 {
					break
				}
				got = append(got, ids(rows)...)
			}
			results <- got
		}()
	}
	seen := map[int64]bool{}
	for range 4 {
		for _, id := range <-results {
			if seen[id] {
				t.Fatalf("row %d claimed twice", id)
			}
			seen[id] = true
		}
	}
	if len(seen) != n {
		t.Fatalf("claimed %d rows, want %d", len(seen), n)
	}
}

func TestExtendLeases(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	for range 5 {
		publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	}
	q := openLease(t, d, dialects.QueueSpec{Table: tbl})
	until := t0.Add(time.Minute)
	rows, err := q.ClaimLeases(ctx, t0, until, 5)
	if err != nil {
		t.Fatal(err)
	}
	if moved, err := q.ExtendLeases(ctx, until, nil); moved != nil || err != nil {
		t.Fatalf("empty extension: %v %v", moved, err)
	}
	// Rows 1-3 hold their tokens, row 4 names a stale one; row 5 is not named at all.
	held := []dialects.Lease{
		{ID: rows[0].ID, Token: rows[0].Token},
		{ID: rows[1].ID, Token: rows[1].Token},
		{ID: rows[2].ID, Token: rows[2].Token},
		{ID: rows[3].ID, Token: until.Add(-time.Second)},
	}
	next := until.Add(time.Minute)
	moved, err := q.ExtendLeases(ctx, next, held)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(moved)
	if !slices.Equal(moved, []int64{rows[0].ID, rows[1].ID, rows[2].ID}) {
		t.Fatalf("moved %v", moved)
	}
	for i, want := range []time.Time{next, next, next, until, until} {
		s, _ := stateOf(t, d, tbl, rows[i].ID)
		if !sameTime(s.LockedUntil, want) {
			t.Errorf("row %d locked until %v, want %v", rows[i].ID, s.LockedUntil, want)
		}
	}
	// The old token is spent.
	if moved, _ := q.ExtendLeases(ctx, next, held[:1]); len(moved) != 0 {
		t.Errorf("a stale token extended %v", moved)
	}
}

func TestExtendManyLeases(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	const n = 5000
	mustExec(t, d, "INSERT INTO "+quote(tbl.Name)+" (payload) SELECT 'p' FROM generate_series(1, $1)", n)
	q := openLease(t, d, dialects.QueueSpec{Table: tbl})
	until := t0.Add(time.Minute)
	rows, err := q.ClaimLeases(ctx, t0, until, n)
	if err != nil {
		t.Fatal(err)
	}
	held := make([]dialects.Lease, len(rows))
	for i, r := range rows {
		held[i] = dialects.Lease{ID: r.ID, Token: r.Token}
	}
	moved, err := q.ExtendLeases(ctx, until.Add(time.Minute), held)
	if err != nil {
		t.Fatal(err)
	}
	if len(moved) != n {
		t.Fatalf("moved %d of %d", len(moved), n)
	}
}

func TestSettleLease(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	tbl.ProcessedAt = "processed_at"
	createTable(t, d, tbl)
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
	now := t0.Add(time.Second)

	claim := func(t *testing.T) dialects.Row {
		t.Helper()
		id := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
		rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
		if err != nil || len(rows) != 1 || rows[0].ID != id {
			t.Fatalf("claim: %+v %v", rows, err)
		}
		return rows[0]
	}
	settle := func(t *testing.T, r dialects.Row, step dialects.Step) bool {
		t.Helper()
		ok, err := q.SettleLease(ctx, step, dialects.Lease{ID: r.ID, Token: r.Token})
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	stale := func(r dialects.Row) dialects.Row { r.Token = r.Token.Add(-time.Second); return r }

	steps := []struct {
		step  dialects.Step
		check func(rowState, bool) bool
	}{
		{dialects.Step{Kind: dialects.StepAck, Now: now}, func(s rowState, ok bool) bool {
			return ok && sameTime(s.ProcessedAt, now) && s.LockedUntil == nil
		}},
		{dialects.Step{Kind: dialects.StepRetry, Now: now}, func(s rowState, ok bool) bool {
			return ok && s.ProcessedAt == nil && s.LockedUntil == nil && s.Attempt == 2
		}},
		{dialects.Step{Kind: dialects.StepRelease, Now: now}, func(s rowState, ok bool) bool {
			return ok && s.LockedUntil == nil && s.Attempt == 2
		}},
		{dialects.Step{Kind: dialects.StepRetryAfter, Now: now, At: now.Add(time.Hour)}, func(s rowState, ok bool) bool {
			return ok && sameTime(s.RetryAfter, now.Add(time.Hour)) && s.LockedUntil == nil
		}},
		{dialects.Step{Kind: dialects.StepDeadLetter, Now: now}, func(s rowState, ok bool) bool {
			return ok && s.Group == "dead" && s.LockedUntil == nil
		}},
	}
	for _, c := range steps {
		t.Run(c.step.Kind.String(), func(t *testing.T) {
			r := claim(t)
			before, _ := stateOf(t, d, tbl, r.ID)
			// A stale token changes nothing.
			if settle(t, stale(r), c.step) {
				t.Fatal("a stale token settled")
			}
			if after, _ := stateOf(t, d, tbl, r.ID); !sameState(before, after) {
				t.Fatalf("a stale settlement changed the row: %+v -> %+v", before, after)
			}
			if !settle(t, r, c.step) {
				t.Fatal("the lease did not settle")
			}
			if s, ok := stateOf(t, d, tbl, r.ID); !c.check(s, ok) {
				t.Fatalf("row after %s: %+v (exists %v)", c.step.Kind, s, ok)
			}
			// The token is spent: settling again finds no lease.
			if settle(t, r, c.step) {
				t.Fatal("a spent token settled again")
			}
			mustExec(t, d, "DELETE FROM "+quote(tbl.Name))
		})
	}
}

func sameState(a, b rowState) bool {
	eq := func(x, y *time.Time) bool { return (x == nil) == (y == nil) && (x == nil || x.Equal(*y)) }
	return a.Attempt == b.Attempt && a.Group == b.Group && eq(a.LockedUntil, b.LockedUntil) &&
		eq(a.RetryAfter, b.RetryAfter) && eq(a.ProcessedAt, b.ProcessedAt)
}

func TestSettleLeaseAckDeletes(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	id := publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := openLease(t, d, dialects.QueueSpec{Table: tbl})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 {
		t.Fatal(rows, err)
	}
	ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, dialects.Lease{ID: id, Token: rows[0].Token})
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, exists := stateOf(t, d, tbl, id); exists {
		t.Fatal("ack kept the row")
	}
	// Steps the subscription cannot run are errors, not silent successes.
	if _, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, dialects.Lease{ID: id}); err == nil {
		t.Error("a dead letter without a destination settled")
	}
}

// The dead-letter table move is one statement, fenced by the token, and the moved row
// arrives without its lease.
func TestSettleLeaseMovesToTable(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	tbl.Group = ""
	createTable(t, d, tbl)
	dead := tbl
	dead.Name = tableName(t, d)
	createTable(t, d, dead)
	id := publish(t, d, tbl, dialects.Message{Payload: []byte("poison"), Headers: []byte(`{"a":"b"}`)})
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, DeadLetterTable: dead.Name})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 {
		t.Fatal(rows, err)
	}
	step := dialects.Step{Kind: dialects.StepDeadLetter, Now: t0}
	if ok, err := q.SettleLease(ctx, step, dialects.Lease{ID: id, Token: rows[0].Token.Add(time.Second)}); ok || err != nil {
		t.Fatalf("stale move: %v %v", ok, err)
	}
	if n := count(t, d, "SELECT count(*) FROM "+quote(dead.Name)); n != 0 {
		t.Fatalf("a stale move copied %d rows", n)
	}
	if ok, err := q.SettleLease(ctx, step, dialects.Lease{ID: id, Token: rows[0].Token}); !ok || err != nil {
		t.Fatalf("move: %v %v", ok, err)
	}
	if _, exists := stateOf(t, d, tbl, id); exists {
		t.Fatal("the row stayed in the queue table")
	}
	s, exists := stateOf(t, d, dead, id)
	if !exists || s.LockedUntil != nil || s.Attempt != 2 {
		t.Fatalf("dead-letter row %+v (exists %v)", s, exists)
	}
	if n := count(t, d, "SELECT count(*) FROM "+quote(dead.Name)+" WHERE payload = 'poison' AND headers ->> 'a' = 'b'"); n != 1 {
		t.Fatalf("the dead-letter table holds %d copies", n)
	}
	if ok, err := q.SettleLease(ctx, step, dialects.Lease{ID: id, Token: rows[0].Token}); ok || err != nil {
		t.Fatalf("second move: %v %v", ok, err)
	}
}
