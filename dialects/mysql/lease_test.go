package mysql

import (
	"bytes"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

func TestClaimLeases(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_lease", leaseTable)
	a := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("a"), Headers: []byte(`{"k": "v"}`)})
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
	if !slices.Equal(ids(rows), []int64{a, b}) {
		t.Fatalf("claimed %v, want rows %d and %d", ids(rows), a, b)
	}
	for _, r := range rows {
		if r.Attempt != 1 || !r.Token.Equal(until) {
			t.Errorf("row %d: attempt %d token %v", r.ID, r.Attempt, r.Token)
		}
		s, _ := stateOf(t, d, tbl, r.ID)
		if s.Attempt != 2 {
			t.Errorf("row %d stored attempt %d", r.ID, s.Attempt)
		}
		// DATETIME(6) keeps the token to the microsecond.
		sameTime(t, "locked_until", s.LockedUntil, until)
	}
	if string(rows[0].Payload) != "a" || !bytes.Contains(rows[0].Headers, []byte(`"k"`)) || rows[1].Headers != nil {
		t.Errorf("payload %q headers %q / %q", rows[0].Payload, rows[0].Headers, rows[1].Headers)
	}

	// Leased rows, other groups and rows not yet due are passed over.
	rows, err = q.ClaimLeases(ctx, t0.Add(time.Second), until.Add(time.Second), 10)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(rows), []int64{c}) {
		t.Fatalf("second claim %v, want row %d only", ids(rows), c)
	}

	// Expired leases are claimable again, and the attempt keeps counting. A lease that
	// ends exactly now has expired.
	later := until.Add(time.Second)
	rows, err = q.ClaimLeases(ctx, later, later.Add(time.Minute), 10)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(rows), []int64{a, b, c}) {
		t.Fatalf("claim after expiry took %v", ids(rows))
	}
	if rows[0].Attempt != 2 || rows[2].Attempt != 2 {
		t.Errorf("attempts %d %d, want 2", rows[0].Attempt, rows[2].Attempt)
	}
	if rows, err := q.ClaimLeases(ctx, later, later.Add(time.Minute), 0); rows != nil || err != nil {
		t.Errorf("limit 0: %v %v", rows, err)
	}
}

// A table of the required columns and a lease, with a TEXT payload.
func TestClaimLeasesMinimalTable(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d, "ra_min")
	mustExec(t, d.DB(), "CREATE TABLE "+quote(name)+" (k BIGINT AUTO_INCREMENT PRIMARY KEY, body TEXT NOT NULL, lease DATETIME(6) NULL)")
	mustExec(t, d.DB(), "INSERT INTO "+quote(name)+" (body) VALUES ('hello'), ('world'), ('again')")
	tbl := dialects.Table{Name: name, ID: "k", Payload: "body", LockedUntil: "lease"}
	q := openLease(t, d, dialects.QueueSpec{Table: tbl})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Second), 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || !bytes.Equal(rows[0].Payload, []byte("hello")) || rows[0].Attempt != 0 {
		t.Fatalf("claimed %+v", rows)
	}
}

// Two dialects (two processes) claiming at once never share a row.
func TestClaimLeasesConcurrently(t *testing.T) {
	d1, d2 := newDialect(t), newDialect(t)
	tbl := newTable(t, d1, "ra_conc", leaseTable)
	const n = 200
	fill(t, d1, tbl.Name, n, "g")
	queues := []dialects.LeaseQueue{
		openLease(t, d1, dialects.QueueSpec{Table: tbl, Group: "g"}),
		openLease(t, d1, dialects.QueueSpec{Table: tbl, Group: "g"}),
		openLease(t, d2, dialects.QueueSpec{Table: tbl, Group: "g"}),
		openLease(t, d2, dialects.QueueSpec{Table: tbl, Group: "g"}),
	}
	var (
		mu   sync.Mutex
		seen = map[int64]int{}
		wg   sync.WaitGroup
	)
	for _, q := range queues {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 7)
					if err != nil {
						t.Error(err)
						return
					}
					if len(rows) == 0 {
						return
					}
					mu.Lock()
					for _, r := range rows {
						seen[r.ID]++
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("claimed %d distinct rows, want %d", len(seen), n)
	}
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("row %d claimed %d times", id, k)
		}
	}
	if got := count(t, d1.DB(), "SELECT COUNT(*) FROM "+quote(tbl.Name)+" WHERE attempt = 2 AND locked_until IS NOT NULL"); got != n {
		t.Fatalf("%d rows stamped once, want %d", got, n)
	}
}

func TestExtendLeases(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_ext", leaseTable)
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
		sameTime(t, "locked_until", s.LockedUntil, want)
	}
	// The old token is spent.
	if moved, _ := q.ExtendLeases(ctx, next.Add(time.Minute), held[:1]); len(moved) != 0 {
		t.Errorf("a stale token extended %v", moved)
	}
	// Every lease holding.
	all := []dialects.Lease{{ID: rows[0].ID, Token: next}, {ID: rows[1].ID, Token: next}, {ID: rows[2].ID, Token: next}}
	moved, err = q.ExtendLeases(ctx, next.Add(time.Minute), all)
	if err != nil || len(moved) != 3 {
		t.Fatalf("moved %v %v", moved, err)
	}
}

func TestExtendManyLeases(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_many", leaseTable)
	const n = maxList + 3
	fill(t, d, tbl.Name, n, "")
	q := openLease(t, d, dialects.QueueSpec{Table: tbl})
	until := t0.Add(time.Minute)
	var held []dialects.Lease
	for {
		rows, err := q.ClaimLeases(ctx, t0, until, n)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		for _, r := range rows {
			held = append(held, dialects.Lease{ID: r.ID, Token: r.Token})
		}
	}
	if len(held) != n {
		t.Fatalf("claimed %d of %d", len(held), n)
	}
	// One stale lease in the second chunk.
	held[n-1].Token = until.Add(-time.Second)
	moved, err := q.ExtendLeases(ctx, until.Add(time.Minute), held)
	if err != nil {
		t.Fatal(err)
	}
	if len(moved) != n-1 || slices.Contains(moved, held[n-1].ID) {
		t.Fatalf("moved %d of %d", len(moved), n)
	}
}

// claimOne publishes a row and claims it.
func claimOne(t *testing.T, d *Dialect, q dialects.LeaseQueue, tbl dialects.Table) dialects.Lease {
	t.Helper()
	publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", rows, err)
	}
	return dialects.Lease{ID: rows[0].ID, Token: rows[0].Token}
}

func TestSettleLease(t *testing.T) {
	at := t0.Add(time.Hour)
	withProcessed := func(name string) dialects.Table {
		tbl := leaseTable(name)
		tbl.ProcessedAt = "processed_at"
		return tbl
	}
	cases := []struct {
		name  string
		shape func(string) dialects.Table
		step  dialects.Step
		check func(t *testing.T, s rowState, exists bool)
	}{
		{"ack deletes", leaseTable, dialects.Step{Kind: dialects.StepAck, Now: t0}, func(t *testing.T, s rowState, exists bool) {
			if exists {
				t.Error("row still there")
			}
		}},
		{"ack marks processed", withProcessed, dialects.Step{Kind: dialects.StepAck, Now: t0}, func(t *testing.T, s rowState, exists bool) {
			if !exists || s.LockedUntil != nil {
				t.Errorf("row %+v", s)
			}
			sameTime(t, "processed_at", s.ProcessedAt, t0)
		}},
		{"retry", leaseTable, dialects.Step{Kind: dialects.StepRetry}, func(t *testing.T, s rowState, exists bool) {
			if !exists || s.LockedUntil != nil || s.Attempt != 2 {
				t.Errorf("row %+v", s)
			}
		}},
		{"release", leaseTable, dialects.Step{Kind: dialects.StepRelease}, func(t *testing.T, s rowState, exists bool) {
			if !exists || s.LockedUntil != nil || s.Attempt != 2 {
				t.Errorf("row %+v", s)
			}
		}},
		{"retry after", leaseTable, dialects.Step{Kind: dialects.StepRetryAfter, At: at}, func(t *testing.T, s rowState, exists bool) {
			if !exists || s.LockedUntil != nil || s.Attempt != 2 {
				t.Errorf("row %+v", s)
			}
			sameTime(t, "retry_after", s.RetryAfter, at)
		}},
		{"dead-letter group", leaseTable, dialects.Step{Kind: dialects.StepDeadLetter}, func(t *testing.T, s rowState, exists bool) {
			if !exists || s.Group != "dead" || s.LockedUntil != nil {
				t.Errorf("row %+v", s)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newDialect(t)
			tbl := newTable(t, d, "ra_settle", c.shape)
			q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
			held := claimOne(t, d, q, tbl)
			before, _ := stateOf(t, d, tbl, held.ID)

			// A stale token changes nothing.
			stale := held
			stale.Token = held.Token.Add(-time.Second)
			if ok, err := q.SettleLease(ctx, c.step, stale); ok || err != nil {
				t.Fatalf("stale settlement: %v %v", ok, err)
			}
			if s, ok := stateOf(t, d, tbl, held.ID); !ok || s.Attempt != before.Attempt || !s.LockedUntil.Equal(*before.LockedUntil) {
				t.Fatalf("a stale settlement changed the row: %+v", s)
			}

			if ok, err := q.SettleLease(ctx, c.step, held); !ok || err != nil {
				t.Fatalf("settle: %v %v", ok, err)
			}
			s, exists := stateOf(t, d, tbl, held.ID)
			c.check(t, s, exists)
			// The token is spent.
			if ok, _ := q.SettleLease(ctx, c.step, held); ok {
				t.Error("a spent token settled again")
			}
		})
	}
}

func TestSettleLeaseWithoutColumns(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_nocol", func(name string) dialects.Table {
		tbl := leaseTable(name)
		tbl.RetryAfter = ""
		return tbl
	})
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	held := claimOne(t, d, q, tbl)
	if _, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, held); err == nil {
		t.Error("dead letter without a dead letter")
	}
	// Without retry_after a delay is kept in the lease. A due time equal to the token
	// still changes the row (MySQL counts changed rows only): it moves a microsecond on.
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepRetryAfter, At: held.Token}, held); err != nil || !ok {
		t.Fatalf("retry after parked in the lease at the token's own time: %v %v", ok, err)
	}
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(tbl.Name)+" WHERE id = ? AND locked_until = ?", held.ID, dbTime(held.Token).Add(time.Microsecond)); n != 1 {
		t.Fatal("the row is not leased until its due time")
	}
}

func TestDeadLetterTableLease(t *testing.T) {
	d := newDialect(t)
	noGroup := func(name string) dialects.Table {
		tbl := leaseTable(name)
		tbl.Group = ""
		return tbl
	}
	tbl := newTable(t, d, "ra_dlq", noGroup)
	dead := newTable(t, d, "ra_dlq_dead", noGroup)
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, DeadLetterTable: dead.Name})
	id := publish(t, d, tbl, dialects.Message{Payload: []byte("poison"), Headers: []byte(`{"a": 1}`)})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim %v %v", rows, err)
	}
	held := dialects.Lease{ID: id, Token: rows[0].Token}

	// A wrong token moves nothing: the copy matched no row, so nothing is committed.
	stale := dialects.Lease{ID: id, Token: held.Token.Add(time.Second)}
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, stale); ok || err != nil {
		t.Fatalf("stale move: %v %v", ok, err)
	}
	if _, ok := stateOf(t, d, tbl, id); !ok {
		t.Fatal("a stale move deleted the row")
	}
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(dead.Name)); n != 0 {
		t.Fatalf("a stale move copied %d rows", n)
	}

	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, held); !ok || err != nil {
		t.Fatalf("move: %v %v", ok, err)
	}
	if _, ok := stateOf(t, d, tbl, id); ok {
		t.Fatal("the row is still in the queue")
	}
	s, ok := stateOf(t, d, dead, id)
	if !ok || s.LockedUntil != nil || s.Attempt != 2 {
		t.Fatalf("dead-letter row %+v %v", s, ok)
	}
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(dead.Name)+" WHERE payload = ? AND JSON_EXTRACT(headers, '$.a') = 1", []byte("poison")); n != 1 {
		t.Fatal("payload or headers not copied")
	}
	if ok, _ := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, held); ok {
		t.Error("a spent token moved again")
	}
}

// The copy matches the token but the delete does not (the row was taken between the two
// statements): the move rolls back.
func TestMoveRollsBackWhenTheDeleteMisses(t *testing.T) {
	d := newDialect(t)
	noGroup := func(name string) dialects.Table {
		tbl := leaseTable(name)
		tbl.Group = ""
		return tbl
	}
	tbl := newTable(t, d, "ra_mv", noGroup)
	dead := newTable(t, d, "ra_mv_dead", noGroup)
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, DeadLetterTable: dead.Name}).(*leaseQueue)
	id := publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 {
		t.Fatal(err)
	}
	// A delete that names another token stands in for a row re-leased in between.
	q.settle.moveDelete = "DELETE FROM " + quote(tbl.Name) + " WHERE id = ? AND locked_until = ? AND FALSE"
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, dialects.Lease{ID: id, Token: rows[0].Token}); ok || err != nil {
		t.Fatalf("move: %v %v", ok, err)
	}
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(dead.Name)); n != 0 {
		t.Fatal("the copy was committed")
	}
	if _, ok := stateOf(t, d, tbl, id); !ok {
		t.Fatal("the row is gone")
	}
}
