package dialecttest

import (
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// fifoScenarios are FIFO groups (FIFOQueue): a claim takes only the group's head, and only
// while no other row of the group is in work, in every form the database serves.
var fifoScenarios = []scenario{
	{name: "FIFOOpen", run: testFIFOOpen},
	{name: "FIFOHeadOnly", run: testFIFOHeadOnly},
	{name: "FIFONotYetDueHeadBlocks", run: testFIFONotYetDueHeadBlocks},
	{name: "FIFORetryAfterKeepsTheHead", run: testFIFORetryAfterKeepsTheHead},
	{name: "FIFODeadLetterLeavesTheGroup", run: testFIFODeadLetterLeavesTheGroup},
	{name: "FIFORowAheadOfHeadInWorkWaits", run: testFIFORowAheadOfHeadInWorkWaits},
	{name: "FIFOGuardHeldElsewhere", run: testFIFOGuardHeldElsewhere, applies: func(h Harness) bool {
		_, ok := h.(FIFOGuardHolder)
		return ok
	}},
	{name: "FIFOConcurrentClaims", run: testFIFOConcurrentClaims},
	{name: "FIFODelayedHeadHoldsItsGroup", run: testFIFODelayedHeadHoldsItsGroup},
	{name: "FIFORetryAfterHeadThenDeadLetter", run: testFIFORetryAfterHeadThenDeadLetter},
}

// FIFOClaimer claims and settles through a FIFO queue of either form, keeping what it
// holds by row id. The suite uses it, and so may a dialect's own FIFO tests.
type FIFOClaimer struct {
	t      *testing.T
	form   dialects.Form
	rq     dialects.RowLockQueue
	lq     dialects.LeaseQueue
	claims map[int64]dialects.LockedClaim
	leases map[int64]dialects.Lease
}

// NewFIFOClaimer checks that q, opened for the FIFO table tbl, is a FIFOQueue of tbl's form
// (a row lock one that claims no batches) and returns its claimer. Claims still held when t
// ends are rolled back.
func NewFIFOClaimer(t *testing.T, q dialects.Queue, tbl dialects.Table) *FIFOClaimer {
	t.Helper()
	if _, ok := q.(dialects.FIFOQueue); !ok {
		t.Fatalf("Open returned %T for a FIFO table, not a FIFOQueue", q)
	}
	f := &FIFOClaimer{t: t, form: tbl.Form(), claims: map[int64]dialects.LockedClaim{}, leases: map[int64]dialects.Lease{}}
	if f.form == dialects.FormLease {
		f.lq = q.(dialects.LeaseQueue)
	} else {
		f.rq = q.(dialects.RowLockQueue)
		if _, ok := reflect.TypeOf(q).MethodByName("ClaimLockedBatch"); ok {
			t.Fatalf("the FIFO row lock queue %T claims batches", q)
		}
	}
	t.Cleanup(func() {
		for _, c := range f.claims {
			c.Rollback(ctx)
		}
	})
	return f
}

func (e *env) openFIFO(tbl dialects.Table, group string) *FIFOClaimer {
	e.t.Helper()
	return NewFIFOClaimer(e.t, e.open(dialects.QueueSpec{Table: tbl, Group: group, DeadLetterGroup: "dead"}), tbl)
}

// Claim claims at now and returns the row's id, or 0 when the claim came back empty. The
// lease form asks for 4 rows, to show it never takes more than the head.
func (f *FIFOClaimer) Claim(now time.Time) int64 {
	f.t.Helper()
	if f.form == dialects.FormLease {
		rows, err := f.lq.ClaimLeases(ctx, now, now.Add(30*time.Second), 4)
		if err != nil {
			f.t.Fatal(err)
		}
		if len(rows) > 1 {
			f.t.Fatalf("a FIFO claim took %v", ids(rows))
		}
		if len(rows) == 0 {
			return 0
		}
		f.leases[rows[0].ID] = dialects.Lease{ID: rows[0].ID, Token: rows[0].Token}
		return rows[0].ID
	}
	c, ok, err := f.rq.ClaimLocked(ctx, now)
	if err != nil {
		f.t.Fatal(err)
	}
	if !ok {
		return 0
	}
	f.claims[c.Row().ID] = c
	return c.Row().ID
}

// Settle settles a held row by step.
func (f *FIFOClaimer) Settle(id int64, step dialects.Step) {
	f.t.Helper()
	if f.form == dialects.FormLease {
		l, ok := f.leases[id]
		if !ok {
			f.t.Fatalf("row %d is not held", id)
		}
		delete(f.leases, id)
		if ok, err := f.lq.SettleLease(ctx, step, l); err != nil || !ok {
			f.t.Fatalf("settle row %d: %v %v", id, ok, err)
		}
		return
	}
	c, ok := f.claims[id]
	if !ok {
		f.t.Fatalf("row %d is not held", id)
	}
	delete(f.claims, id)
	if err := c.Settle(ctx, step); err != nil {
		f.t.Fatalf("settle row %d: %v", id, err)
	}
}

// Ack settles a held row by StepAck.
func (f *FIFOClaimer) Ack(id int64, now time.Time) {
	f.Settle(id, dialects.Step{Kind: dialects.StepAck, Now: now})
}

// fifoAttempt is the attempt column of a row in its nth delivery: the lease form counts
// at the claim, the row lock form when a retry returns the row.
func fifoAttempt(tbl dialects.Table, n int) int {
	if tbl.Form() == dialects.FormLease {
		return n + 1
	}
	return n
}

// fifoForms runs a test in every form the database serves (subtests named by form), on a
// FIFO table with processed_at (acks mark rows).
func fifoForms(t *testing.T, h Harness, run func(t *testing.T, e *env, tbl dialects.Table)) {
	forms := []dialects.Form{dialects.FormLease}
	if h.Caps().RowLock {
		forms = []dialects.Form{dialects.FormRowLock, dialects.FormLease}
	}
	for _, form := range forms {
		t.Run(form.String(), func(t *testing.T) {
			e := setup(t, h)
			tbl := rowLockTable(e.name("fifo"))
			if form == dialects.FormLease {
				tbl = leaseTable(tbl.Name)
			}
			tbl.ProcessedAt, tbl.FIFO = "processed_at", true
			e.create(tbl)
			run(t, e, tbl)
		})
	}
}

func testFIFOOpen(t *testing.T, h Harness) {
	e := setup(t, h)
	adv := advisoryTable(e.name("fifo"))
	adv.FIFO = true
	e.create(adv)
	for _, group := range []string{"g", ""} {
		_, err := e.d.Open(ctx, dialects.QueueSpec{Table: adv, Group: group})
		ce := configError(t, err)
		if ce.Option != "Table.FIFO" {
			t.Errorf("refusal names %q", ce.Option)
		}
		contains(t, ce.Fix, "put the group into the advisory key")
	}

	noGroup := e.table("fifo", leaseTable)
	noGroup.Group, noGroup.FIFO = "", true
	_, err := e.d.Open(ctx, dialects.QueueSpec{Table: noGroup})
	if ce := configError(t, err); ce.Option != "Table.FIFO" {
		t.Errorf("refusal names %q", ce.Option)
	}

	if !e.caps.RowLock {
		// The row lock form is refused as ever.
		rl := e.table("fifo", rowLockTable)
		rl.FIFO = true
		_, err = e.d.Open(ctx, dialects.QueueSpec{Table: rl, Group: "g"})
		configError(t, err)
	}

	// A transactional FIFO queue keeps serving its form, transaction and all.
	lt := e.table("fifo", leaseTable)
	lt.FIFO = true
	q := e.open(dialects.QueueSpec{Table: lt, Group: "g", Transactional: true})
	if _, ok := q.(dialects.FIFOQueue); !ok {
		t.Errorf("transactional lease: %T is no FIFOQueue", q)
	}
	if _, ok := q.(dialects.TxLeaseQueue); !ok {
		t.Errorf("transactional lease: %T is no TxLeaseQueue", q)
	}
	// A table without FIFO gets the plain queues.
	lt.FIFO = false
	if q := e.open(dialects.QueueSpec{Table: lt, Group: "g"}); func() bool { _, ok := q.(dialects.FIFOQueue); return ok }() {
		t.Errorf("a table without FIFO got %T", q)
	}
}

// A claim takes the head alone; while it is in work the group gives nothing, other
// groups are unaffected, a retry keeps the head, and its ack makes the next row the head.
// In the lease form an expired lease frees the group: the head is claimed again, not the
// row behind.
func testFIFOHeadOnly(t *testing.T, h Harness) {
	fifoForms(t, h, func(t *testing.T, e *env, tbl dialects.Table) {
		a := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("a")})
		b := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("b")})
		x := e.publish(tbl, dialects.Message{Group: "other", Payload: []byte("x")})
		c := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("c")})
		q := e.openFIFO(tbl, "g")
		other := e.openFIFO(tbl, "other")

		if got := q.Claim(t0); got != a {
			t.Fatalf("claimed %d, want the head %d", got, a)
		}
		if got := q.Claim(t0.Add(time.Second)); got != 0 {
			t.Fatalf("the head is in work, yet row %d was claimed", got)
		}
		if got := other.Claim(t0); got != x {
			t.Fatalf("another group's claim took %d, want %d", got, x)
		}
		q.Ack(a, t0)
		if s, _ := e.state(tbl, a); s.ProcessedAt == nil || s.LockedUntil != nil {
			t.Fatalf("row %d not marked: %+v", a, s)
		}
		if got := q.Claim(t0.Add(time.Second)); got != b {
			t.Fatalf("after the head's ack the claim took %d, want %d", got, b)
		}
		// Retry keeps the row at the head.
		q.Settle(b, dialects.Step{Kind: dialects.StepRetry, Now: t0})
		if got := q.Claim(t0.Add(2 * time.Second)); got != b {
			t.Fatalf("after a retry the claim took %d, want %d again", got, b)
		}
		q.Ack(b, t0)
		if got := q.Claim(t0.Add(3 * time.Second)); got != c {
			t.Fatalf("claimed %d, want %d", got, c)
		}
		var d int64
		if tbl.Form() == dialects.FormLease {
			d = e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("d")})
			if got := q.Claim(t0.Add(time.Hour)); got != c {
				t.Fatalf("after the lease ran out the claim took %d, want %d (row %d waits)", got, c, d)
			}
			if s, _ := e.state(tbl, c); s.Attempt != 3 {
				t.Fatalf("row %d: %+v", c, s)
			}
		}
		q.Ack(c, t0.Add(time.Hour))
		if d != 0 {
			if got := q.Claim(t0.Add(time.Hour + time.Second)); got != d {
				t.Fatalf("claimed %d, want %d", got, d)
			}
			q.Ack(d, t0.Add(time.Hour))
		}
		if got := q.Claim(t0.Add(time.Hour + 2*time.Second)); got != 0 {
			t.Fatalf("an empty group gave row %d", got)
		}
		other.Ack(x, t0)
	})
}

// A head not yet due blocks its group; at its time it is claimed before the rows behind it.
func testFIFONotYetDueHeadBlocks(t *testing.T, h Harness) {
	fifoForms(t, h, func(t *testing.T, e *env, tbl dialects.Table) {
		a := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("a"), NotBefore: t0.Add(time.Hour)})
		e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("b"), NotBefore: t0.Add(time.Hour)})
		q := e.openFIFO(tbl, "g")
		if got := q.Claim(t0); got != 0 {
			t.Fatalf("claimed %d before the head was due", got)
		}
		if got := q.Claim(t0.Add(time.Hour)); got != a {
			t.Fatalf("claimed %d at the head's time, want %d", got, a)
		}
	})
}

// RetryAfter keeps the head: until its retry_after the group gives nothing (the rows
// behind it stay untouched); at its time the head is claimed again, then the rows behind.
func testFIFORetryAfterKeepsTheHead(t *testing.T, h Harness) {
	fifoForms(t, h, func(t *testing.T, e *env, tbl dialects.Table) {
		a := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("a")})
		b := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("b")})
		c := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("c")})
		q := e.openFIFO(tbl, "g")
		if got := q.Claim(t0); got != a {
			t.Fatalf("claimed %d, want %d", got, a)
		}
		q.Settle(a, dialects.Step{Kind: dialects.StepRetryAfter, Now: t0, At: t0.Add(time.Minute)})
		for i := range 3 {
			if id := q.Claim(t0.Add(time.Duration(i+1) * time.Second)); id != 0 {
				t.Fatalf("claimed row %d while the head %d waits for its retry_after", id, a)
			}
		}
		for _, id := range []int64{b, c} {
			if s, _ := e.state(tbl, id); s.Attempt != 1 || s.LockedUntil != nil || s.RetryAfter != nil || s.ProcessedAt != nil {
				t.Fatalf("row %d behind the waiting head: %+v", id, s)
			}
		}
		if id := q.Claim(t0.Add(time.Minute)); id != a {
			t.Fatalf("at its time the claim took %d, want %d", id, a)
		}
		s, _ := e.state(tbl, a)
		if s.Attempt != fifoAttempt(tbl, 2) {
			t.Fatalf("row %d claimed again: %+v, want attempt %d", a, s, fifoAttempt(tbl, 2))
		}
		sameTime(t, "retry_after", s.RetryAfter, t0.Add(time.Minute))
		q.Ack(a, t0.Add(time.Minute))
		var got []int64
		for i := range 3 {
			if id := q.Claim(t0.Add(time.Minute + time.Duration(i+1)*time.Second)); id != 0 {
				got = append(got, id)
				q.Ack(id, t0.Add(time.Minute))
			}
		}
		if !slices.Equal(got, []int64{b, c}) {
			t.Fatalf("after the head's ack the claims took %v, want %v", got, []int64{b, c})
		}
	})
}

// A head moved to the dead letter leaves the group; the next row is the head.
func testFIFODeadLetterLeavesTheGroup(t *testing.T, h Harness) {
	fifoForms(t, h, func(t *testing.T, e *env, tbl dialects.Table) {
		a := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("a")})
		b := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("b")})
		q := e.openFIFO(tbl, "g")
		if got := q.Claim(t0); got != a {
			t.Fatalf("claimed %d, want %d", got, a)
		}
		q.Settle(a, dialects.Step{Kind: dialects.StepDeadLetter, Now: t0})
		if s, _ := e.state(tbl, a); s.Group != "dead" {
			t.Fatalf("row %d: %+v", a, s)
		}
		if got := q.Claim(t0.Add(time.Second)); got != b {
			t.Fatalf("claimed %d, want %d", got, b)
		}
	})
}

// A row that enters the group ahead of a head in work is the group's head from its commit,
// and waits for the head in work to settle: in the row lock form the guard keeps the group
// for the whole delivery, in the lease form the head's lease does. q2 is another process.
// The row ahead is published in a transaction that took its lower id before the head was
// published and commits while the head is in work; a single-writer database hands out ids
// in commit order, so there it is written with a lower id of its own (a freed one), as
// such a transaction would have it.
func testFIFORowAheadOfHeadInWorkWaits(t *testing.T, h Harness) {
	fifoForms(t, h, func(t *testing.T, e *env, tbl dialects.Table) {
		var (
			b      int64
			commit func()
		)
		if e.caps.SingleWriter {
			b = e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("b")})
			e.exec("DELETE FROM "+e.q(tbl.Name)+" WHERE id = ?", b)
			commit = func() {
				e.exec("INSERT INTO "+e.q(tbl.Name)+" (id, grp, payload) VALUES (?, 'g', ?)", b, []byte("b"))
			}
		} else {
			p, err := e.d.Publisher(ctx, tbl)
			if err != nil {
				t.Fatal(err)
			}
			tx := h.Begin(t, e.d)
			defer tx.Rollback()
			if b, err = p.Publish(ctx, tx.Value(), dialects.Message{Group: "g", Payload: []byte("b")}); err != nil {
				t.Fatal(err)
			}
			commit = func() {
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
		}
		a := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("a")})
		if b >= a {
			t.Fatalf("row %d published first has no lower id than row %d", b, a)
		}
		q := e.openFIFO(tbl, "g")
		q2 := e.other().openFIFO(tbl, "g")
		if got := q.Claim(t0); got != a {
			t.Fatalf("claimed %d, want %d", got, a)
		}
		commit()
		if got := q2.Claim(t0.Add(time.Second)); got != 0 {
			t.Fatalf("row %d was claimed while row %d was in work", got, a)
		}
		q.Ack(a, t0)
		if got := q2.Claim(t0.Add(time.Second)); got != b {
			t.Fatalf("claimed %d, want %d", got, b)
		}
	})
}

// The guard itself: while another transaction holds what the group's guard waits for, the
// claim comes back empty, though the head is free; another group's claim goes on.
func testFIFOGuardHeldElsewhere(t *testing.T, h Harness) {
	fifoForms(t, h, func(t *testing.T, e *env, tbl dialects.Table) {
		a := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("a")})
		x := e.publish(tbl, dialects.Message{Group: "other", Payload: []byte("x")})
		b := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("b")})
		q := e.openFIFO(tbl, "g")
		other := e.openFIFO(tbl, "other")
		release := h.(FIFOGuardHolder).HoldFIFOGroup(t, e.d, tbl, "g", b)
		defer release()
		if got := q.Claim(t0); got != 0 {
			t.Fatalf("row %d was claimed while the group's guard was held", got)
		}
		if got := other.Claim(t0); got != x {
			t.Fatalf("another group's claim took %d, want %d", got, x)
		}
		release()
		if got := q.Claim(t0); got != a {
			t.Fatalf("claimed %d once the guard was free, want %d", got, a)
		}
	})
}

// Claims racing for one group from two processes: exactly one of them gets the head (at
// most one where Caps.FIFORacingClaimsMayAllMiss, and then the next claim takes it); the
// others get nothing (no error, no wait).
func testFIFOConcurrentClaims(t *testing.T, h Harness) {
	fifoForms(t, h, func(t *testing.T, e *env, tbl dialects.Table) {
		for range 5 {
			e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("p")})
		}
		const n = 6
		envs := []*env{e, e.other()}
		qs := make([]*FIFOClaimer, n)
		for i := range qs {
			qs[i] = envs[i%2].openFIFO(tbl, "g")
		}
		got := make([]int64, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range qs {
			wg.Go(func() {
				<-start
				got[i] = qs[i].Claim(t0)
			})
		}
		close(start)
		wg.Wait()
		claimed := 0
		for _, id := range got {
			if id != 0 {
				claimed++
			}
		}
		switch {
		case claimed == 0 && e.caps.FIFORacingClaimsMayAllMiss:
			if id := qs[0].Claim(t0); id == 0 {
				t.Fatal("after racing claims that all came back empty, the head was not claimed")
			}
		case claimed == 1:
			if id := qs[0].Claim(t0); id != 0 {
				t.Fatalf("row %d was claimed while the head was in work", id)
			}
		default:
			t.Fatalf("%d claims took a row (%v), want exactly 1", claimed, got)
		}
	})
}

// A delayed head holds its group: the rows behind it stay untouched, other groups go on,
// and at its time the head is claimed, then the next row.
func testFIFODelayedHeadHoldsItsGroup(t *testing.T, h Harness) {
	fifoForms(t, h, func(t *testing.T, e *env, tbl dialects.Table) {
		a := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("a"), NotBefore: t0.Add(time.Hour)})
		b := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("b")})
		x := e.publish(tbl, dialects.Message{Group: "other", Payload: []byte("x")})
		q := e.openFIFO(tbl, "g")
		other := e.openFIFO(tbl, "other")
		if got := q.Claim(t0); got != 0 {
			t.Fatalf("claimed row %d while the head %d is not due", got, a)
		}
		if s, _ := e.state(tbl, b); s.Attempt != 1 || s.LockedUntil != nil {
			t.Fatalf("row %d behind the delayed head: %+v", b, s)
		}
		if got := other.Claim(t0); got != x {
			t.Fatalf("another group's claim took %d, want %d", got, x)
		}
		other.Ack(x, t0)
		if got := q.Claim(t0.Add(time.Hour)); got != a {
			t.Fatalf("claimed %d at the head's time, want %d", got, a)
		}
		q.Ack(a, t0.Add(time.Hour))
		if got := q.Claim(t0.Add(time.Hour)); got != b {
			t.Fatalf("claimed %d after the head's ack, want %d", got, b)
		}
	})
}

// A head that waits for its retry_after and then moves to the dead letter leaves the group
// to the next row, untouched meanwhile.
func testFIFORetryAfterHeadThenDeadLetter(t *testing.T, h Harness) {
	fifoForms(t, h, func(t *testing.T, e *env, tbl dialects.Table) {
		a := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("a")})
		b := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("b")})
		q := e.openFIFO(tbl, "g")
		if got := q.Claim(t0); got != a {
			t.Fatalf("claimed %d, want %d", got, a)
		}
		q.Settle(a, dialects.Step{Kind: dialects.StepRetryAfter, Now: t0, At: t0.Add(time.Minute)})
		if got := q.Claim(t0.Add(time.Second)); got != 0 {
			t.Fatalf("claimed row %d while the head %d waits for its retry_after", got, a)
		}
		if got := q.Claim(t0.Add(time.Minute)); got != a {
			t.Fatalf("claimed %d at the head's time, want %d", got, a)
		}
		q.Settle(a, dialects.Step{Kind: dialects.StepDeadLetter, Now: t0.Add(time.Minute)})
		if s, _ := e.state(tbl, a); s.Group != "dead" || s.ProcessedAt != nil || s.LockedUntil != nil {
			t.Fatalf("row %d after the dead letter: %+v", a, s)
		}
		if got := q.Claim(t0.Add(time.Minute + time.Second)); got != b {
			t.Fatalf("claimed %d after the head moved to the dead letter, want %d", got, b)
		}
		if s, _ := e.state(tbl, b); s.Attempt != fifoAttempt(tbl, 1) || s.RetryAfter != nil {
			t.Fatalf("row %d: %+v", b, s)
		}
	})
}
