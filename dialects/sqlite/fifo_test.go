package sqlite

import (
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// fifoQ claims and settles through a FIFO lease queue, keeping its leases by row id.
type fifoQ struct {
	t      *testing.T
	lq     dialects.LeaseQueue
	leases map[int64]dialects.Lease
}

func openFIFO(t *testing.T, d *Dialect, tbl dialects.Table, group string) *fifoQ {
	t.Helper()
	q, err := d.Open(ctx, dialects.QueueSpec{Table: tbl, Group: group, DeadLetterGroup: "dead"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	if _, ok := q.(dialects.FIFOQueue); !ok {
		t.Fatalf("Open returned %T for a FIFO table, not a FIFOQueue", q)
	}
	return &fifoQ{t: t, lq: q.(dialects.LeaseQueue), leases: map[int64]dialects.Lease{}}
}

// claim claims at now, asking for 4 rows to show it never takes more than the head, and
// returns the row's id, or 0 when the claim came back empty.
func (f *fifoQ) claim(now time.Time) int64 {
	f.t.Helper()
	rows, err := f.lq.ClaimLeases(ctx, now, now.Add(30*time.Second), 4)
	if err != nil {
		f.t.Fatal(err)
	}
	if len(rows) > 1 {
		f.t.Fatalf("a FIFO claim took %d rows", len(rows))
	}
	if len(rows) == 0 {
		return 0
	}
	f.leases[rows[0].ID] = dialects.Lease{ID: rows[0].ID, Token: rows[0].Token}
	return rows[0].ID
}

func (f *fifoQ) settle(id int64, step dialects.Step) {
	f.t.Helper()
	l, ok := f.leases[id]
	if !ok {
		f.t.Fatalf("row %d is not held", id)
	}
	delete(f.leases, id)
	if ok, err := f.lq.SettleLease(ctx, step, l); err != nil || !ok {
		f.t.Fatalf("settle row %d: %v %v", id, ok, err)
	}
}

func (f *fifoQ) ack(id int64, now time.Time) {
	f.settle(id, dialects.Step{Kind: dialects.StepAck, Now: now})
}

// fifoTable creates a FIFO lease table with processed_at (acks mark rows) in d.
func fifoTable(t *testing.T, d *Dialect) dialects.Table {
	t.Helper()
	tbl := leaseTable("jobs")
	tbl.ProcessedAt, tbl.FIFO = "processed_at", true
	createTable(t, d, tbl)
	return tbl
}

func TestFIFOOpen(t *testing.T) {
	d := newDialect(t)
	adv := advisoryTable("adv")
	adv.FIFO = true
	createTable(t, d, adv)
	_, err := d.Open(ctx, dialects.QueueSpec{Table: adv})
	ce := configError(t, err)
	if ce.Option != "Table.FIFO" {
		t.Errorf("refusal names %q", ce.Option)
	}
	contains(t, ce.Fix, "put the group into the advisory key")

	noGroup := leaseTable("jobs")
	createTable(t, d, noGroup)
	noGroup.Group, noGroup.FIFO = "", true
	_, err = d.Open(ctx, dialects.QueueSpec{Table: noGroup})
	if ce := configError(t, err); ce.Option != "Table.FIFO" {
		t.Errorf("refusal names %q", ce.Option)
	}

	// The row lock form is refused as ever.
	rl := leaseTable("jobs")
	rl.LockedUntil, rl.FIFO = "", true
	_, err = d.Open(ctx, dialects.QueueSpec{Table: rl, Group: "g"})
	configError(t, err)

	// A FIFO lease queue keeps serving transactional deliveries.
	lt := leaseTable("jobs")
	lt.FIFO = true
	q, err := d.Open(ctx, dialects.QueueSpec{Table: lt, Group: "g", Transactional: true})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, ok := q.(dialects.FIFOQueue); !ok {
		t.Errorf("%T is no FIFOQueue", q)
	}
	if _, ok := q.(dialects.TxLeaseQueue); !ok {
		t.Errorf("%T is no TxLeaseQueue", q)
	}
}

// A claim takes the head alone; while it is in work the group gives nothing, other
// groups are unaffected, a retry keeps the head, and its ack makes the next row the head.
func TestFIFOHeadOnly(t *testing.T) {
	d := newDialect(t)
	tbl := fifoTable(t, d)
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
	if n := count(t, d, "SELECT COUNT(*) FROM jobs WHERE id = ? AND processed_at IS NOT NULL AND locked_until IS NULL", a); n != 1 {
		t.Fatalf("row %d not marked", a)
	}
	if got := q.claim(t0.Add(time.Second)); got != b {
		t.Fatalf("after the head's ack the claim took %d, want %d", got, b)
	}
	q.settle(b, dialects.Step{Kind: dialects.StepRetry, Now: t0})
	if got := q.claim(t0.Add(2 * time.Second)); got != b {
		t.Fatalf("after a retry the claim took %d, want %d again", got, b)
	}
	q.ack(b, t0)
	if got := q.claim(t0.Add(3 * time.Second)); got != c {
		t.Fatalf("claimed %d, want %d", got, c)
	}
	// An expired lease frees the group: the head is claimed again, not the row behind.
	d2 := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("d")})
	if got := q.claim(t0.Add(time.Hour)); got != c {
		t.Fatalf("after the lease ran out the claim took %d, want %d (row %d waits)", got, c, d2)
	}
	if s, _ := stateOf(t, d, "jobs", c); s.Attempt != 3 {
		t.Fatalf("row %d: %+v", c, s)
	}
}

// A head not yet due blocks its group; at its time it is claimed before the rows behind it.
func TestFIFONotYetDueHeadBlocks(t *testing.T) {
	d := newDialect(t)
	tbl := fifoTable(t, d)
	a := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("a"), NotBefore: t0.Add(time.Hour)})
	publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("b"), NotBefore: t0.Add(time.Hour)})
	q := openFIFO(t, d, tbl, "g")
	if got := q.claim(t0); got != 0 {
		t.Fatalf("claimed %d before the head was due", got)
	}
	if got := q.claim(t0.Add(time.Hour)); got != a {
		t.Fatalf("claimed %d at the head's time, want %d", got, a)
	}
}

// RetryAfter keeps the head: until its retry_after the group gives nothing (the rows
// behind it stay untouched); at its time the head is claimed again, then the rows behind.
func TestFIFORetryAfterKeepsTheHead(t *testing.T) {
	d := newDialect(t)
	tbl := fifoTable(t, d)
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
		if s, _ := stateOf(t, d, "jobs", id); s.Attempt != 1 || s.LockedUntil != "NULL" || s.RetryAfter != "NULL" {
			t.Fatalf("row %d behind the waiting head: %+v", id, s)
		}
	}
	if id := q.claim(t0.Add(time.Minute)); id != a {
		t.Fatalf("at its time the claim took %d, want %d", id, a)
	}
	if s, _ := stateOf(t, d, "jobs", a); s.Attempt != 3 || s.RetryAfter != formatTime(t0.Add(time.Minute)) {
		t.Fatalf("row %d claimed again: %+v, want attempt 3 and its retry_after", a, s)
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
}

// A head moved to the dead letter leaves the group; the next row is the head.
func TestFIFODeadLetterLeavesTheGroup(t *testing.T) {
	d := newDialect(t)
	tbl := fifoTable(t, d)
	a := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("a")})
	b := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("b")})
	q := openFIFO(t, d, tbl, "g")
	if got := q.claim(t0); got != a {
		t.Fatalf("claimed %d, want %d", got, a)
	}
	q.settle(a, dialects.Step{Kind: dialects.StepDeadLetter, Now: t0})
	if s, _ := stateOf(t, d, "jobs", a); s.Group != "dead" {
		t.Fatalf("row %d: %+v", a, s)
	}
	if got := q.claim(t0.Add(time.Second)); got != b {
		t.Fatalf("claimed %d, want %d", got, b)
	}
}

// A row that enters the group ahead of a head in work waits for the head's lease: a
// claim from another Dialect over the file (another process) gets nothing meanwhile.
// SQLite's single writer hands out ids in commit order, so the row ahead is written here
// with a lower id of its own (a freed one), as a transaction that took its id before the
// head's would have it.
func TestFIFORowAheadOfHeadInWorkWaits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.db")
	d1, d2 := openFile(t, path), openFile(t, path)
	tbl := fifoTable(t, d1)
	b := publish(t, d1, tbl, dialects.Message{Group: "g", Payload: []byte("b")})
	a := publish(t, d1, tbl, dialects.Message{Group: "g", Payload: []byte("a")})
	mustExec(t, d1, "DELETE FROM jobs WHERE id = ?", b)
	q := openFIFO(t, d1, tbl, "g")
	q2 := openFIFO(t, d2, tbl, "g")
	if got := q.claim(t0); got != a {
		t.Fatalf("claimed %d, want %d", got, a)
	}
	mustExec(t, d1, "INSERT INTO jobs (id, grp, payload) VALUES (?, 'g', 'b')", b)
	if got := q2.claim(t0.Add(time.Second)); got != 0 {
		t.Fatalf("row %d was claimed while row %d was in work", got, a)
	}
	q.ack(a, t0)
	if got := q2.claim(t0.Add(time.Second)); got != b {
		t.Fatalf("claimed %d, want %d", got, b)
	}
}

// Claims racing from two Dialects over one file: exactly one gets the head.
func TestFIFOConcurrentClaims(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.db")
	d1, d2 := openFile(t, path), openFile(t, path)
	tbl := fifoTable(t, d1)
	for range 5 {
		publish(t, d1, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	}
	const n = 6
	qs := make([]*fifoQ, n)
	for i := range qs {
		qs[i] = openFIFO(t, []*Dialect{d1, d2}[i%2], tbl, "g")
	}
	got := make([]int64, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range qs {
		wg.Go(func() {
			<-start
			got[i] = qs[i].claim(t0)
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
	if claimed != 1 {
		t.Fatalf("%d claims took a row (%v), want exactly 1", claimed, got)
	}
}
