package sqlite

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// eventForm is one way a delivery settles: a claim form, transactional or not.
type eventForm struct {
	name  string
	form  dialects.Form
	shape func(string) dialects.Table
	tx    bool
}

var eventForms = []eventForm{
	{"lease", dialects.FormLease, leaseTable, false},
	{"lease_tx", dialects.FormLease, leaseTable, true},
	{"advisory", dialects.FormAdvisory, groupedAdvisoryTable, false},
	{"advisory_tx", dialects.FormAdvisory, groupedAdvisoryTable, true},
}

func groupedAdvisoryTable(name string) dialects.Table {
	return dialects.Table{Name: name, ID: "id", Payload: "payload", Group: "grp", Attempt: "attempt",
		RetryAfter: "retry_after", AdvisoryKey: name + "-{id}"}
}

// unlease is the SET clause an event returning a lease-form row adds.
func (f eventForm) unlease() string {
	if f.form == dialects.FormLease {
		return ", locked_until = NULL"
	}
	return ""
}

// eventFixture is a queue of form f on table jobs with an extra last_error column, the
// handler's table notes, and one row published to group g.
type eventFixture struct {
	f   eventForm
	d   *Dialect
	tbl dialects.Table
	q   dialects.Queue
	id  int64
}

func newEventFixture(t *testing.T, f eventForm, events map[string]string) *eventFixture {
	t.Helper()
	d := newDialect(t)
	tbl := f.shape("jobs")
	txFixture(t, d, tbl)
	mustExec(t, d, "ALTER TABLE jobs ADD COLUMN last_error TEXT")
	q, err := d.Open(ctx, dialects.QueueSpec{Table: tbl, Group: "g", Events: events, Transactional: f.tx})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	id := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	return &eventFixture{f: f, d: d, tbl: tbl, q: q, id: id}
}

// settle claims the fixture's row as of t0 and settles it with step; a transactional
// delivery writes a note first. ok is false when the lease form reports the lease lost.
func (e *eventFixture) settle(t *testing.T, step dialects.Step) (ok bool, err error) {
	t.Helper()
	if e.f.form == dialects.FormLease {
		q := e.q.(dialects.LeaseQueue)
		rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
		if err != nil || len(rows) != 1 {
			t.Fatalf("claim: %v %v", rows, err)
		}
		held := dialects.Lease{ID: rows[0].ID, Token: rows[0].Token}
		if e.f.tx {
			ltx, tx := beginLease(t, q)
			note(t, tx, fmt.Sprint(held.ID))
			return ltx.SettleLease(ctx, step, held)
		}
		return q.SettleLease(ctx, step, held)
	}
	q := e.q.(dialects.AdvisoryQueue)
	cands, err := q.Candidates(ctx, t0, 1)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates: %v %v", cands, err)
	}
	s := newSession(t, q)
	defer s.Abort(ctx)
	if !tryLock(t, s, cands[0].Key) {
		t.Fatal("lock refused")
	}
	if _, ok, err := s.Take(ctx, cands[0].ID, t0); !ok || err != nil {
		t.Fatalf("take %v %v", ok, err)
	}
	if !e.f.tx {
		return true, s.Settle(ctx, step, cands[0].ID)
	}
	ts := s.(dialects.TxSession)
	if err := ts.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	note(t, ts.Tx().(*sql.Tx), fmt.Sprint(cands[0].ID))
	if err := s.Settle(ctx, step, cands[0].ID); err != nil {
		return true, err
	}
	return true, ts.Commit(ctx)
}

// claimable reports whether the form would deliver a row of group g as of at (a lease
// claim stamps it).
func (e *eventFixture) claimable(t *testing.T, at time.Time) bool {
	t.Helper()
	if e.f.form == dialects.FormLease {
		rows, err := e.q.(dialects.LeaseQueue).ClaimLeases(ctx, at, at.Add(time.Minute), 10)
		if err != nil {
			t.Fatal(err)
		}
		return len(rows) > 0
	}
	cands, err := e.q.(dialects.AdvisoryQueue).Candidates(ctx, at, 10)
	if err != nil {
		t.Fatal(err)
	}
	return len(cands) > 0
}

// evState is the row as stored, NULL reading as "NULL".
type evState struct {
	found                                     bool
	Group, LastError, RetryAfter, LockedUntil string
	Attempt                                   int
}

func (e *eventFixture) state(t *testing.T) evState {
	t.Helper()
	return eventState(t, e.d, e.f.form == dialects.FormLease, e.id)
}

func eventState(t *testing.T, d *Dialect, lease bool, id int64) evState {
	t.Helper()
	lu := "'NULL'"
	if lease {
		lu = "ifnull(locked_until, 'NULL')"
	}
	s := evState{found: true}
	err := d.DB().QueryRowContext(ctx, "SELECT grp, ifnull(last_error, 'NULL'), ifnull(retry_after, 'NULL'), "+lu+
		", attempt FROM jobs WHERE id = ?", id).Scan(&s.Group, &s.LastError, &s.RetryAfter, &s.LockedUntil, &s.Attempt)
	if errors.Is(err, sql.ErrNoRows) {
		return evState{}
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkNote fails unless a transactional delivery's note committed with its event.
func (e *eventFixture) checkNote(t *testing.T) {
	t.Helper()
	if e.f.tx && count(t, e.d, "SELECT count(*) FROM notes WHERE v = ?", fmt.Sprint(e.id)) != 1 {
		t.Error("the handler's write did not commit with the event")
	}
}

// An ack event that moves the row to another group instead of deleting it runs in place
// of the built-in ack: the row stays, in group done, and is no longer claimable.
func TestEventAckMovesRow(t *testing.T) {
	for _, f := range eventForms {
		t.Run(f.name, func(t *testing.T) {
			e := newEventFixture(t, f, map[string]string{
				dialects.EventAck: "UPDATE jobs SET grp = 'done' WHERE id = {id}",
			})
			ok, err := e.settle(t, dialects.Step{Kind: dialects.StepAck, Now: t0, Event: dialects.EventAck})
			if !ok || err != nil {
				t.Fatalf("settle: %v %v", ok, err)
			}
			if s := e.state(t); !s.found || s.Group != "done" {
				t.Fatalf("row %+v, want it in group done", s)
			}
			e.checkNote(t)
			// Past the lease, too: only the group keeps the row out.
			if e.claimable(t, t0.Add(2*time.Minute)) {
				t.Error("the row moved away is still claimable")
			}
		})
	}
}

// A retry event records the handler's error in an extra column and returns the row; the
// advisory form's retry, which otherwise writes nothing, runs it.
func TestEventRetryRecordsError(t *testing.T) {
	const reason = `boom: it's "quoted"`
	for _, f := range eventForms {
		t.Run(f.name, func(t *testing.T) {
			e := newEventFixture(t, f, map[string]string{
				dialects.EventRetry: "UPDATE jobs SET last_error = {error}" + f.unlease() + " WHERE id = {id}",
			})
			ok, err := e.settle(t, dialects.Step{Kind: dialects.StepRetry, Now: t0, Event: dialects.EventRetry, Error: reason})
			if !ok || err != nil {
				t.Fatalf("settle: %v %v", ok, err)
			}
			if s := e.state(t); s.LastError != reason || s.Group != "g" || s.LockedUntil != "NULL" {
				t.Errorf("row %+v", s)
			}
			e.checkNote(t)
			if !e.claimable(t, t0) {
				t.Error("the retried row is not claimable")
			}
		})
	}
}

// A custom event binds the handler's values to {arg1}, {arg2} (each occurrence of its
// own), and {group}, {attempt}, and times ({now}, a time among the values) in TimeLayout.
func TestEventCustom(t *testing.T) {
	for _, f := range eventForms {
		t.Run(f.name, func(t *testing.T) {
			e := newEventFixture(t, f, map[string]string{
				"park": "UPDATE jobs SET last_error = {arg1} || '/' || {group} || '/' || {attempt} || '/' || {arg1} || '/' || {now}, " +
					"grp = {arg2}, retry_after = {arg3}" + f.unlease() + " WHERE id = {id}",
			})
			later := t0.Add(time.Hour)
			step := dialects.Step{Kind: dialects.StepCustom, Now: t0, Event: "park", Attempt: 3, Args: []any{"note", "parked", later}}
			ok, err := e.settle(t, step)
			if !ok || err != nil {
				t.Fatalf("settle: %v %v", ok, err)
			}
			s := e.state(t)
			if want := "note/g/3/note/" + formatTime(t0); s.LastError != want {
				t.Errorf("last_error %q, want %q", s.LastError, want)
			}
			if s.Group != "parked" || s.RetryAfter != formatTime(later) {
				t.Errorf("row %+v", s)
			}
			e.checkNote(t)
			// The stored time compares as a time: the row is due after later only.
			if f.form == dialects.FormAdvisory {
				mustExec(t, e.d, "UPDATE jobs SET grp = 'g'")
				if e.claimable(t, later.Add(-time.Microsecond)) || !e.claimable(t, later) {
					t.Error("retry_after written by the event does not compare as a time")
				}
			}
		})
	}
}

// A step naming an event the subscription lacks, or a custom event given too few values,
// fails before anything runs.
func TestEventBadStep(t *testing.T) {
	for _, f := range eventForms {
		t.Run(f.name, func(t *testing.T) {
			e := newEventFixture(t, f, map[string]string{"park": "UPDATE jobs SET grp = {arg2} WHERE id = {id}"})
			for _, step := range []dialects.Step{
				{Kind: dialects.StepCustom, Event: "park", Args: []any{"one"}},
				{Kind: dialects.StepCustom, Event: "nope"},
			} {
				if _, err := e.settle(t, step); err == nil || !strings.Contains(err.Error(), "event") {
					t.Errorf("step %+v: %v", step, err)
				}
				if s := e.state(t); s.Group != "g" {
					t.Errorf("row %+v", s)
				}
				// The failed settlement left the lease: free the row for the next claim.
				if f.form == dialects.FormLease {
					mustExec(t, e.d, "UPDATE jobs SET locked_until = NULL")
				}
			}
		})
	}
}

// The lease form's event runs only while the row holds the delivery's token: a stale
// token (or a row gone) reports false with nothing run, and in a transactional delivery
// the handler's writes roll back with it.
func TestEventLeaseLost(t *testing.T) {
	for _, tx := range []bool{false, true} {
		t.Run(fmt.Sprint("tx=", tx), func(t *testing.T) {
			d := newDialect(t)
			tbl := leaseTable("jobs")
			txFixture(t, d, tbl)
			mustExec(t, d, "ALTER TABLE jobs ADD COLUMN last_error TEXT")
			q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Transactional: tx, Events: map[string]string{
				dialects.EventAck: "UPDATE jobs SET grp = 'done', last_error = 'ran' WHERE id = {id}",
			}})
			held := claimOne(t, d, q, tbl)
			before := eventState(t, d, true, held.ID)
			step := dialects.Step{Kind: dialects.StepAck, Now: t0, Event: dialects.EventAck}
			settle := func(l dialects.Lease) (bool, error) {
				if !tx {
					return q.SettleLease(ctx, step, l)
				}
				ltx, sqlTx := beginLease(t, q)
				note(t, sqlTx, "handler")
				return ltx.SettleLease(ctx, step, l)
			}

			stale := held
			stale.Token = held.Token.Add(-time.Second)
			if ok, err := settle(stale); ok || err != nil {
				t.Fatalf("stale settlement: %v %v", ok, err)
			}
			if after := eventState(t, d, true, held.ID); after != before {
				t.Fatalf("a stale settlement changed the row: %+v, was %+v", after, before)
			}
			if ok, err := settle(dialects.Lease{ID: held.ID + 1000, Token: held.Token}); ok || err != nil {
				t.Fatalf("settlement of a missing row: %v %v", ok, err)
			}
			if notes(t, d) != 0 {
				t.Error("a lost lease committed the handler's write")
			}

			if ok, err := settle(held); !ok || err != nil {
				t.Fatalf("settle: %v %v", ok, err)
			}
			if s := eventState(t, d, true, held.ID); s.Group != "done" || s.LastError != "ran" {
				t.Errorf("row %+v", s)
			}
			if tx && notes(t, d) != 1 {
				t.Error("the handler's write did not commit with the event")
			}
		})
	}
}

// A deferred delivery's event settlement waits for the write lock another connection
// holds, as the built-in settlement would: its confirmation is a write, where the busy
// handler waits (a read first would make the event's write fail at once with
// SQLITE_BUSY).
func TestEventLeaseTxWaitsForTheWriteLock(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
	txFixture(t, d, tbl)
	mustExec(t, d, "ALTER TABLE jobs ADD COLUMN last_error TEXT")
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true, Events: map[string]string{
		"park": "UPDATE jobs SET grp = 'parked', locked_until = NULL WHERE id = {id}",
	}})
	held := claimOne(t, d, q, tbl)
	ltx, _ := beginLease(t, q)

	other, err := d.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		_, err := other.ExecContext(ctx, "COMMIT")
		released <- err
	}()
	ok, err := ltx.SettleLease(ctx, dialects.Step{Kind: dialects.StepCustom, Now: t0, Event: "park"}, held)
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if !ok || err != nil {
		t.Fatalf("settle while another connection held the write lock: %v %v", ok, err)
	}
	if s := eventState(t, d, true, held.ID); s.Group != "parked" || s.LockedUntil != "NULL" {
		t.Errorf("row %+v", s)
	}
}

// A delivery's event does not wait for this process's writer turn (txn.go says why): here
// a claim holds the turn while it waits for the write lock the delivery holds.
func TestEventLeaseTxSkipsWriterTurn(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
	tbl.Mode = dialects.Immediate
	txFixture(t, d, tbl)
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true, Events: map[string]string{
		dialects.EventAck: "UPDATE jobs SET grp = 'done' WHERE id = {id}",
	}})
	r := claimOne(t, d, q, tbl)
	publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("second")})

	ltx, tx := beginLease(t, q)
	note(t, tx, "x")
	claimed := make(chan error, 1)
	go func() {
		_, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
		claimed <- err
	}()
	f, _ := d.fileEntry(ctx)
	for deadline := time.Now().Add(5 * time.Second); len(f.writer) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the claim never took the writer turn")
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	if ok, err := ltx.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0, Event: dialects.EventAck}, r); err != nil || !ok {
		t.Fatalf("settle: %v %v", ok, err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the settlement waited %v", took)
	}
	if err := <-claimed; err != nil {
		t.Errorf("the claim waiting for the delivery failed: %v", err)
	}
}

// An extend event replaces the lease extension: it runs per lease, with times bound in
// TimeLayout, and the leases whose statement changed a row are the ones moved.
func TestEventExtend(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
	createTable(t, d, tbl)
	mustExec(t, d, "ALTER TABLE jobs ADD COLUMN last_error TEXT")
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Events: map[string]string{
		dialects.EventExtend: "UPDATE jobs SET locked_until = {until}, last_error = 'extended' WHERE id = {id} AND locked_until = {held}",
	}})
	a := claimOne(t, d, q, tbl)
	b := claimOne(t, d, q, tbl)
	until := t0.Add(5 * time.Minute)
	stale := dialects.Lease{ID: b.ID, Token: b.Token.Add(-time.Second)}
	moved, err := q.ExtendLeases(ctx, until, []dialects.Lease{a, stale})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(moved, []int64{a.ID}) {
		t.Fatalf("moved %v, want only %d", moved, a.ID)
	}
	if s := eventState(t, d, true, a.ID); s.LockedUntil != formatTime(until) || s.LastError != "extended" {
		t.Errorf("extended row %+v", s)
	}
	if s := eventState(t, d, true, b.ID); s.LockedUntil != formatTime(b.Token) || s.LastError != "NULL" {
		t.Errorf("stale row %+v", s)
	}
	// The moved lease settles with its new token.
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, dialects.Lease{ID: a.ID, Token: until}); !ok || err != nil {
		t.Errorf("settle with the extended token: %v %v", ok, err)
	}
}

// An event that does not compile, or does not prepare against the file, is refused at
// Open with a *ConfigError naming the event.
func TestEventRefused(t *testing.T) {
	d := newDialect(t)
	createTable(t, d, leaseTable("jobs"))
	createTable(t, d, groupedAdvisoryTable("keyed"))
	cases := []struct {
		name, event, sql string
		tbl              dialects.Table
		reason           string
	}{
		{"missing column", dialects.EventAck, "UPDATE jobs SET nope = 1 WHERE id = {id}", leaseTable("jobs"), "does not prepare"},
		{"missing table", "park", "DELETE FROM no_such_table WHERE id = {id}", groupedAdvisoryTable("keyed"), "does not prepare"},
		{"syntax", dialects.EventRetry, "UPDAT jobs SET grp = 'x' WHERE id = {id}", leaseTable("jobs"), "does not prepare"},
		{"unknown placeholder", dialects.EventAck, "UPDATE jobs SET grp = {nope} WHERE id = {id}", leaseTable("jobs"), "{nope}"},
		{"no id", dialects.EventDrop, "DELETE FROM jobs", leaseTable("jobs"), "{id}"},
		{"extend without a lease", dialects.EventExtend, "UPDATE keyed SET grp = 'x' WHERE id = {id}", groupedAdvisoryTable("keyed"), "lease form"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := d.Open(ctx, dialects.QueueSpec{Table: c.tbl, Group: "g", Events: map[string]string{
				"fine":  "UPDATE " + c.tbl.Name + " SET grp = 'x' WHERE id = {id}",
				c.event: c.sql,
			}})
			ce := configError(t, err)
			if want := fmt.Sprintf("OnEvent(%q)", c.event); ce.Option != want {
				t.Errorf("option %q, want %q (%v)", ce.Option, want, err)
			}
			contains(t, err.Error(), c.reason)
		})
	}
}
