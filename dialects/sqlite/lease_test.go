package sqlite

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

func TestClaimLeases(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
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
		s, _ := stateOf(t, d, "jobs", r.ID)
		if s.Attempt != 2 || s.LockedUntil != "2030-01-02T03:04:35.123456Z" {
			t.Errorf("row %d stored %+v", r.ID, s)
		}
	}
	if string(rows[0].Payload) != "a" || string(rows[0].Headers) != `{"k":"v"}` || rows[1].Headers != nil {
		t.Errorf("payload %q headers %q / %q", rows[0].Payload, rows[0].Headers, rows[1].Headers)
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
}

func ids(rows []dialects.Row) []int64 {
	var out []int64
	for _, r := range rows {
		out = append(out, r.ID)
	}
	return out
}

// A TEXT payload comes back as its bytes, and a table of only the required columns
// plus the lease works.
func TestClaimLeasesMinimalTable(t *testing.T) {
	d := newDialect(t)
	mustExec(t, d, "CREATE TABLE m (k INTEGER PRIMARY KEY, body TEXT NOT NULL, lease TEXT)")
	mustExec(t, d, "INSERT INTO m (body) VALUES ('hello'), ('world')")
	q := openLease(t, d, dialects.QueueSpec{Table: dialects.Table{Name: "m", ID: "k", Payload: "body", LockedUntil: "lease"}})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Second), 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || !bytes.Equal(rows[0].Payload, []byte("hello")) || rows[0].Attempt != 0 {
		t.Fatalf("claimed %+v", rows)
	}
}

func TestExtendLeases(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
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
		s, _ := stateOf(t, d, "jobs", rows[i].ID)
		if s.LockedUntil != formatTime(want) {
			t.Errorf("row %d locked until %s, want %s", rows[i].ID, s.LockedUntil, formatTime(want))
		}
	}
	// The old token is spent.
	if moved, _ := q.ExtendLeases(ctx, next, held[:1]); len(moved) != 0 {
		t.Errorf("a stale token extended %v", moved)
	}
}

func TestExtendManyLeases(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
	createTable(t, d, tbl)
	const n = maxExtend + 3
	mustExec(t, d, "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?) INSERT INTO jobs (payload) SELECT 'p' FROM s", n)
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
	dead := func(tbl dialects.Table) dialects.QueueSpec {
		return dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"}
	}
	cases := []struct {
		name  string
		table func() dialects.Table
		step  dialects.Step
		check func(t *testing.T, d *Dialect, id int64)
	}{
		{"ack deletes", func() dialects.Table { return leaseTable("jobs") }, dialects.Step{Kind: dialects.StepAck, Now: t0},
			func(t *testing.T, d *Dialect, id int64) {
				if _, ok := stateOf(t, d, "jobs", id); ok {
					t.Error("row still there")
				}
			}},
		{"ack marks processed", func() dialects.Table {
			tbl := leaseTable("jobs")
			tbl.ProcessedAt = "processed_at"
			return tbl
		}, dialects.Step{Kind: dialects.StepAck, Now: t0},
			func(t *testing.T, d *Dialect, id int64) {
				if n := count(t, d, "SELECT count(*) FROM jobs WHERE id = ? AND processed_at = ? AND locked_until IS NULL",
					id, formatTime(t0)); n != 1 {
					t.Error("row not marked processed with its lease cleared")
				}
			}},
		{"retry", func() dialects.Table { return leaseTable("jobs") }, dialects.Step{Kind: dialects.StepRetry},
			func(t *testing.T, d *Dialect, id int64) {
				if s, _ := stateOf(t, d, "jobs", id); s.LockedUntil != "NULL" || s.Attempt != 2 {
					t.Errorf("row %+v", s)
				}
			}},
		{"release", func() dialects.Table { return leaseTable("jobs") }, dialects.Step{Kind: dialects.StepRelease},
			func(t *testing.T, d *Dialect, id int64) {
				if s, _ := stateOf(t, d, "jobs", id); s.LockedUntil != "NULL" {
					t.Errorf("row %+v", s)
				}
			}},
		{"retry after", func() dialects.Table { return leaseTable("jobs") }, dialects.Step{Kind: dialects.StepRetryAfter, At: at},
			func(t *testing.T, d *Dialect, id int64) {
				if s, _ := stateOf(t, d, "jobs", id); s.LockedUntil != "NULL" || s.RetryAfter != formatTime(at) {
					t.Errorf("row %+v", s)
				}
			}},
		{"dead letter group", func() dialects.Table { return leaseTable("jobs") }, dialects.Step{Kind: dialects.StepDeadLetter},
			func(t *testing.T, d *Dialect, id int64) {
				if s, _ := stateOf(t, d, "jobs", id); s.LockedUntil != "NULL" || s.Group != "dead" {
					t.Errorf("row %+v", s)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newDialect(t)
			tbl := c.table()
			createTable(t, d, tbl)
			q := openLease(t, d, dead(tbl))
			l := claimOne(t, d, q, tbl)
			before, _ := stateOf(t, d, "jobs", l.ID)

			stale := dialects.Lease{ID: l.ID, Token: l.Token.Add(-time.Microsecond)}
			ok, err := q.SettleLease(ctx, c.step, stale)
			if err != nil || ok {
				t.Fatalf("stale token: %v %v", ok, err)
			}
			if after, _ := stateOf(t, d, "jobs", l.ID); after != before {
				t.Fatalf("stale token changed the row: %+v -> %+v", before, after)
			}

			ok, err = q.SettleLease(ctx, c.step, l)
			if err != nil || !ok {
				t.Fatalf("settle: %v %v", ok, err)
			}
			c.check(t, d, l.ID)
			// The token is spent.
			if ok, _ := q.SettleLease(ctx, c.step, l); ok {
				t.Error("the same token settled twice")
			}
		})
	}
}

func TestSettleLeaseDeadLetterTable(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
	createTable(t, d, tbl)
	dest := leaseTable("jobs_dead")
	createTable(t, d, dest)
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterTable: "jobs_dead"})
	l := claimOne(t, d, q, tbl)

	step := dialects.Step{Kind: dialects.StepDeadLetter}
	ok, err := q.SettleLease(ctx, step, dialects.Lease{ID: l.ID, Token: l.Token.Add(time.Second)})
	if err != nil || ok {
		t.Fatalf("stale token: %v %v", ok, err)
	}
	if count(t, d, "SELECT count(*) FROM jobs_dead") != 0 || count(t, d, "SELECT count(*) FROM jobs") != 1 {
		t.Fatal("a move with a stale token was not rolled back")
	}

	ok, err = q.SettleLease(ctx, step, l)
	if err != nil || !ok {
		t.Fatalf("move: %v %v", ok, err)
	}
	if count(t, d, "SELECT count(*) FROM jobs") != 0 {
		t.Error("row left in the queue")
	}
	if n := count(t, d, "SELECT count(*) FROM jobs_dead WHERE id = ? AND CAST(payload AS TEXT) = 'p' AND grp = 'g' AND attempt = 2 AND locked_until IS NULL", l.ID); n != 1 {
		t.Error("row not copied with its columns and without its lease")
	}
	// The pool is usable afterwards: no transaction was left open on a connection.
	for range 3 {
		mustExec(t, d, "INSERT INTO jobs (payload) VALUES ('q')")
	}
}

func TestSettleLeaseWithoutColumns(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
	tbl.RetryAfter = ""
	createTable(t, d, tbl)
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	l := claimOne(t, d, q, tbl)
	if _, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, l); err == nil {
		t.Error("dead letter without a destination succeeded")
	}
	// Without retry_after a delay is kept in the lease: the row stays leased until it is due.
	at := t0.Add(time.Hour)
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepRetryAfter, At: at}, l); err != nil || !ok {
		t.Fatalf("retry_after parked in the lease: %v %v", ok, err)
	}
	if n := count(t, d, "SELECT count(*) FROM jobs WHERE id = ? AND locked_until = ?", l.ID, formatTime(at)); n != 1 {
		t.Fatal("the row is not leased until its due time")
	}
	if rows, err := q.ClaimLeases(ctx, at.Add(-time.Second), at.Add(time.Minute), 1); err != nil || len(rows) != 0 {
		t.Fatalf("claimed before its due time: %v %v", rows, err)
	}
	if ok, _ := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck}, l); ok {
		t.Error("the parked delivery's token settled again")
	}
	rows, err := q.ClaimLeases(ctx, at, at.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 || rows[0].Attempt != 2 {
		t.Fatalf("claim once due: %v %v", rows, err)
	}
	// A snooze parks too, and gives back the attempt the claim counted.
	l = dialects.Lease{ID: rows[0].ID, Token: rows[0].Token}
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepSnooze, At: at.Add(time.Hour)}, l); err != nil || !ok {
		t.Fatalf("snooze parked in the lease: %v %v", ok, err)
	}
	if n := count(t, d, "SELECT count(*) FROM jobs WHERE id = ? AND locked_until = ? AND attempt = 2", l.ID, formatTime(at.Add(time.Hour))); n != 1 {
		t.Fatal("the snoozed row is not leased until its due time with its attempt given back")
	}
}
