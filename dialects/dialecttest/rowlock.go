package dialecttest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// rowLockScenarios are the row lock form's settlements (RowLockQueue, LockedClaim), where
// the database serves the form.
var rowLockScenarios = []scenario{
	{name: "RowLockClaimHoldsTheRow", run: testRowLockClaimHoldsTheRow, applies: rowLock},
	{name: "RowLockSettle", run: testRowLockSettle, applies: rowLock},
	{name: "RowLockRetryCountsTheAttempt", run: testRowLockRetryCountsTheAttempt, applies: rowLock},
	{name: "RowLockRetryWithoutAttempt", run: testRowLockRetryWithoutAttempt, applies: rowLock},
	{name: "RowLockRollbackReturnsTheRow", run: testRowLockRollbackReturnsTheRow, applies: rowLock},
	{name: "RowLockFailedSettlementRollsBack", run: testRowLockFailedSettlementRollsBack, applies: rowLock},
	{name: "RowLockDeadLetter", run: testRowLockDeadLetter, applies: rowLock},
}

// noConns fails unless no connection of d's pool is in use.
func (e *env) noConns(when string) {
	e.t.Helper()
	if n := e.h.ConnsInUse(e.t, e.d); n != 0 {
		e.t.Fatalf("%d connections held %s", n, when)
	}
}

// Each step's statement runs in the claim transaction and ends it: the row is then
// claimable again or not, and the claim settles nothing twice.
func testRowLockSettle(t *testing.T, h Harness) {
	at := t0.Add(time.Hour)
	withProcessed := func(name string) dialects.Table {
		tbl := rowLockTable(name)
		tbl.ProcessedAt = "processed_at"
		return tbl
	}
	noAttempt := func(name string) dialects.Table {
		tbl := rowLockTable(name)
		tbl.Attempt = ""
		return tbl
	}
	cases := []struct {
		name  string
		shape func(string) dialects.Table
		step  dialects.Step
		// claimable says whether the row is claimable again right after.
		claimable bool
		check     func(t *testing.T, s RowState, exists bool)
	}{
		{"ack deletes", rowLockTable, dialects.Step{Kind: dialects.StepAck, Now: t0}, false, func(t *testing.T, s RowState, exists bool) {
			if exists {
				t.Error("row still there")
			}
		}},
		{"ack marks processed", withProcessed, dialects.Step{Kind: dialects.StepAck, Now: t0}, false, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.Attempt != 1 {
				t.Errorf("row %+v", s)
			}
			sameTime(t, "processed_at", s.ProcessedAt, t0)
		}},
		{"retry counts the attempt", rowLockTable, dialects.Step{Kind: dialects.StepRetry}, true, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.Attempt != 2 {
				t.Errorf("row %+v", s)
			}
		}},
		{"retry without an attempt column rolls back", noAttempt, dialects.Step{Kind: dialects.StepRetry}, true, func(t *testing.T, s RowState, exists bool) {
			if !exists {
				t.Error("row gone")
			}
		}},
		{"retry after counts and delays", rowLockTable, dialects.Step{Kind: dialects.StepRetryAfter, At: at}, false, func(t *testing.T, s RowState, exists bool) {
			if s.Attempt != 2 {
				t.Errorf("row %+v", s)
			}
			sameTime(t, "retry_after", s.RetryAfter, at)
		}},
		{"dead-letter group", rowLockTable, dialects.Step{Kind: dialects.StepDeadLetter}, false, func(t *testing.T, s RowState, exists bool) {
			if s.Group != "dead" || s.Attempt != 1 {
				t.Errorf("row %+v", s)
			}
		}},
		{"release rolls back", rowLockTable, dialects.Step{Kind: dialects.StepRelease}, true, func(t *testing.T, s RowState, exists bool) {
			if !exists || s.Attempt != 1 {
				t.Errorf("row %+v", s)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := setup(t, h)
			tbl := e.table("ra_rls", c.shape)
			q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
			id := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("p")})
			claim := claimLocked(t, q, t0)
			if err := claim.Settle(ctx, c.step); err != nil {
				t.Fatal(err)
			}
			e.noConns("after the settlement")
			s, exists := e.state(tbl, id)
			c.check(t, s, exists)
			next, ok, err := q.ClaimLocked(ctx, t0)
			if err != nil {
				t.Fatal(err)
			}
			if ok != c.claimable {
				t.Errorf("claimable after %s: %v", c.step.Kind, ok)
			}
			if ok {
				next.Rollback(ctx)
			}
			if err := claim.Settle(ctx, c.step); err == nil {
				t.Error("settled twice")
			}
		})
	}
}

// A retry counts the attempt (each claim reads it as it stands); a retry after counts too
// and delays the row to its time.
func testRowLockRetryCountsTheAttempt(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_rlr", rowLockTable)
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl})
	for want := 1; want <= 3; want++ {
		c := claimLocked(t, q, t0)
		if c.Row().ID != id || c.Row().Attempt != want {
			t.Fatalf("claim %d: %+v", want, c.Row())
		}
		if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetry, Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	if s, _ := e.state(tbl, id); s.Attempt != 4 {
		t.Fatalf("attempt %d after three retries", s.Attempt)
	}
	c := claimLocked(t, q, t0)
	at := t0.Add(time.Hour)
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetryAfter, Now: t0, At: at}); err != nil {
		t.Fatal(err)
	}
	s, _ := e.state(tbl, id)
	if s.Attempt != 5 {
		t.Fatalf("row after retry after: %+v", s)
	}
	sameTime(t, "retry_after", s.RetryAfter, at)
	if c, ok, err := q.ClaimLocked(ctx, t0); err != nil || ok {
		if ok {
			c.Rollback(ctx)
		}
		t.Fatalf("a delayed row was claimed before it was due: %v %v", ok, err)
	}
	claimLocked(t, q, at).Rollback(ctx)
}

// Without an attempt column a retry has nothing to write: it rolls back; the table cannot
// delay a row.
func testRowLockRetryWithoutAttempt(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := dialects.Table{Name: e.name("ra_rlna"), ID: "id", Payload: "payload"}
	e.create(tbl)
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl})
	c := claimLocked(t, q, t0)
	if c.Row().Attempt != 0 {
		t.Fatalf("claimed %+v", c.Row())
	}
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetry}); err != nil {
		t.Fatal(err)
	}
	c = claimLocked(t, q, t0)
	if c.Row().ID != id {
		t.Fatal("the retried row did not return")
	}
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetryAfter, At: t0}); err == nil {
		t.Fatal("retry after without a retry_after column succeeded")
	}
	e.noConns("after the settlements")
}

// Rollback (twice, or with an ended context) returns the row as it was at once; release is
// a rollback; an ack with processed_at marks the row, which no claim takes again.
func testRowLockRollbackReturnsTheRow(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_rlrb", func(name string) dialects.Table {
		tbl := rowLockTable(name)
		tbl.ProcessedAt = "processed_at"
		return tbl
	})
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl})
	c := claimLocked(t, q, t0)
	if err := c.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Rollback(ctx); err != nil {
		t.Fatalf("a second rollback: %v", err)
	}
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepAck}); err == nil {
		t.Error("a rolled back claim settled")
	}
	e.noConns("after the rollback")
	c = claimLocked(t, q, t0)
	if c.Row().ID != id || c.Row().Attempt != 1 {
		t.Fatalf("the rolled back row did not return as it was: %+v", c.Row())
	}
	// A rollback with an ended context still ends the transaction.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.Rollback(cctx); err != nil {
		t.Fatal(err)
	}
	c = claimLocked(t, q, t0)
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRelease}); err != nil {
		t.Fatal(err)
	}
	c = claimLocked(t, q, t0)
	now := t0.Add(time.Second)
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: now}); err != nil {
		t.Fatal(err)
	}
	s, _ := e.state(tbl, id)
	sameTime(t, "processed_at", s.ProcessedAt, now)
	if s.Attempt != 1 {
		t.Fatalf("row after ack %+v", s)
	}
	if c, ok, err := q.ClaimLocked(ctx, t0); err != nil || ok {
		if ok {
			c.Rollback(ctx)
		}
		t.Fatalf("a processed row was claimed: %v %v", ok, err)
	}
}

// A failed statement rolls back: the error names the step and the table, the row returns
// as it was, and the connection is free.
func testRowLockFailedSettlementRollsBack(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_rlf", rowLockTable)
	e.exec("ALTER TABLE " + e.q(tbl.Name) + " ADD CONSTRAINT " + e.q(tbl.Name+"_not_dead") + " CHECK (grp <> 'dead')")
	id := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
	c := claimLocked(t, q, t0)
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}); err == nil {
		t.Fatal("a settlement breaking a constraint succeeded")
	} else {
		contains(t, err.Error(), e.d.Name()+": dead_letter on table "+tbl.Name)
	}
	e.noConns("after the failed settlement")
	if s, _ := e.state(tbl, id); s.Group != "g" || s.Attempt != 1 {
		t.Fatalf("row %+v", s)
	}
	claimLocked(t, q, t0).Rollback(ctx)
}

// A dead letter moves the row to the dead-letter group, or into the dead-letter table in
// one transaction: a copy that fails (the id is taken there) rolls the delete back.
func testRowLockDeadLetter(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_rldg", rowLockTable)
	id := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
	if err := claimLocked(t, q, t0).Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}); err != nil {
		t.Fatal(err)
	}
	if s, _ := e.state(tbl, id); s.Group != "dead" || s.Attempt != 1 {
		t.Fatalf("row %+v", s)
	}

	noGroup := func(name string) dialects.Table {
		tbl := rowLockTable(name)
		tbl.Group = ""
		return tbl
	}
	tbl = e.table("ra_rld", noGroup)
	dead := e.table("ra_rld_dead", noGroup)
	q = OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl, DeadLetterTable: dead.Name})
	id = e.publish(tbl, dialects.Message{Payload: []byte("poison")})
	if err := claimLocked(t, q, t0).Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.state(tbl, id); ok {
		t.Fatal("row still in the queue")
	}
	if s, ok := e.state(dead, id); !ok || s.Attempt != 1 {
		t.Fatalf("dead-letter row %+v %v", s, ok)
	}
	var payload []byte
	if !h.QueryRow(t, e.d, "SELECT payload FROM "+e.q(dead.Name)+" WHERE id = ?", []any{id}, &payload) || string(payload) != "poison" {
		t.Fatalf("dead-letter payload %q", payload)
	}

	// A copy that fails (the id is taken in the dead-letter table) rolls the delete back.
	id = e.publish(tbl, dialects.Message{Payload: []byte("again")})
	e.exec("INSERT INTO "+e.q(dead.Name)+" (id, payload) VALUES (?, ?)", id, []byte("squatter"))
	claim := claimLocked(t, q, t0)
	if err := claim.Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}); err == nil {
		t.Fatal("a failed copy settled")
	}
	if _, ok := e.state(tbl, id); !ok {
		t.Fatal("the row left the queue although its copy failed")
	}
	c := claimLocked(t, q, t0)
	if c.Row().ID != id {
		t.Fatalf("claimed %d", c.Row().ID)
	}
	c.Rollback(ctx)
}

// The claim holds its row, on one connection, and writes nothing: another claim skips it
// (without waiting) and finds nothing else due in the group; inserts are not blocked, and
// a new row of the group is claimable beside the held one. Rolled back, the row returns at
// once as it was; an ack deletes it and frees the connection, and the claim is then over.
func testRowLockClaimHoldsTheRow(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_rl", rowLockTable)
	id := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("a"), Headers: []byte(`{"k":1}`)})
	e.publish(tbl, dialects.Message{Group: "other", Payload: []byte("x")})
	e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("later"), NotBefore: t0.Add(time.Minute)})
	q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl, Group: "g"})

	c := claimLocked(t, q, t0)
	r := c.Row()
	var hdr map[string]int
	if r.ID != id || string(r.Payload) != "a" || r.Attempt != 1 || json.Unmarshal(r.Headers, &hdr) != nil || hdr["k"] != 1 {
		t.Fatalf("claimed %+v", r)
	}
	if n := e.h.ConnsInUse(t, e.d); n != 1 {
		t.Fatalf("%d connections held by one claim", n)
	}
	// The row is held: another claim skips it and finds nothing else due.
	if other, ok := claimElsewhere(t, q); ok {
		other.Rollback(ctx)
		t.Fatalf("a second claim took row %d while the first held it", other.Row().ID)
	}
	if n := e.h.ConnsInUse(t, e.d); n != 1 {
		t.Fatalf("an empty claim kept its connection: %d held", n)
	}
	// The claim wrote nothing.
	if s, _ := e.state(tbl, id); s.Attempt != 1 {
		t.Fatalf("the claim changed the row: %+v", s)
	}
	// Inserts are not blocked while the claim is open, whatever group or id they land on.
	ins, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p, err := e.d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"g", "other", ""} {
		if _, err := p.Publish(ins, nil, dialects.Message{Group: g, Payload: []byte("new")}); err != nil {
			t.Fatalf("an insert into group %q waited on the claim: %v", g, err)
		}
	}
	// The new row of the group is claimable beside the held one.
	other, ok := claimElsewhere(t, q)
	if !ok || other.Row().ID == id {
		t.Fatalf("claim beside the held row: %v", ok)
	}
	if err := other.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Rolled back, the row returns at once with its attempt unchanged.
	if err := c.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	again := claimLocked(t, q, t0)
	if again.Row().ID != id || again.Row().Attempt != 1 {
		t.Fatalf("after rollback claimed %+v", again.Row())
	}
	// Acked: the row is gone, the connection free, and the claim over.
	if err := again.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}); err != nil {
		t.Fatal(err)
	}
	if _, exists := e.state(tbl, id); exists {
		t.Fatal("ack kept the row")
	}
	e.noConns("after the settlement")
	if err := again.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}); err == nil {
		t.Error("a second settlement succeeded")
	}
	if err := again.Rollback(ctx); err != nil {
		t.Errorf("a rollback after the settlement: %v", err)
	}
}
