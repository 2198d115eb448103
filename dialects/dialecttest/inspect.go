package dialecttest

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// inspectScenarios are Inspect's (dialects.Inspector): one row and where it stands.
var inspectScenarios = []scenario{
	{name: "EveryState", run: testInspectEveryState},
	{name: "RowLockCannotTellInWork", run: testInspectRowLock, applies: func(h Harness) bool { return h.Caps().RowLock }},
	{name: "Refusals", run: testInspectRefusals},
	{name: "DeadLetterReadsDead", run: testDeadLetterReadsDead},
}

func inspector(t *testing.T, d dialects.Dialect) dialects.Inspector {
	t.Helper()
	in, ok := d.(dialects.Inspector)
	if !ok {
		t.Fatalf("%T is not a dialects.Inspector", d)
	}
	return in
}

// Each row reads as it stands, every described column included, in the state Stats would
// count it in.
func testInspectEveryState(t *testing.T, h Harness) {
	e := setup(t, h)
	r := seedInspectStates(t, e, h)
	in := inspector(t, e.d)
	checkInspectedDue(t, inspectRow(t, in, r.tbl, r.due))
	checkInspectedOthers(t, in, r)
}

// inspectStates is a table with one row in each state, as seedInspectStates leaves it.
type inspectStates struct {
	tbl                             dialects.Table
	due, delayed, inWork, processed int64
	// later is the delayed row's retry_after, token the lease of the row in work.
	later, token time.Time
}

// seedInspectStates publishes a row in each state, claims two, and marks one processed.
func seedInspectStates(t *testing.T, e *env, h Harness) inspectStates {
	t.Helper()
	tbl := e.table("ra_insp", func(name string) dialects.Table {
		tb := leaseTable(name)
		tb.ProcessedAt, tb.Error = "processed_at", "error"
		return tb
	})
	r := inspectStates{tbl: tbl, later: t0.Add(time.Hour), token: t0.Add(30 * time.Second)}
	r.due = e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("due"), Headers: []byte(`{"k":"v"}`)})
	r.delayed = e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("delayed"), NotBefore: r.later})
	r.inWork = e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("in work")})
	r.processed = e.publish(tbl, dialects.Message{Group: "other", Payload: []byte("processed")})
	q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g"})
	e.exec("UPDATE "+e.q(tbl.Name)+" SET retry_after = ? WHERE id IN (?, ?)", h.TimeArg(r.later), r.delayed, r.due)
	e.exec("UPDATE "+e.q(tbl.Name)+" SET retry_after = NULL WHERE id = ?", r.due)
	// The claim takes the due rows of g in id order: due first, then in work (each one
	// attempt on: a row is published at attempt 1); due is released again with its error
	// kept, as a failed delivery leaves it.
	if rows, err := q.ClaimLeases(ctx, t0, r.token, 2); err != nil || len(rows) != 2 {
		t.Fatalf("claim: %v %v", ids(rows), err)
	}
	e.exec("UPDATE "+e.q(tbl.Name)+" SET locked_until = NULL, error = ? WHERE id = ?", "boom: the first try failed", r.due)
	e.exec("UPDATE "+e.q(tbl.Name)+" SET processed_at = ? WHERE id = ?", h.TimeArg(t0.Add(-time.Minute)), r.processed)
	return r
}

// inspectRow inspects row id at t0; it must read as that row, with rows in work counted.
func inspectRow(t *testing.T, in dialects.Inspector, tbl dialects.Table, id int64) dialects.Job {
	t.Helper()
	j, err := in.Inspect(ctx, tbl, id, t0)
	if err != nil {
		t.Fatalf("Inspect(%d): %v", id, err)
	}
	if j.ID != id || !j.InWorkCounted {
		t.Fatalf("Inspect(%d): id %d, InWorkCounted %v", id, j.ID, j.InWorkCounted)
	}
	return j
}

// checkInspectedDue checks the due row: every column as it stands, its error kept.
func checkInspectedDue(t *testing.T, j dialects.Job) {
	t.Helper()
	// Attempt is the calls made (dialects.AttemptsMade): one failed delivery.
	if j.State != dialects.JobDue || j.Group != "g" || j.NullGroup || j.Attempt != 1 || string(j.Payload) != "due" ||
		!bytes.Contains(j.Headers, []byte(`"k"`)) || j.Error != "boom: the first try failed" ||
		!j.LockedUntil.IsZero() || !j.RetryAfter.IsZero() || !j.ProcessedAt.IsZero() {
		t.Errorf("due row: %+v", j)
	}
}

// checkInspectedOthers checks the delayed, in work and processed rows, and the row in
// work once its lease has run out.
func checkInspectedOthers(t *testing.T, in dialects.Inspector, r inspectStates) {
	t.Helper()
	j := inspectRow(t, in, r.tbl, r.delayed)
	if j.State != dialects.JobDelayed || j.Attempt != 0 || string(j.Payload) != "delayed" || j.Error != "" {
		t.Errorf("delayed row: %+v", j)
	}
	sameTime(t, "the delayed row's retry_after", &j.RetryAfter, r.later)
	j = inspectRow(t, in, r.tbl, r.inWork)
	if j.State != dialects.JobInWork || j.Attempt != 1 { // the call under way
		t.Errorf("row in work: %+v", j)
	}
	sameTime(t, "the lease", &j.LockedUntil, r.token)
	// The same row once its lease has run out reads as due.
	if j, err := in.Inspect(ctx, r.tbl, r.inWork, r.token.Add(time.Second)); err != nil || j.State != dialects.JobDue {
		t.Errorf("row whose lease ran out: %+v, %v", j, err)
	}
	j = inspectRow(t, in, r.tbl, r.processed)
	if j.State != dialects.JobProcessed || j.Group != "other" {
		t.Errorf("processed row: %+v", j)
	}
	sameTime(t, "processed_at", &j.ProcessedAt, t0.Add(-time.Minute))
}

// The row lock form's locks cannot be listed: a row a claim holds reads as due, and the
// job says so.
func testInspectRowLock(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_inspr", rowLockTable)
	id := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	j, err := inspector(t, e.d).Inspect(ctx, tbl, id, t0)
	if err != nil || j.State != dialects.JobDue || j.InWorkCounted {
		t.Fatalf("row lock row: %+v, %v; want due with InWorkCounted false", j, err)
	}
}

// An id the table does not hold is ErrRowNotFound; a description the live table does not
// match is a *ConfigError, before any row is read; a table describing only its id and
// payload reads as due.
func testInspectRefusals(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_inspx", leaseTable)
	in := inspector(t, e.d)
	if _, err := in.Inspect(ctx, tbl, 12345, t0); !errors.Is(err, dialects.ErrRowNotFound) {
		t.Errorf("Inspect of a missing id: %v, want ErrRowNotFound", err)
	}
	wrong := tbl
	wrong.Error = "no_such_column"
	var ce *dialects.ConfigError
	if _, err := in.Inspect(ctx, wrong, 1, t0); !errors.As(err, &ce) {
		t.Errorf("Inspect with a column the table lacks: %v, want a *ConfigError", err)
	}
	bare := e.table("ra_inspb", func(name string) dialects.Table { return dialects.Table{Name: name, ID: "id", Payload: "payload"} })
	id := e.publish(bare, dialects.Message{Payload: []byte("p")})
	if j, err := in.Inspect(ctx, bare, id, t0); err != nil || j.State != dialects.JobDue || string(j.Payload) != "p" {
		t.Errorf("bare table's row: %+v, %v", j, err)
	}
}

// A dead letter in a group of its table reads as dead wherever the table describes
// DeadAt: Inspect's state and time of death, Stats' and QueueStats' counts (never due,
// delayed or the oldest due, whatever its retry_after), and the job list's state filter.
// Without DeadAt described the same rows read as due and delayed.
func testDeadLetterReadsDead(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_deadst", func(name string) dialects.Table {
		tb := deadTable(name)
		tb.ProcessedAt = "processed_at"
		return tb
	})
	dies := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("dies")})
	due := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("due")})
	// A dead letter whose retry_after is still ahead: the move leaves the column as the
	// failed delivery set it.
	later := e.publish(tbl, dialects.Message{Group: "dead", Payload: []byte("dead, delayed")})
	e.exec("UPDATE "+e.q(tbl.Name)+" SET dead_at = ?, retry_after = ? WHERE id = ?", h.TimeArg(t0.Add(-time.Minute)), h.TimeArg(t0.Add(time.Hour)), later)
	if id := DeadLetterOne(t, e.openLease(dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"})); id != dies {
		t.Fatalf("the move took row %d, want %d", id, dies)
	}
	in := inspector(t, e.d)
	j := inspectRow(t, in, tbl, dies)
	if j.State != dialects.JobDead || j.State.String() != "dead" || j.Group != "dead" {
		t.Errorf("the dead letter: %+v, want dead in group dead", j)
	}
	sameTime(t, "the dead letter's DeadAt", &j.DeadAt, t0)
	if j := inspectRow(t, in, tbl, later); j.State != dialects.JobDead {
		t.Errorf("the delayed dead letter: %+v, want dead", j)
	}
	if j := inspectRow(t, in, tbl, due); j.State != dialects.JobDue || !j.DeadAt.IsZero() {
		t.Errorf("the queue's row: %+v, want due", j)
	}
	checkDeadCounts(t, e, tbl, due)
	l := e.d.(dialects.JobLister)
	for _, c := range []struct {
		name string
		f    dialects.JobFilter
		want []int64
	}{
		{"dead", dialects.JobFilter{States: []dialects.JobState{dialects.JobDead}}, []int64{dies, later}},
		{"dead of group dead", dialects.JobFilter{Group: "dead", HasGroup: true, States: []dialects.JobState{dialects.JobDead}}, []int64{dies, later}},
		{"due or delayed of group dead", dialects.JobFilter{Group: "dead", HasGroup: true, States: []dialects.JobState{dialects.JobDue, dialects.JobDelayed}}, nil},
		{"due", dialects.JobFilter{States: []dialects.JobState{dialects.JobDue}}, []int64{due}},
	} {
		jobs, err := l.ListJobs(ctx, tbl, c.f, t0)
		if err != nil {
			t.Fatalf("ListJobs %s: %v", c.name, err)
		}
		var got []int64
		for _, j := range jobs {
			got = append(got, j.ID)
			if j.ID == dies && !j.DeadAt.Equal(stored(t0)) {
				t.Errorf("ListJobs %s: row %d's DeadAt %v, want %v", c.name, j.ID, j.DeadAt, stored(t0))
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("ListJobs %s: %v, want %v", c.name, got, c.want)
		}
	}
	// Without DeadAt described, nothing tells a dead row.
	blind := tbl
	blind.DeadAt = ""
	if j, err := in.Inspect(ctx, blind, dies, t0); err != nil || j.State != dialects.JobDue {
		t.Errorf("the dead letter without DeadAt described: %+v, %v; want due", j, err)
	}
	stats, err := e.d.(dialects.Admin).Stats(ctx, blind, t0)
	if err != nil || len(stats) != 2 || stats[0].Group != "dead" || stats[0].Due != 1 || stats[0].Delayed != 1 || stats[0].Dead != 0 {
		t.Errorf("Stats without DeadAt described: %+v, %v; want group dead with 1 due and 1 delayed", stats, err)
	}
}

// checkDeadCounts checks Stats and QueueStats of testDeadLetterReadsDead's table: group
// dead holds two dead rows and nothing due, group g the due row, the oldest due.
func checkDeadCounts(t *testing.T, e *env, tbl dialects.Table, due int64) {
	t.Helper()
	stats, err := e.d.(dialects.Admin).Stats(ctx, tbl, t0)
	if err != nil {
		t.Fatal(err)
	}
	queue, err := e.d.(dialects.QueueCounter).QueueStats(ctx, tbl, t0)
	if err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string][]dialects.GroupStats{"Stats": stats, "QueueStats": queue} {
		if len(got) != 2 || got[0].Group != "dead" || got[1].Group != "g" {
			t.Fatalf("%s: %+v, want groups dead and g", name, got)
		}
		if d := got[0]; d.Dead != 2 || d.Due != 0 || d.Delayed != 0 || d.InWork != 0 || d.Oldest.ID != 0 {
			t.Errorf("%s of group dead: %+v, want 2 dead and nothing due", name, d)
		}
		if g := got[1]; g.Dead != 0 || g.Due != 1 || g.Oldest.ID != due {
			t.Errorf("%s of group g: %+v, want row %d due and the oldest", name, g, due)
		}
	}
}
