package dialecttest

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// leaseScenarios are the lease form's claims, extensions and settlements (LeaseQueue).
var leaseScenarios = []scenario{
	{name: "ClaimLeases", run: testClaimLeases},
	{name: "ClaimLeasesMinimalTable", run: testClaimLeasesMinimalTable},
	{name: "ClaimLeasesConcurrently", run: testClaimLeasesConcurrently},
	{name: "ExtendLeases", run: testExtendLeases},
	{name: "ExtendManyLeases", run: testExtendManyLeases},
	{name: "SettleLease", run: testSettleLease},
	{name: "SettleLeaseWithoutColumns", run: testSettleLeaseWithoutColumns},
	{name: "SettleLeaseDeadLetterTable", run: testSettleLeaseDeadLetterTable},
	{name: "ExtendLeasesNeverConfirmsByValue", run: testExtendLeasesNeverConfirmsByValue},
	{name: "ExtendLeasesToTheSameToken", run: testExtendLeasesToTheSameToken},
	{name: "ClaimTokenIsLaterThanTheExpiredOne", run: testClaimTokenIsLaterThanTheExpiredOne},
	{name: "ExtendAndBatchSkipARowAnotherSessionHolds", run: testExtendAndBatchSkipARowAnotherSessionHolds,
		applies: concurrentWriters},
	{name: "WaitCutShortChangesNothing", run: testWaitCutShortChangesNothing, applies: concurrentWriters},
	{name: "WaitCancelledWithoutDeadlineChangesNothing", run: testWaitCancelledWithoutDeadlineChangesNothing,
		applies: concurrentWriters},
	{name: "WaitingSettlementAndALateClaim", run: testWaitingSettlementAndALateClaim, applies: concurrentWriters},
	{name: "RenewerReadsBackARoundItDidNotHear", run: testRenewerReadsBackARoundItDidNotHear},
}

func testClaimLeases(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_lease", leaseTable)
	a := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("a"), Headers: []byte(`{"k":"v"}`)})
	b := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("b")})
	c := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("c")})
	e.publish(tbl, dialects.Message{Group: "other", Payload: []byte("x")})
	e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("later"), NotBefore: t0.Add(time.Hour)})
	q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g"})

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
		s, _ := e.state(tbl, r.ID)
		if s.Attempt != 2 {
			t.Errorf("row %d stored attempt %d", r.ID, s.Attempt)
		}
		// The token is kept to the microsecond.
		sameTime(t, "locked_until", s.LockedUntil, until)
	}
	var hdr map[string]string
	if err := json.Unmarshal(rows[0].Headers, &hdr); err != nil || hdr["k"] != "v" || len(hdr) != 1 {
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
	if !slices.Equal(ids(rows), []int64{c}) {
		t.Fatalf("second claim %v, want row %d only", ids(rows), c)
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
	if rows, err := q.ClaimLeases(ctx, later, later.Add(time.Minute), 0); rows != nil || err != nil {
		t.Errorf("a claim of 0 rows: %v %v", rows, err)
	}
}

// A text payload reads as its bytes, and a table of only the required columns plus the
// lease works.
func testClaimLeasesMinimalTable(t *testing.T, h Harness) {
	e := setup(t, h)
	name := e.name("ra_min")
	ty := e.caps.Types
	e.exec("CREATE TABLE " + e.q(name) + " (k " + ty.ID + ", body " + ty.Text + " NOT NULL, lease " + ty.Time + ")")
	e.exec("INSERT INTO " + e.q(name) + " (body) VALUES ('hello'), ('world'), ('again')")
	tbl := dialects.Table{Name: name, ID: "k", Payload: "body", LockedUntil: "lease"}
	q := e.openLease(dialects.QueueSpec{Table: tbl})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Second), 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || string(rows[0].Payload) != "hello" || rows[0].Attempt != 0 ||
		rows[1].ID <= rows[0].ID || rows[2].ID <= rows[1].ID {
		t.Fatalf("claimed %+v", rows)
	}
	if id := e.publish(tbl, dialects.Message{Payload: []byte("text")}); id == 0 {
		t.Fatal("no id")
	}
}

// Claims at once, from two dialects (two processes) and several queues each, never take
// the same row, and stamp each row once.
func testClaimLeasesConcurrently(t *testing.T, h Harness) {
	e1 := setup(t, h)
	e2 := e1.other()
	tbl := e1.table("ra_conc", leaseTable)
	const n = 200
	e1.fill(tbl.Name, n, "g")
	var queues []dialects.LeaseQueue
	for _, e := range []*env{e1, e1, e2, e2} {
		queues = append(queues, e.openLease(dialects.QueueSpec{Table: tbl, Group: "g"}))
	}
	var (
		mu   sync.Mutex
		seen = map[int64]int{}
		wg   sync.WaitGroup
	)
	for _, q := range queues {
		for range 3 {
			wg.Go(func() {
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
			})
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
	if got := e1.count("SELECT COUNT(*) FROM " + e1.q(tbl.Name) + " WHERE attempt = 2 AND locked_until IS NOT NULL"); got != n {
		t.Fatalf("%d rows stamped once, want %d", got, n)
	}
}

func testExtendLeases(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_ext", leaseTable)
	for range 5 {
		e.publish(tbl, dialects.Message{Payload: []byte("p")})
	}
	q := e.openLease(dialects.QueueSpec{Table: tbl})
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
		s, _ := e.state(tbl, rows[i].ID)
		sameTime(t, "locked_until", s.LockedUntil, want)
	}
	// The old token is spent, whether asked for the same expiry or a later one.
	for _, to := range []time.Time{next, next.Add(time.Minute)} {
		if moved, _ := q.ExtendLeases(ctx, to, held[:1]); len(moved) != 0 {
			t.Errorf("a stale token extended %v", moved)
		}
	}
	// Every lease holding.
	all := []dialects.Lease{{ID: rows[0].ID, Token: next}, {ID: rows[1].ID, Token: next}, {ID: rows[2].ID, Token: next}}
	moved, err = q.ExtendLeases(ctx, next.Add(time.Minute), all)
	if err != nil || len(moved) != 3 {
		t.Fatalf("moved %v %v", moved, err)
	}
}

// More leases than one statement names (Caps.ListChunk) extend in one call: all of them,
// then all but one whose token is stale.
func testExtendManyLeases(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_many", leaseTable)
	n := e.manyLeases()
	e.fill(tbl.Name, n, "")
	q := e.openLease(dialects.QueueSpec{Table: tbl})
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
	next := until.Add(time.Minute)
	moved, err := q.ExtendLeases(ctx, next, held)
	if err != nil {
		t.Fatal(err)
	}
	if len(moved) != n {
		t.Fatalf("moved %d of %d", len(moved), n)
	}
	// One stale lease, in the last chunk.
	for i := range held {
		held[i].Token = next
	}
	held[n-1].Token = until
	moved, err = q.ExtendLeases(ctx, next.Add(time.Minute), held)
	if err != nil {
		t.Fatal(err)
	}
	if len(moved) != n-1 || slices.Contains(moved, held[n-1].ID) {
		t.Fatalf("moved %d of %d, stale one among them: %v", len(moved), n, slices.Contains(moved, held[n-1].ID))
	}
}

// claimOne publishes a row in group g and claims it.
func (e *env) claimOne(q dialects.LeaseQueue, tbl dialects.Table) dialects.Lease {
	e.t.Helper()
	return ClaimOne(e.t, e.d, q, tbl)
}

// Each step settles only while the row holds the token; a stale token (by a second or a
// microsecond) changes nothing, and a spent one settles nothing again.
func testSettleLease(t *testing.T, h Harness) {
	now := t0.Add(time.Second)
	at := now.Add(time.Hour)
	cases := append(settleLeaseFinishCases(now), settleLeaseReturnCases(now, at)...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { runSettleLeaseCase(t, h, c) })
	}
}

// settleLeaseCase is one step of testSettleLease, on a table of shape, and what the row
// must be after it.
type settleLeaseCase struct {
	name  string
	shape func(string) dialects.Table
	step  dialects.Step
	check func(t *testing.T, s RowState, exists bool)
}

// leaseTableWithProcessed is leaseTable with a processed_at column.
func leaseTableWithProcessed(name string) dialects.Table {
	tbl := leaseTable(name)
	tbl.ProcessedAt = "processed_at"
	return tbl
}

// settleLeaseFinishCases are the acks: the row is deleted, or marked processed.
func settleLeaseFinishCases(now time.Time) []settleLeaseCase {
	return []settleLeaseCase{
		{"ack deletes", leaseTable, dialects.Step{Kind: dialects.StepAck, Now: now}, func(t *testing.T, s RowState, exists bool) {
			if exists {
				t.Error("row still there")
			}
		}},
		{"ack marks processed", leaseTableWithProcessed, dialects.Step{Kind: dialects.StepAck, Now: now}, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.LockedUntil != nil || s.Attempt != 2 {
				t.Errorf("row %+v (exists %v)", s, exists)
			}
			sameTime(t, "processed_at", s.ProcessedAt, now)
		}},
		{"ack of a row never started gives back its attempt", leaseTableWithProcessed, dialects.Step{Kind: dialects.StepAck, Now: now, Unstarted: true}, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.LockedUntil != nil || s.Attempt != 1 {
				t.Errorf("row %+v (exists %v), want processed at attempt 1 (as before the claim)", s, exists)
			}
			sameTime(t, "processed_at", s.ProcessedAt, now)
		}},
	}
}

// settleLeaseReturnCases are the steps that return the row: unleased, delayed, or moved to
// the dead-letter group.
func settleLeaseReturnCases(now, at time.Time) []settleLeaseCase {
	return []settleLeaseCase{
		{"retry", leaseTableWithProcessed, dialects.Step{Kind: dialects.StepRetry, Now: now}, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.LockedUntil != nil || s.ProcessedAt != nil || s.Attempt != 2 {
				t.Errorf("row %+v (exists %v)", s, exists)
			}
		}},
		{"release", leaseTable, dialects.Step{Kind: dialects.StepRelease, Now: now}, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.LockedUntil != nil || s.Attempt != 2 {
				t.Errorf("row %+v (exists %v)", s, exists)
			}
		}},
		{"release of a row never started gives back its attempt", leaseTable, dialects.Step{Kind: dialects.StepRelease, Now: now, Unstarted: true}, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.LockedUntil != nil || s.Attempt != 1 {
				t.Errorf("row %+v (exists %v), want unleased at attempt 1 (as before the claim)", s, exists)
			}
		}},
		{"retry after", leaseTable, dialects.Step{Kind: dialects.StepRetryAfter, Now: now, At: at}, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.LockedUntil != nil || s.Attempt != 2 {
				t.Errorf("row %+v (exists %v)", s, exists)
			}
			sameTime(t, "retry_after", s.RetryAfter, at)
		}},
		{"dead-letter group", leaseTable, dialects.Step{Kind: dialects.StepDeadLetter, Now: now}, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.Group != "dead" || s.LockedUntil != nil {
				t.Errorf("row %+v (exists %v)", s, exists)
			}
		}},
	}
}

// runSettleLeaseCase settles c's step with stale tokens, which change nothing, with the
// held one, and with it again once spent.
func runSettleLeaseCase(t *testing.T, h Harness, c settleLeaseCase) {
	e := setup(t, h)
	tbl := e.table("ra_settle", c.shape)
	q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
	held := e.claimOne(q, tbl)
	before, _ := e.state(tbl, held.ID)

	for _, off := range []time.Duration{-time.Second, -time.Microsecond, time.Second} {
		stale := dialects.Lease{ID: held.ID, Token: held.Token.Add(off)}
		if ok, err := q.SettleLease(ctx, c.step, stale); ok || err != nil {
			t.Fatalf("a token %v off: %v %v", off, ok, err)
		}
		if after, ok := e.state(tbl, held.ID); !ok || !sameState(before, after) {
			t.Fatalf("a token %v off changed the row: %+v -> %+v", off, before, after)
		}
	}

	if ok, err := q.SettleLease(ctx, c.step, held); !ok || err != nil {
		t.Fatalf("settle: %v %v", ok, err)
	}
	s, exists := e.state(tbl, held.ID)
	c.check(t, s, exists)
	// The token is spent: settling again finds no lease.
	if ok, _ := q.SettleLease(ctx, c.step, held); ok {
		t.Error("a spent token settled again")
	}
}

// A step the subscription has no column or destination for is an error, and a delay on a
// table without retry_after is kept in the lease.
func testSettleLeaseWithoutColumns(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_nocol", func(name string) dialects.Table {
		tbl := leaseTable(name)
		tbl.RetryAfter = ""
		return tbl
	})
	q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g"})
	held := e.claimOne(q, tbl)
	if _, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, held); err == nil {
		t.Error("a dead letter without a destination settled")
	}
	if s, _ := e.state(tbl, held.ID); !isTime(s.LockedUntil, held.Token) || s.Attempt != 2 {
		t.Fatalf("a refused dead letter changed the row: %+v", s)
	}

	// The row stays leased until it is due, and the parked delivery's token is spent.
	at := t0.Add(time.Hour)
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepRetryAfter, At: at}, held); err != nil || !ok {
		t.Fatalf("retry after parked in the lease: %v %v", ok, err)
	}
	s, _ := e.state(tbl, held.ID)
	sameTime(t, "locked_until", s.LockedUntil, at)
	if rows, err := q.ClaimLeases(ctx, at.Add(-time.Second), at.Add(time.Minute), 1); err != nil || len(rows) != 0 {
		t.Fatalf("claimed before its due time: %v %v", ids(rows), err)
	}
	if ok, _ := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck}, held); ok {
		t.Error("the parked delivery's token settled again")
	}
	rows, err := q.ClaimLeases(ctx, at, at.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 || rows[0].Attempt != 2 {
		t.Fatalf("claim once due: %+v %v", rows, err)
	}

	// A snooze parks too, and gives back the attempt the claim counted.
	held = dialects.Lease{ID: rows[0].ID, Token: rows[0].Token}
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepSnooze, At: at.Add(time.Hour)}, held); err != nil || !ok {
		t.Fatalf("snooze parked in the lease: %v %v", ok, err)
	}
	s, _ = e.state(tbl, held.ID)
	sameTime(t, "snoozed locked_until", s.LockedUntil, at.Add(time.Hour))
	if s.Attempt != 2 {
		t.Errorf("snoozed attempt %d, want 2", s.Attempt)
	}

	// A due time equal to the token still settles (Caps.ParkNudge).
	held = e.claimOne(q, tbl)
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepRetryAfter, At: held.Token}, held); err != nil || !ok {
		t.Fatalf("retry after parked in the lease at the token's own time: %v %v", ok, err)
	}
	s, _ = e.state(tbl, held.ID)
	sameTime(t, "locked_until parked at the token", s.LockedUntil, stored(held.Token).Add(e.caps.ParkNudge))
}

// The dead-letter table move is fenced by the token: a stale one moves nothing, and the
// moved row arrives with its columns and without its lease.
func testSettleLeaseDeadLetterTable(t *testing.T, h Harness) {
	for _, grouped := range []bool{false, true} {
		t.Run(map[bool]string{false: "no group", true: "group"}[grouped], func(t *testing.T) {
			settleLeaseDeadLetterTable(t, h, grouped)
		})
	}
}

// settleLeaseDeadLetterTable is testSettleLeaseDeadLetterTable on a table with or
// without a group column.
func settleLeaseDeadLetterTable(t *testing.T, h Harness, grouped bool) {
	e := setup(t, h)
	shape := func(name string) dialects.Table {
		tbl := leaseTable(name)
		if !grouped {
			tbl.Group = ""
		}
		return tbl
	}
	tbl := e.table("ra_dlq", shape)
	dead := e.table("ra_dlq_dead", shape)
	spec := dialects.QueueSpec{Table: tbl, DeadLetterTable: dead.Name}
	if grouped {
		spec.Group = "g"
	}
	q := e.openLease(spec)
	id := e.publish(tbl, dialects.Message{Group: spec.Group, Payload: []byte("poison"), Headers: []byte(`{"a":"b"}`)})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 || rows[0].ID != id {
		t.Fatalf("claim %v %v", ids(rows), err)
	}
	held := dialects.Lease{ID: id, Token: rows[0].Token}
	step := dialects.Step{Kind: dialects.StepDeadLetter, Now: t0}

	// A wrong token moves nothing: the copy is not committed.
	if ok, err := q.SettleLease(ctx, step, dialects.Lease{ID: id, Token: held.Token.Add(time.Second)}); ok || err != nil {
		t.Fatalf("stale move: %v %v", ok, err)
	}
	if _, ok := e.state(tbl, id); !ok {
		t.Fatal("a stale move deleted the row")
	}
	if n := e.count("SELECT COUNT(*) FROM " + e.q(dead.Name)); n != 0 {
		t.Fatalf("a stale move copied %d rows", n)
	}

	if ok, err := q.SettleLease(ctx, step, held); !ok || err != nil {
		t.Fatalf("move: %v %v", ok, err)
	}
	checkMovedToDeadLetterTable(t, e, tbl, dead, id, spec.Group)
	if ok, err := q.SettleLease(ctx, step, held); ok || err != nil {
		t.Fatalf("a spent token moved again: %v %v", ok, err)
	}
	// The pool is usable afterwards: no transaction was left open on a connection.
	for range 3 {
		e.exec("INSERT INTO "+e.q(tbl.Name)+" (payload) VALUES (?)", []byte("q"))
	}
}

// checkMovedToDeadLetterTable checks that row id left tbl and is the one row of dead,
// in group, unleased, with its attempt, payload and headers.
func checkMovedToDeadLetterTable(t *testing.T, e *env, tbl, dead dialects.Table, id int64, group string) {
	t.Helper()
	if _, ok := e.state(tbl, id); ok {
		t.Fatal("the row stayed in the queue table")
	}
	s, ok := e.state(dead, id)
	if !ok || s.LockedUntil != nil || s.Attempt != 2 || s.Group != group {
		t.Fatalf("dead-letter row %+v (exists %v)", s, ok)
	}
	var payload, headers []byte
	if !e.h.QueryRow(t, e.d, "SELECT payload, headers FROM "+e.q(dead.Name)+" WHERE id = ?", []any{id}, &payload, &headers) {
		t.Fatal("no dead-letter row")
	}
	var hdr map[string]string
	if err := json.Unmarshal(headers, &hdr); err != nil || string(payload) != "poison" || hdr["a"] != "b" {
		t.Fatalf("payload %q headers %q not copied: %v", payload, headers, err)
	}
	if n := e.count("SELECT COUNT(*) FROM " + e.q(dead.Name)); n != 1 {
		t.Fatalf("the dead-letter table holds %d rows", n)
	}
}
