package dialecttest

import (
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// poisonScenarios are poison rows: an attempt counter at its column type's maximum must
// neither overflow nor fail the statement that counts it (which, in a claim, would stop
// the whole queue); rows set aside are passed over.
var poisonScenarios = []scenario{
	{name: "PoisonLeaseClaimSaturates", run: testPoisonLeaseClaimSaturates},
	{name: "PoisonFIFOLeaseClaimSaturates", run: testPoisonFIFOLeaseClaimSaturates},
	{name: "PoisonAdvisoryTakeSaturates", run: testPoisonAdvisoryTakeSaturates},
	{name: "PoisonRowLockRetrySaturates", run: testPoisonRowLockRetrySaturates, applies: rowLock},
	{name: "PoisonRowLockBatchRetrySaturates", run: testPoisonRowLockBatchRetrySaturates, applies: rowLock},
	{name: "PoisonRowLockSkip", run: testPoisonRowLockSkip, applies: rowLock},
}

func rowLock(h Harness) bool { return h.Caps().RowLock }

// attemptTyped creates tbl with its attempt column of type at.
func (e *env) attemptTyped(tbl dialects.Table, at AttemptType) dialects.Table {
	e.t.Helper()
	e.create(tbl)
	if at.Type != "" {
		e.h.SetAttemptType(e.t, e.d, tbl, at.Type)
	}
	return tbl
}

func (e *env) setAttempt(tbl dialects.Table, id, attempt int64) {
	e.t.Helper()
	e.exec("UPDATE "+e.q(tbl.Name)+" SET "+e.q(tbl.Attempt)+" = ? WHERE "+e.q(tbl.ID)+" = ?", attempt, id)
}

func (e *env) attemptOf(tbl dialects.Table, id int64) int64 {
	e.t.Helper()
	var n int64
	if !e.h.QueryRow(e.t, e.d, "SELECT "+e.q(tbl.Attempt)+" FROM "+e.q(tbl.Name)+" WHERE "+e.q(tbl.ID)+" = ?", []any{id}, &n) {
		e.t.Fatalf("no row %d", id)
	}
	return n
}

func (e *env) narrow() AttemptType { return e.caps.AttemptTypes[0] }

// The lease claim counts every row it takes in one statement: a row at the maximum stays
// there, and the rows beside it are claimed and counted.
func testPoisonLeaseClaimSaturates(t *testing.T, h Harness) {
	for _, at := range h.Caps().AttemptTypes {
		t.Run(at.Name, func(t *testing.T) {
			e := setup(t, h)
			tbl := e.attemptTyped(leaseTable(e.name("rapoison")), at)
			full := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("full")})
			near := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("near")})
			fresh := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("fresh")})
			e.setAttempt(tbl, full, at.Max)
			e.setAttempt(tbl, near, at.Max-1)
			q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g"})
			rows, err := q.ClaimLeases(ctx, t0, t0.Add(30*time.Second), 10)
			if err != nil {
				t.Fatalf("claim: %v", err)
			}
			if len(rows) != 3 {
				t.Fatalf("claimed %v, want 3 rows", ids(rows))
			}
			for id, want := range map[int64]int64{full: at.Max, near: at.Max, fresh: 2} {
				if got := e.attemptOf(tbl, id); got != want {
					t.Errorf("row %d: attempt %d, want %d", id, got, want)
				}
			}
		})
	}
}

func testPoisonFIFOLeaseClaimSaturates(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := leaseTable(e.name("rapoison"))
	tbl.FIFO = true
	at := e.narrow()
	e.attemptTyped(tbl, at)
	id := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("head")})
	e.setAttempt(tbl, id, at.Max)
	q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g"})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(30*time.Second), 10)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if got := e.attemptOf(tbl, id); len(rows) != 1 || got != at.Max {
		t.Fatalf("claimed %v; attempt %d, want %d", ids(rows), got, at.Max)
	}
}

func testPoisonAdvisoryTakeSaturates(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := dialects.Table{Name: e.name("rapoison"), ID: "id", Payload: "payload", Attempt: "attempt", RetryAfter: "retry_after"}
	tbl.AdvisoryKey = tbl.Name + "-{id}"
	at := e.narrow()
	e.attemptTyped(tbl, at)
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	e.setAttempt(tbl, id, at.Max)
	q := e.openAdvisory(dialects.QueueSpec{Table: tbl})
	s := e.session(q)
	if !tryLock(t, s, fmt.Sprintf("%s-%d", tbl.Name, id)) {
		t.Fatal("key not locked")
	}
	if _, ok, err := s.Take(ctx, id, t0); err != nil || !ok {
		t.Fatalf("take: %v, %v", ok, err)
	}
	if got := e.attemptOf(tbl, id); got != at.Max {
		t.Fatalf("attempt %d, want %d", got, at.Max)
	}
}

// claimLocked claims one row of q as of now.
func claimLocked(t *testing.T, q dialects.RowLockQueue, now time.Time) dialects.LockedClaim {
	t.Helper()
	c, ok, err := q.ClaimLocked(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatal("no row claimed")
	}
	return c
}

// The row lock form counts the attempt when a retry returns the row: Retry and RetryAfter
// settle a row at the maximum (alone, in a FIFO group) and leave it there.
func testPoisonRowLockRetrySaturates(t *testing.T, h Harness) {
	for _, fifo := range []bool{false, true} {
		t.Run(fmt.Sprintf("fifo=%v", fifo), func(t *testing.T) {
			e := setup(t, h)
			tbl := rowLockTable(e.name("rapoison"))
			tbl.FIFO = fifo
			at := e.narrow()
			e.attemptTyped(tbl, at)
			id := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("p")})
			e.setAttempt(tbl, id, at.Max)
			q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl, Group: "g"})
			for _, step := range []dialects.Step{{Kind: dialects.StepRetry, Now: t0}, {Kind: dialects.StepRetryAfter, Now: t0, At: t0}} {
				c := claimLocked(t, q, t0)
				if err := c.Settle(ctx, step); err != nil {
					t.Fatalf("%v: %v", step.Kind, err)
				}
				if got := e.attemptOf(tbl, id); got != at.Max {
					t.Fatalf("after %v: attempt %d, want %d", step.Kind, got, at.Max)
				}
			}
		})
	}
}

// In a batch too: the row at the maximum stays, the one beside it is counted.
func testPoisonRowLockBatchRetrySaturates(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := rowLockTable(e.name("rapoison"))
	at := e.narrow()
	e.attemptTyped(tbl, at)
	full := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("full")})
	fresh := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("fresh")})
	e.setAttempt(tbl, full, at.Max)
	q := e.open(dialects.QueueSpec{Table: tbl, Group: "g"}).(dialects.RowLockBatchQueue)
	b, ok, err := q.ClaimLockedBatch(ctx, t0, 10)
	if err != nil || !ok || len(b.Rows()) != 2 {
		t.Fatalf("claim batch: %v, %v", ok, err)
	}
	if err := b.Settle(ctx, []dialects.Step{{Kind: dialects.StepRetry, Now: t0}, {Kind: dialects.StepRetry, Now: t0}}); err != nil {
		t.Fatalf("settle: %v", err)
	}
	if a, b := e.attemptOf(tbl, full), e.attemptOf(tbl, fresh); a != at.Max || b != 2 {
		t.Fatalf("attempts %d, %d; want %d, 2", a, b, at.Max)
	}
}

// A row lock queue's claims pass over the rows set aside in memory: single claims, batch
// claims, and a FIFO group's head (which then holds its group).
func testPoisonRowLockSkip(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("rapoison", rowLockTable)
	bad := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("bad")})
	good := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("good")})
	q := e.open(dialects.QueueSpec{Table: tbl, Group: "g"})
	q.(dialects.SkipQueue).Skip(bad)
	c := claimLocked(t, q.(dialects.RowLockQueue), t0)
	if c.Row().ID != good {
		t.Fatalf("claimed row %d, want %d", c.Row().ID, good)
	}
	c.Rollback(ctx)
	b, ok, err := q.(dialects.RowLockBatchQueue).ClaimLockedBatch(ctx, t0, 10)
	if err != nil || !ok || len(b.Rows()) != 1 || b.Rows()[0].ID != good {
		t.Fatalf("batch %v, %v", ok, err)
	}
	b.Rollback(ctx)

	ft := e.table("rapoison", func(name string) dialects.Table {
		tb := rowLockTable(name)
		tb.FIFO = true
		return tb
	})
	head := e.publish(ft, dialects.Message{Group: "g", Payload: []byte("head")})
	e.publish(ft, dialects.Message{Group: "g", Payload: []byte("next")})
	fq := e.open(dialects.QueueSpec{Table: ft, Group: "g"})
	fq.(dialects.SkipQueue).Skip(head)
	if c, ok, err := fq.(dialects.RowLockQueue).ClaimLocked(ctx, t0); err != nil || ok {
		if ok {
			c.Rollback(ctx)
		}
		t.Fatalf("a FIFO claim past the head set aside: %v, %v", ok, err)
	}
}
