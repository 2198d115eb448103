package postgres

import (
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// fifoQ claims and settles through either FIFO form, keeping what it holds by row id.
type fifoQ struct {
	t      *testing.T
	form   dialects.Form
	rq     dialects.RowLockQueue
	lq     dialects.LeaseQueue
	claims map[int64]dialects.LockedClaim
	leases map[int64]dialects.Lease
}

func openFIFO(t *testing.T, d *Dialect, tbl dialects.Table, group string) *fifoQ {
	t.Helper()
	q := openQueue(t, d, dialects.QueueSpec{Table: tbl, Group: group, DeadLetterGroup: "dead"})
	if _, ok := q.(dialects.FIFOQueue); !ok {
		t.Fatalf("Open returned %T for a FIFO table, not a FIFOQueue", q)
	}
	f := &fifoQ{t: t, form: tbl.Form(), claims: map[int64]dialects.LockedClaim{}, leases: map[int64]dialects.Lease{}}
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

// claim claims at now and returns the row's id, or 0 when the claim came back empty. The
// lease form asks for 4 rows, to show it never takes more than the head.
func (f *fifoQ) claim(now time.Time) int64 {
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

func (f *fifoQ) settle(id int64, step dialects.Step) {
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

func (f *fifoQ) ack(id int64, now time.Time) {
	f.settle(id, dialects.Step{Kind: dialects.StepAck, Now: now})
}

// fifoForms runs a test in both forms, on a table with processed_at (acks mark rows).
func fifoForms(t *testing.T, run func(t *testing.T, d *Dialect, tbl dialects.Table)) {
	for _, form := range []dialects.Form{dialects.FormRowLock, dialects.FormLease} {
		t.Run(form.String(), func(t *testing.T) {
			d := newDialect(t)
			tbl := rowLockTable(tableName(t, d))
			if form == dialects.FormLease {
				tbl = leaseTable(tbl.Name)
			}
			tbl.ProcessedAt, tbl.FIFO = "processed_at", true
			createTable(t, d, tbl)
			run(t, d, tbl)
		})
	}
}

func TestFIFOOpen(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d)
	adv := advisoryTable(name)
	adv.FIFO = true
	createTable(t, d, adv)
	_, err := d.Open(ctx, dialects.QueueSpec{Table: adv, Group: "g"})
	ce := configError(t, err)
	if ce.Option != "Table.FIFO" {
		t.Errorf("refusal names %q", ce.Option)
	}
	contains(t, ce.Fix, "put the group into the advisory key")

	noGroup := leaseTable(name)
	noGroup.Group, noGroup.FIFO = "", true
	_, err = d.Open(ctx, dialects.QueueSpec{Table: noGroup})
	if ce := configError(t, err); ce.Option != "Table.FIFO" {
		t.Errorf("refusal names %q", ce.Option)
	}

	// A transactional FIFO queue keeps serving its form, transaction and all.
	lt := leaseTable(tableName(t, d))
	lt.FIFO = true
	createTable(t, d, lt)
	q := openQueue(t, d, dialects.QueueSpec{Table: lt, Group: "g", Transactional: true})
	if _, ok := q.(dialects.FIFOQueue); !ok {
		t.Errorf("transactional lease: %T is no FIFOQueue", q)
	}
	if _, ok := q.(dialects.TxLeaseQueue); !ok {
		t.Errorf("transactional lease: %T is no TxLeaseQueue", q)
	}
	// A table without FIFO gets the plain queues.
	lt.FIFO = false
	if q := openQueue(t, d, dialects.QueueSpec{Table: lt, Group: "g"}); func() bool { _, ok := q.(dialects.FIFOQueue); return ok }() {
		t.Errorf("a table without FIFO got %T", q)
	}
}

// A claim takes the head alone; while it is in work the group gives nothing, other
// groups are unaffected, and the head's settlement makes the next row the head.
func TestFIFOHeadOnly(t *testing.T) {
	fifoForms(t, func(t *testing.T, d *Dialect, tbl dialects.Table) {
		a := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("a")})
		b := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("b")})
		x := publish(t, d, tbl, dialects.Message{Group: "other", Payload: []byte("x")})
		c := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("c")})
		q := openFIFO(t, d, tbl, "g")
		other := openFIFO(t, d, tbl, "other")

		if got := q.claim(t0); got != a {
			t.Fatalf("claimed %d, want the head %d", got, a)
		}
		if got := q.claim(t0.Add(time.Second)); got != 0 {
			t.Fatalf("the head is in work, yet row %d was claimed", got)
		}
		if got := other.claim(t0); got != x {
			t.Fatalf("another group's claim took %d, want %d", got, x)
		}
		q.ack(a, t0)
		if s, _ := stateOf(t, d, tbl, a); s.ProcessedAt == nil {
			t.Fatalf("row %d not marked: %+v", a, s)
		}
		if got := q.claim(t0.Add(time.Second)); got != b {
			t.Fatalf("after the head's ack the claim took %d, want %d", got, b)
		}
		// Retry keeps the row at the head.
		q.settle(b, dialects.Step{Kind: dialects.StepRetry, Now: t0})
		if got := q.claim(t0.Add(2 * time.Second)); got != b {
			t.Fatalf("after a retry the claim took %d, want %d again", got, b)
		}
		q.ack(b, t0)
		if got := q.claim(t0.Add(3 * time.Second)); got != c {
			t.Fatalf("claimed %d, want %d", got, c)
		}
		q.ack(c, t0)
		if got := q.claim(t0.Add(4 * time.Second)); got != 0 {
			t.Fatalf("an empty group gave row %d", got)
		}
		other.ack(x, t0)
	})
}

// A head not yet due blocks its group; at its time it is claimed before the rows behind it.
func TestFIFONotYetDueHeadBlocks(t *testing.T) {
	fifoForms(t, func(t *testing.T, d *Dialect, tbl dialects.Table) {
		a := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("a"), NotBefore: t0.Add(time.Hour)})
		publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("b"), NotBefore: t0.Add(time.Hour)})
		q := openFIFO(t, d, tbl, "g")
		if got := q.claim(t0); got != 0 {
			t.Fatalf("claimed %d before the head was due", got)
		}
		if got := q.claim(t0.Add(time.Hour)); got != a {
			t.Fatalf("claimed %d at the head's time, want %d", got, a)
		}
	})
}

// RetryAfter keeps the head: until its retry_after the group gives nothing (the rows
// behind it stay untouched); at its time the head is claimed again, then the rows behind.
func TestFIFORetryAfterKeepsTheHead(t *testing.T) {
	fifoForms(t, func(t *testing.T, d *Dialect, tbl dialects.Table) {
		a := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("a")})
		b := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("b")})
		c := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("c")})
		q := openFIFO(t, d, tbl, "g")
		if got := q.claim(t0); got != a {
			t.Fatalf("claimed %d, want %d", got, a)
		}
		q.settle(a, dialects.Step{Kind: dialects.StepRetryAfter, Now: t0, At: t0.Add(time.Minute)})
		for i := range 3 {
			if id := q.claim(t0.Add(time.Duration(i+1) * time.Second)); id != 0 {
				t.Fatalf("claimed row %d while the head %d waits for its retry_after", id, a)
			}
		}
		for _, id := range []int64{b, c} {
			if s, _ := stateOf(t, d, tbl, id); s.Attempt != 1 || s.LockedUntil != nil || s.RetryAfter != nil || s.ProcessedAt != nil {
				t.Fatalf("row %d behind the waiting head: %+v", id, s)
			}
		}
		if id := q.claim(t0.Add(time.Minute)); id != a {
			t.Fatalf("at its time the claim took %d, want %d", id, a)
		}
		if s, _ := stateOf(t, d, tbl, a); s.Attempt != fifoAttempt(tbl, 2) || !sameTime(s.RetryAfter, t0.Add(time.Minute)) {
			t.Fatalf("row %d claimed again: %+v, want attempt %d and its retry_after", a, s, fifoAttempt(tbl, 2))
		}
		q.ack(a, t0.Add(time.Minute))
		var got []int64
		for i := range 3 {
			if id := q.claim(t0.Add(time.Minute + time.Duration(i+1)*time.Second)); id != 0 {
				got = append(got, id)
				q.ack(id, t0.Add(time.Minute))
			}
		}
		if !slices.Equal(got, []int64{b, c}) {
			t.Fatalf("after the head's ack the claims took %v, want %v", got, []int64{b, c})
		}
	})
}

// A head moved to the dead letter leaves the group; the next row is the head.
func TestFIFODeadLetterLeavesTheGroup(t *testing.T) {
	fifoForms(t, func(t *testing.T, d *Dialect, tbl dialects.Table) {
		a := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("a")})
		b := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("b")})
		q := openFIFO(t, d, tbl, "g")
		if got := q.claim(t0); got != a {
			t.Fatalf("claimed %d, want %d", got, a)
		}
		q.settle(a, dialects.Step{Kind: dialects.StepDeadLetter, Now: t0})
		if s, _ := stateOf(t, d, tbl, a); s.Group != "dead" {
			t.Fatalf("row %d: %+v", a, s)
		}
		if got := q.claim(t0.Add(time.Second)); got != b {
			t.Fatalf("claimed %d, want %d", got, b)
		}
	})
}

// A row that enters the group ahead of a head in work (published in a transaction that
// took its lower id before the head was published, and committed while the head was in
// work) is the group's head from its commit, and waits for the head in work to settle: in
// the row lock form the guard keeps the group for the whole delivery, in the lease form
// the head's lease does. q2 is another process.
func TestFIFORowAheadOfHeadInWorkWaits(t *testing.T) {
	fifoForms(t, func(t *testing.T, d *Dialect, tbl dialects.Table) {
		p, err := d.Publisher(ctx, tbl)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := d.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		b, err := p.Publish(ctx, tx, dialects.Message{Group: "g", Payload: []byte("b")})
		if err != nil {
			t.Fatal(err)
		}
		a := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("a")})
		if b >= a {
			t.Fatalf("row %d published first has no lower id than row %d", b, a)
		}
		q := openFIFO(t, d, tbl, "g")
		q2 := openFIFO(t, d, tbl, "g")
		if got := q.claim(t0); got != a {
			t.Fatalf("claimed %d, want %d", got, a)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if got := q2.claim(t0.Add(time.Second)); got != 0 {
			t.Fatalf("row %d was claimed while row %d was in work", got, a)
		}
		q.ack(a, t0)
		if got := q2.claim(t0.Add(time.Second)); got != b {
			t.Fatalf("claimed %d, want %d", got, b)
		}
	})
}

// The guard itself: while another transaction holds the group's advisory lock, the claim
// comes back empty, though the head is free; another group's claim goes on.
func TestFIFOGuardHeldElsewhere(t *testing.T) {
	fifoForms(t, func(t *testing.T, d *Dialect, tbl dialects.Table) {
		a := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("a")})
		x := publish(t, d, tbl, dialects.Message{Group: "other", Payload: []byte("x")})
		q := openFIFO(t, d, tbl, "g")
		other := openFIFO(t, d, tbl, "other")
		tx, err := d.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1 || ':' || $2, 0))", tbl.Name, "g"); err != nil {
			t.Fatal(err)
		}
		if got := q.claim(t0); got != 0 {
			t.Fatalf("row %d was claimed while the group's guard was held", got)
		}
		if got := other.claim(t0); got != x {
			t.Fatalf("another group's claim took %d, want %d", got, x)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if got := q.claim(t0); got != a {
			t.Fatalf("claimed %d once the guard was free, want %d", got, a)
		}
	})
}

// Claims racing for one group: exactly one of them gets the head; the others get nothing
// (no error, no wait).
func TestFIFOConcurrentClaims(t *testing.T) {
	fifoForms(t, func(t *testing.T, d *Dialect, tbl dialects.Table) {
		for range 5 {
			publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
		}
		const n = 6
		qs := make([]*fifoQ, n)
		for i := range qs {
			qs[i] = openFIFO(t, d, tbl, "g")
		}
		got := make([]int64, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range qs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				got[i] = qs[i].claim(t0)
			}()
		}
		close(start)
		wg.Wait()
		claimed := 0
		for _, id := range got {
			if id != 0 {
				claimed++
			}
		}
		if claimed != 1 {
			t.Fatalf("%d claims took a row (%v), want exactly 1", claimed, got)
		}
	})
}
