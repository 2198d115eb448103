package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

func claimLocked(t *testing.T, q dialects.RowLockQueue, now time.Time) (dialects.LockedClaim, bool) {
	t.Helper()
	c, ok, err := q.ClaimLocked(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	return c, ok
}

// acquired is how many of the pool's connections are in use.
func acquired(d *Dialect) int32 { return d.Pool().Stat().AcquiredConns() }

func TestRowLockClaimHoldsTheRow(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p"), Headers: []byte(`{"a":"b"}`)})
	dialecttest.Publish(t, d, tbl, dialects.Message{Group: "other", Payload: []byte("x")})
	dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("later"), NotBefore: t0.Add(time.Hour)})
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})

	c, ok := claimLocked(t, q, t0)
	if !ok {
		t.Fatal("nothing claimed")
	}
	r := c.Row()
	if r.ID != id || string(r.Payload) != "p" || r.Attempt != 1 || len(r.Headers) == 0 {
		t.Fatalf("claimed %+v", r)
	}
	if n := acquired(d); n != 1 {
		t.Fatalf("%d connections held by one claim", n)
	}
	// Another claim (another goroutine, another connection) skips the locked row and
	// finds nothing else due in the group.
	done := make(chan bool)
	go func() {
		c2, ok, err := q.ClaimLocked(ctx, t0)
		if err != nil {
			t.Error(err)
		}
		if ok {
			c2.Rollback(ctx)
		}
		done <- ok
	}()
	select {
	case ok := <-done:
		if ok {
			t.Fatal("a second claim took the locked row")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a second claim waited on the locked row")
	}
	if n := acquired(d); n != 1 {
		t.Fatalf("an empty claim kept its connection: %d held", n)
	}
	// The claim wrote nothing: the row is as it was.
	if s, _ := stateOf(t, d, tbl, id); s.Attempt != 1 {
		t.Fatalf("the claim changed the row: %+v", s)
	}
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}); err != nil {
		t.Fatal(err)
	}
	if _, exists := stateOf(t, d, tbl, id); exists {
		t.Fatal("ack kept the row")
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held after the settlement", n)
	}
	// Settled: the claim has ended.
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}); err == nil {
		t.Error("a second settlement succeeded")
	}
	if err := c.Rollback(ctx); err != nil {
		t.Errorf("a rollback after the settlement: %v", err)
	}
}

func TestRowLockRetryCountsTheAttempt(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl})
	for want := 1; want <= 3; want++ {
		c, ok := claimLocked(t, q, t0)
		if !ok || c.Row().ID != id || c.Row().Attempt != want {
			t.Fatalf("claim %d: %v %+v", want, ok, c)
		}
		if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetry, Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	if s, _ := stateOf(t, d, tbl, id); s.Attempt != 4 {
		t.Fatalf("attempt %d after three retries", s.Attempt)
	}

	// RetryAfter delays the row and counts the attempt too.
	c, _ := claimLocked(t, q, t0)
	at := t0.Add(time.Hour)
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetryAfter, Now: t0, At: at}); err != nil {
		t.Fatal(err)
	}
	if s, _ := stateOf(t, d, tbl, id); s.Attempt != 5 || !sameTime(s.RetryAfter, at) {
		t.Fatalf("row after retry after: %+v", s)
	}
	if _, ok := claimLocked(t, q, t0); ok {
		t.Fatal("a delayed row was claimed before it was due")
	}
	c, ok := claimLocked(t, q, at)
	if !ok {
		t.Fatal("a due row was not claimed")
	}
	c.Rollback(ctx)
}

// Without an attempt column a retry has nothing to write: it rolls back.
func TestRowLockRetryWithoutAttempt(t *testing.T) {
	d := newDialect(t)
	tbl := dialects.Table{Name: tableName(t, d), ID: "id", Payload: "payload"}
	createTable(t, d, tbl)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl})
	c, ok := claimLocked(t, q, t0)
	if !ok || c.Row().Attempt != 0 {
		t.Fatalf("claim %v %+v", ok, c.Row())
	}
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetry}); err != nil {
		t.Fatal(err)
	}
	if c, ok := claimLocked(t, q, t0); !ok || c.Row().ID != id {
		t.Fatal("the retried row did not return")
	} else {
		// The table cannot delay a row.
		if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetryAfter, At: t0}); err == nil {
			t.Fatal("retry after without a retry_after column succeeded")
		}
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held", n)
	}
}

func TestRowLockRollbackReturnsTheRow(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d))
	tbl.ProcessedAt = "processed_at"
	createTable(t, d, tbl)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl, Group: ""})
	c, _ := claimLocked(t, q, t0)
	if err := c.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Rollback(ctx); err != nil {
		t.Fatalf("a second rollback: %v", err)
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held after the rollback", n)
	}
	c, ok := claimLocked(t, q, t0)
	if !ok || c.Row().ID != id || c.Row().Attempt != 1 {
		t.Fatal("the rolled back row did not return as it was")
	}
	// A rollback with an ended context still ends the transaction.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.Rollback(cctx); err != nil {
		t.Fatal(err)
	}
	c, ok = claimLocked(t, q, t0)
	if !ok {
		t.Fatal("the row did not return")
	}
	// Release is a rollback; ack with processed_at marks the row.
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRelease}); err != nil {
		t.Fatal(err)
	}
	c, _ = claimLocked(t, q, t0)
	now := t0.Add(time.Second)
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: now}); err != nil {
		t.Fatal(err)
	}
	if s, _ := stateOf(t, d, tbl, id); !sameTime(s.ProcessedAt, now) || s.Attempt != 1 {
		t.Fatalf("row after ack %+v", s)
	}
	if _, ok := claimLocked(t, q, t0); ok {
		t.Fatal("a processed row was claimed")
	}
}

// A failed statement rolls back: the row returns as it was, and the connection is free.
func TestRowLockFailedSettlementRollsBack(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	mustExec(t, d, "ALTER TABLE "+quote(tbl.Name)+" ADD CONSTRAINT not_dead CHECK (grp <> 'dead')")
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
	c, _ := claimLocked(t, q, t0)
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}); err == nil {
		t.Fatal("a settlement breaking a constraint succeeded")
	} else {
		dialecttest.Contains(t, err.Error(), "postgres: dead_letter on table "+tbl.Name)
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held", n)
	}
	if s, _ := stateOf(t, d, tbl, id); s.Group != "g" {
		t.Fatalf("row %+v", s)
	}
	c, ok := claimLocked(t, q, t0)
	if !ok {
		t.Fatal("the row did not return")
	}
	c.Rollback(ctx)
}

func TestRowLockDeadLetter(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})
	c, _ := claimLocked(t, q, t0)
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}); err != nil {
		t.Fatal(err)
	}
	if s, _ := stateOf(t, d, tbl, id); s.Group != "dead" || s.Attempt != 1 {
		t.Fatalf("row %+v", s)
	}

	// Into a table, in one statement.
	noGroup := rowLockTable(tableName(t, d))
	noGroup.Group = ""
	createTable(t, d, noGroup)
	dead := noGroup
	dead.Name = tableName(t, d)
	createTable(t, d, dead)
	id = dialecttest.Publish(t, d, noGroup, dialects.Message{Payload: []byte("poison")})
	q = dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: noGroup, DeadLetterTable: dead.Name})
	c, _ = claimLocked(t, q, t0)
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}); err != nil {
		t.Fatal(err)
	}
	if _, exists := stateOf(t, d, noGroup, id); exists {
		t.Fatal("the row stayed in the queue table")
	}
	if n := count(t, d, "SELECT count(*) FROM "+quote(dead.Name)+" WHERE id = $1 AND payload = 'poison'", id); n != 1 {
		t.Fatalf("the dead-letter table holds %d copies", n)
	}
}

func TestRowLockIsolation(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	for level, want := range map[dialects.Isolation]string{
		"":                      "read committed", // the server's default
		dialects.ReadCommitted:  "read committed",
		dialects.RepeatableRead: "repeatable read",
		dialects.Serializable:   "serializable",
	} {
		tbl.Isolation = level
		q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl})
		c, ok := claimLocked(t, q, t0)
		if !ok {
			t.Fatalf("%q: nothing claimed", level)
		}
		var got string
		lc := c.(*lockedClaim)
		if err := lc.conn.QueryRow(ctx, "SHOW transaction_isolation").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("declared %q: the claim runs at %q", level, got)
		}
		if err := c.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A claim whose rollback fails closes its connection: the server rolls back.
func TestRowLockRollbackFailureClosesTheConnection(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl})
	c, _ := claimLocked(t, q, t0)
	lc := c.(*lockedClaim)
	var pid int
	if err := lc.conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	mustExec(t, d, "SELECT pg_terminate_backend($1)", pid)
	if err := c.Rollback(ctx); err == nil {
		t.Fatal("a rollback on a dead connection reported success")
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held", n)
	}
	waitGone(t, d, pid) // pg_terminate_backend only signals the backend
	if c, ok := claimLocked(t, q, t0); !ok || c.Row().ID != id {
		t.Fatal("the row did not return")
	} else {
		c.Rollback(ctx)
	}
}

// waitGone waits until a backend has exited (and so rolled back).
func waitGone(t *testing.T, d *Dialect, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for count(t, d, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("backend %d did not exit", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
