package dialecttest

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// jobControlScenarios are RetryNow's and Cancel's (dialects.JobController).
var jobControlScenarios = []scenario{
	{name: "Lease", run: testJobControlLease},
	{name: "RowLock", run: testJobControlRowLock, applies: func(h Harness) bool { return h.Caps().RowLock }},
	{name: "Advisory", run: testJobControlAdvisory},
	{name: "CancelFencesLateDelivery", run: testCancelFencesLateDelivery},
	{name: "Refusals", run: testJobControlRefusals},
}

func controller(t *testing.T, d dialects.Dialect) dialects.JobController {
	t.Helper()
	c, ok := d.(dialects.JobController)
	if !ok {
		t.Fatalf("%T is not a dialects.JobController", d)
	}
	return c
}

// A delayed row is made due and keeps its attempt; a due row stays due; a row whose lease
// runs, a finished row and a missing one are refused and left as they were; Cancel ends a
// queued row as Drop does, and a row whose lease ran out is queued again.
func testJobControlLease(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_jc", func(name string) dialects.Table {
		tb := leaseTable(name)
		tb.ProcessedAt, tb.Error = "processed_at", "error"
		return tb
	})
	inWork := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("in work")})
	delayed := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("delayed"), NotBefore: t0.Add(time.Hour)})
	due := e.publish(tbl, dialects.Message{Group: "other", Payload: []byte("due")})
	done := e.publish(tbl, dialects.Message{Group: "other", Payload: []byte("done")})
	e.exec("UPDATE "+e.q(tbl.Name)+" SET processed_at = ? WHERE id = ?", h.TimeArg(t0.Add(-time.Minute)), done)
	q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g"})
	token := t0.Add(30 * time.Second)
	if rows, err := q.ClaimLeases(ctx, t0, token, 1); err != nil || len(rows) != 1 || rows[0].ID != inWork {
		t.Fatalf("claim: %v %v", ids(rows), err)
	}
	jc, in := controller(t, e.d), inspector(t, e.d)
	state := func(id int64) dialects.Job {
		t.Helper()
		j, err := in.Inspect(ctx, tbl, id, t0)
		if err != nil {
			t.Fatalf("Inspect(%d): %v", id, err)
		}
		return j
	}

	if err := jc.RetryNow(ctx, tbl, delayed, t0); err != nil {
		t.Fatalf("RetryNow of a delayed row: %v", err)
	}
	if j := state(delayed); j.State != dialects.JobDue || !j.RetryAfter.IsZero() || j.Attempt != 0 {
		t.Errorf("the delayed row after RetryNow: %+v", j)
	}
	if err := jc.RetryNow(ctx, tbl, due, t0); err != nil {
		t.Errorf("RetryNow of a row due already: %v", err)
	}
	before := state(inWork)
	for _, err := range []error{jc.RetryNow(ctx, tbl, inWork, t0), jc.Cancel(ctx, tbl, inWork, t0, "cancelled")} {
		if !errors.Is(err, dialects.ErrRowInWork) {
			t.Errorf("RetryNow or Cancel of a row in work: %v, want ErrRowInWork", err)
		}
	}
	if j := state(inWork); j.State != dialects.JobInWork || !j.LockedUntil.Equal(before.LockedUntil) || j.Error != "" {
		t.Errorf("the row in work changed: %+v -> %+v", before, j)
	}
	for _, err := range []error{jc.RetryNow(ctx, tbl, done, t0), jc.Cancel(ctx, tbl, done, t0, "x")} {
		if !errors.Is(err, dialects.ErrRowFinished) {
			t.Errorf("RetryNow or Cancel of a finished row: %v, want ErrRowFinished", err)
		}
	}
	if err := jc.Cancel(ctx, tbl, 99999, t0, "x"); !errors.Is(err, dialects.ErrRowNotFound) {
		t.Errorf("Cancel of a missing row: %v, want ErrRowNotFound", err)
	}

	if err := jc.Cancel(ctx, tbl, due, t0, "cancelled by the operator"); err != nil {
		t.Fatalf("Cancel of a due row: %v", err)
	}
	j := state(due)
	// The reason is written after CancelledPrefix, and the kept row reads as cancelled.
	if j.State != dialects.JobCancelled || j.State.String() != "cancelled" || j.Error != dialects.CancelledPrefix+"cancelled by the operator" {
		t.Errorf("the cancelled row: %+v", j)
	}
	sameTime(t, "the cancelled row's processed_at", &j.ProcessedAt, t0)
	// Once the lease ran out, the row is queued again and can be cancelled.
	if err := jc.Cancel(ctx, tbl, inWork, token.Add(time.Second), "late"); err != nil {
		t.Errorf("Cancel of a row whose lease ran out: %v", err)
	}

	// A table without processed_at: Cancel deletes.
	bare := e.table("ra_jcb", leaseTable)
	id := e.publish(bare, dialects.Message{Group: "g", Payload: []byte("x")})
	if err := jc.Cancel(ctx, bare, id, t0, "x"); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.state(bare, id); ok {
		t.Errorf("row %d of a table without processed_at outlived its Cancel", id)
	}
}

// A row a claim holds in the row lock form is refused (the change skips it, as claims
// do) and left as it was; once the claim ended it is cancelled.
func testJobControlRowLock(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_jcr", rowLockTable)
	held := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("held")})
	delayed := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("delayed"), NotBefore: t0.Add(time.Hour)})
	q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: tbl, Group: "g"})
	c, ok, err := q.ClaimLocked(ctx, t0)
	if err != nil || !ok || c.Row().ID != held {
		t.Fatalf("claim: %v %v", ok, err)
	}
	jc := controller(t, e.d)
	for _, err := range []error{jc.RetryNow(ctx, tbl, held, t0), jc.Cancel(ctx, tbl, held, t0, "x")} {
		if !errors.Is(err, dialects.ErrRowInWork) {
			t.Errorf("RetryNow or Cancel of a row a claim holds: %v, want ErrRowInWork", err)
		}
	}
	for range 2 { // the second finds it due already: nothing to change, no error
		if err := jc.RetryNow(ctx, tbl, delayed, t0); err != nil {
			t.Errorf("RetryNow of a delayed row beside a held one: %v", err)
		}
	}
	if s, _ := e.state(tbl, delayed); s.RetryAfter != nil {
		t.Errorf("the delayed row keeps retry_after %v", s.RetryAfter)
	}
	if err := c.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.state(tbl, held); !ok {
		t.Fatal("the held row is gone")
	}
	if err := jc.Cancel(ctx, tbl, held, t0, "x"); err != nil {
		t.Fatalf("Cancel once the claim ended: %v", err)
	}
	if _, ok := e.state(tbl, held); ok {
		t.Error("the cancelled row is still there")
	}
}

// In the advisory form a row whose key a consumer's session holds is refused and left as
// it was; once the key is free the change runs, and the key is free again after it.
func testJobControlAdvisory(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_jcv", func(name string) dialects.Table {
		return dialects.Table{Name: name, ID: "id", Payload: "payload", RetryAfter: "retry_after",
			ProcessedAt: "processed_at", AdvisoryKey: name + "-{id}"}
	})
	held := e.publish(tbl, dialects.Message{Payload: []byte("held"), NotBefore: t0.Add(time.Hour)})
	free := e.publish(tbl, dialects.Message{Payload: []byte("free"), NotBefore: t0.Add(time.Hour)})
	q := e.openAdvisory(dialects.QueueSpec{Table: tbl})
	s, err := q.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key := func(id int64) string { return tbl.Name + "-" + strconv.FormatInt(id, 10) }
	if ok, err := s.TryLock(ctx, key(held)); !ok || err != nil {
		t.Fatalf("a consumer's lock of %s: %v %v", key(held), ok, err)
	}
	jc := controller(t, e.d)
	for _, err := range []error{jc.RetryNow(ctx, tbl, held, t0), jc.Cancel(ctx, tbl, held, t0, "x")} {
		if !errors.Is(err, dialects.ErrRowInWork) {
			t.Errorf("RetryNow or Cancel of a row whose key is held: %v, want ErrRowInWork", err)
		}
	}
	if st, _ := e.state(tbl, held); st.RetryAfter == nil || st.ProcessedAt != nil {
		t.Errorf("the held row changed: %+v", st)
	}
	if err := jc.RetryNow(ctx, tbl, free, t0); err != nil {
		t.Errorf("RetryNow of a free row beside a held one: %v", err)
	}
	if st, _ := e.state(tbl, free); st.RetryAfter != nil {
		t.Errorf("the free row keeps retry_after %v", st.RetryAfter)
	}
	if _, err := s.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := jc.Cancel(ctx, tbl, held, t0, "x"); err != nil {
		t.Fatalf("Cancel once the key is free: %v", err)
	}
	if st, _ := e.state(tbl, held); st.ProcessedAt == nil {
		t.Errorf("the cancelled row: %+v", st)
	}
	// The change let its key go: a consumer takes it.
	s2, err := q.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s2.TryLock(ctx, key(free)); !ok || err != nil {
		t.Errorf("the key of the row RetryNow changed is still held: %v %v", ok, err)
	}
	_, _ = s2.Unlock(ctx)
}

// RetryNow without a retry_after column is refused before anything is read.
func testJobControlRefusals(t *testing.T, h Harness) {
	e := setup(t, h)
	jc := controller(t, e.d)
	var ce *dialects.ConfigError
	noDelay := e.table("ra_jcn", func(name string) dialects.Table {
		return dialects.Table{Name: name, ID: "id", Payload: "payload", LockedUntil: "locked_until"}
	})
	id := e.publish(noDelay, dialects.Message{Payload: []byte("x")})
	if err := jc.RetryNow(ctx, noDelay, id, t0); !errors.As(err, &ce) || ce.Option != "Table.RetryAfter" {
		t.Errorf("RetryNow without retry_after: %v, want a *ConfigError on Table.RetryAfter", err)
	}
}

// cancelFencesLateDelivery checks that Cancel ends a row whose lease ran out for every
// delivery of it: the delivery whose lease it was may still be running (its renewer late),
// and its settlement, fenced by its token, must then find the row lost, as it would after
// a later claim, and the renewer must not move its lease again. tbl is a created lease
// table in which a claim of group "g" takes the row ClaimOne publishes.
func cancelFencesLateDelivery(t *testing.T, d dialects.Dialect, tbl dialects.Table) {
	t.Helper()
	q := OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	held := ClaimOne(t, d, q, tbl) // lease until t0+1m
	late := held.Token.Add(time.Second)
	if err := controller(t, d).Cancel(ctx, tbl, held.ID, late, "cancelled by the operator"); err != nil {
		t.Fatalf("Cancel of a row whose lease ran out: %v", err)
	}
	moved, err := q.ExtendLeases(ctx, late.Add(time.Minute), []dialects.Lease{held})
	if err != nil || len(moved) != 0 {
		t.Errorf("the renewer moved the lease of a cancelled row: moved %v, %v", moved, err)
	}
	if len(moved) == 1 {
		held.Token = late.Add(time.Minute) // the delivery settles with the token the renewer handed it
	}
	changed, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: late.Add(2 * time.Second)}, held)
	if err != nil {
		t.Fatal(err)
	}
	if changed {
		t.Errorf("the delivery of row %d settled it after Cancel ended it: settled twice", held.ID)
	}
	if tbl.ProcessedAt == "" {
		return
	}
	j, err := inspector(t, d).Inspect(ctx, tbl, held.ID, late.Add(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	want, reason := dialects.JobProcessed, dialects.CancelledPrefix+"cancelled by the operator"
	if tbl.Error != "" {
		want = dialects.JobCancelled // without an error column, a cancelled row reads as processed
	}
	if j.State != want || (tbl.Error != "" && j.Error != reason) {
		t.Errorf("the cancelled row after its late delivery's ack: %+v (want %v, error %q)", j, want, reason)
	}
	sameTime(t, "the cancelled row's processed_at", &j.ProcessedAt, late)
}

// Cancel of a row whose lease ran out while its delivery still runs: the delivery's ack
// (and renewer) must find the row lost, whether Cancel kept the row or deleted it.
func testCancelFencesLateDelivery(t *testing.T, h Harness) {
	e := setup(t, h)
	for _, keep := range []bool{true, false} {
		tbl := e.table("ra_jcl", func(name string) dialects.Table {
			tb := leaseTable(name)
			if keep {
				tb.ProcessedAt, tb.Error = "processed_at", "error"
			}
			return tb
		})
		cancelFencesLateDelivery(t, e.d, tbl)
	}
}
