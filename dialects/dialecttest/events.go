package dialecttest

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

// eventScenarios are a subscription's own statements run in place of the built-in
// settlements (QueueSpec.Events), in every form, transactional or not.
var eventScenarios = []scenario{
	{name: "EventAckMovesRow", run: testEventAckMovesRow},
	{name: "EventRetryRecordsError", run: testEventRetryRecordsError},
	{name: "EventCustom", run: testEventCustom},
	{name: "EventBadStep", run: testEventBadStep},
	{name: "EventLeaseLost", run: testEventLeaseLost},
	{name: "EventExtend", run: testEventExtend},
	{name: "EventRefused", run: testEventRefused},
}

// eventForm is one way a delivery settles: a claim form, transactional or not.
type eventForm struct {
	name  string
	form  dialects.Form
	shape func(string) dialects.Table
	tx    bool
}

func eventForms(h Harness) []eventForm {
	var forms []eventForm
	if h.Caps().RowLock {
		forms = append(forms, eventForm{"rowlock", dialects.FormRowLock, rowLockTable, false},
			eventForm{"rowlock_tx", dialects.FormRowLock, rowLockTable, true})
	}
	return append(forms,
		eventForm{"lease", dialects.FormLease, leaseTable, false},
		eventForm{"lease_tx", dialects.FormLease, leaseTable, true},
		eventForm{"advisory", dialects.FormAdvisory, groupedAdvisoryTable, false},
		eventForm{"advisory_tx", dialects.FormAdvisory, groupedAdvisoryTable, true})
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

// eventFixture is a queue of form f on a fresh table with an extra last_error column, a
// table for the handler's writes, and one row published to group g.
type eventFixture struct {
	*env
	f   eventForm
	tbl dialects.Table
	qu  dialects.Queue
	fx  string
	id  int64
}

// withLastError creates a table of shape with an extra last_error column.
func (e *env) withLastError(prefix string, shape func(string) dialects.Table) dialects.Table {
	e.t.Helper()
	tbl := e.table(prefix, shape)
	e.exec("ALTER TABLE " + e.q(tbl.Name) + " ADD COLUMN last_error " + e.caps.Types.Text + " NULL")
	return tbl
}

// effects creates the table a handler writes to through its lent transaction.
func (e *env) effects() string {
	e.t.Helper()
	name := e.name("ra_fx")
	e.exec("CREATE TABLE " + e.q(name) + " (id " + e.caps.Types.Int + " PRIMARY KEY, v " + e.caps.Types.Text + " NOT NULL)")
	return name
}

// handlerWrite is a handler's write through its transaction: row id of the effects table.
func (e *env) handlerWrite(dt dialects.DeliveryTx, fx string, id int64) {
	e.t.Helper()
	if dt.Tx() == nil {
		e.t.Fatalf("%T lends no transaction", dt)
	}
	if err := e.h.LentTry(dt.Tx(), "INSERT INTO "+e.q(fx)+" (id, v) VALUES (?, 'handler')", id); err != nil {
		e.t.Fatal(err)
	}
}

// committed reports whether the handler's write of id is visible outside its transaction.
func (e *env) committed(fx string, id int64) bool {
	e.t.Helper()
	return e.count("SELECT COUNT(*) FROM "+e.q(fx)+" WHERE id = ?", id) == 1
}

// newEventFixture renders each event's SQL with %[1]s as the quoted table name.
func newEventFixture(t *testing.T, h Harness, f eventForm, events func(table string) map[string]string) *eventFixture {
	t.Helper()
	e := setup(t, h)
	tbl := e.withLastError("ra_ev", f.shape)
	q := e.open(dialects.QueueSpec{Table: tbl, Group: "g", Events: events(e.q(tbl.Name)), Transactional: f.tx})
	id := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	return &eventFixture{env: e, f: f, tbl: tbl, qu: q, fx: e.effects(), id: id}
}

// settle claims the fixture's row as of t0 and settles it with step; a transactional
// delivery writes to the effects table first. ok is false when the lease form reports the
// lease lost.
func (x *eventFixture) settle(step dialects.Step) (ok bool, err error) {
	t := x.t
	t.Helper()
	switch x.f.form {
	case dialects.FormRowLock:
		c := claimLocked(t, x.qu.(dialects.RowLockQueue), t0)
		t.Cleanup(func() { c.Rollback(ctx) })
		if x.f.tx {
			tc, ok := c.(dialects.TxLockedClaim)
			if !ok {
				t.Fatalf("a transactional claim is %T, not a TxLockedClaim", c)
			}
			if err := tc.Savepoint(ctx); err != nil {
				t.Fatal(err)
			}
			x.handlerWrite(tc, x.fx, c.Row().ID)
		}
		return true, c.Settle(ctx, step)
	case dialects.FormLease:
		q := x.qu.(dialects.LeaseQueue)
		rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
		if err != nil || len(rows) != 1 {
			t.Fatalf("claim: %v %v", ids(rows), err)
		}
		held := dialects.Lease{ID: rows[0].ID, Token: rows[0].Token}
		if x.f.tx {
			tx := x.beginDelivery(q)
			x.handlerWrite(tx, x.fx, held.ID)
			return tx.SettleLease(ctx, step, held)
		}
		return q.SettleLease(ctx, step, held)
	}
	q := x.qu.(dialects.AdvisoryQueue)
	cands, err := q.Candidates(ctx, t0, 1)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates: %v %v", cands, err)
	}
	s := x.session(q)
	if !tryLock(t, s, cands[0].Key) {
		t.Fatal("lock refused")
	}
	if _, ok, err := s.Take(ctx, cands[0].ID, t0); !ok || err != nil {
		t.Fatalf("take %v %v", ok, err)
	}
	if x.f.tx {
		ts := s.(dialects.TxSession)
		if err := ts.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		x.handlerWrite(ts, x.fx, cands[0].ID)
		err = s.Settle(ctx, step, cands[0].ID)
		if err == nil {
			err = ts.Commit(ctx)
		}
	} else {
		err = s.Settle(ctx, step, cands[0].ID)
	}
	if err != nil {
		// A failed settlement leaves the key to the delivery's end.
		s.Abort(ctx)
		return true, err
	}
	if _, err := s.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	return true, nil
}

// beginDelivery opens a lease delivery's transaction, rolled back when the test ends.
func (e *env) beginDelivery(q dialects.LeaseQueue) dialects.LeaseTx {
	e.t.Helper()
	tq, ok := q.(dialects.TxLeaseQueue)
	if !ok {
		e.t.Fatalf("%T is not a TxLeaseQueue", q)
	}
	tx, err := tq.BeginDelivery(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { tx.Rollback(ctx) })
	return tx
}

// claimable reports whether the form would deliver a row of group g as of at (a lease
// claim stamps it).
func (x *eventFixture) claimable(at time.Time) bool {
	t := x.t
	t.Helper()
	switch x.f.form {
	case dialects.FormRowLock:
		c, ok, err := x.qu.(dialects.RowLockQueue).ClaimLocked(ctx, at)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			c.Rollback(ctx)
		}
		return ok
	case dialects.FormLease:
		rows, err := x.qu.(dialects.LeaseQueue).ClaimLeases(ctx, at, at.Add(time.Minute), 10)
		if err != nil {
			t.Fatal(err)
		}
		return len(rows) > 0
	}
	cands, err := x.qu.(dialects.AdvisoryQueue).Candidates(ctx, at, 10)
	if err != nil {
		t.Fatal(err)
	}
	return len(cands) > 0
}

func (e *env) lastError(tbl dialects.Table, id int64) sql.NullString {
	e.t.Helper()
	var s sql.NullString
	if !e.h.QueryRow(e.t, e.d, "SELECT last_error FROM "+e.q(tbl.Name)+" WHERE id = ?", []any{id}, &s) {
		e.t.Fatalf("no row %d", id)
	}
	return s
}

// checkHandlerWrite fails unless a transactional delivery's write committed with its event.
func (x *eventFixture) checkHandlerWrite() {
	x.t.Helper()
	if x.f.tx && !x.committed(x.fx, x.id) {
		x.t.Error("the handler's write did not commit with the event")
	}
}

// An ack event that moves the row to another group instead of deleting it runs in place
// of the built-in ack, in every form: the row stays, in group done, and is no longer
// claimable.
func testEventAckMovesRow(t *testing.T, h Harness) {
	for _, f := range eventForms(h) {
		t.Run(f.name, func(t *testing.T) {
			x := newEventFixture(t, h, f, func(table string) map[string]string {
				return map[string]string{dialects.EventAck: "UPDATE " + table + " SET grp = 'done' WHERE id = {id}"}
			})
			ok, err := x.settle(dialects.Step{Kind: dialects.StepAck, Now: t0, Event: dialects.EventAck})
			if !ok || err != nil {
				t.Fatalf("settle: %v %v", ok, err)
			}
			s, found := x.state(x.tbl, x.id)
			if !found || s.Group != "done" {
				t.Fatalf("row %+v found %v, want it in group done", s, found)
			}
			x.checkHandlerWrite()
			// Past the lease, too: only the group keeps the row out.
			if x.claimable(t0.Add(2 * time.Minute)) {
				t.Error("the row moved away is still claimable")
			}
		})
	}
}

// A retry event records the handler's error in an extra column and returns the row, in
// place of the built-in retry: the row lock form's retry no longer counts the attempt,
// and the advisory form's, which otherwise writes nothing, runs it.
func testEventRetryRecordsError(t *testing.T, h Harness) {
	const reason = `boom: it's "quoted" \ and long`
	for _, f := range eventForms(h) {
		t.Run(f.name, func(t *testing.T) {
			x := newEventFixture(t, h, f, func(table string) map[string]string {
				return map[string]string{dialects.EventRetry: "UPDATE " + table + " SET last_error = {error}" + f.unlease() + " WHERE id = {id}"}
			})
			before, _ := x.state(x.tbl, x.id)
			ok, err := x.settle(dialects.Step{Kind: dialects.StepRetry, Now: t0, Event: dialects.EventRetry, Error: reason})
			if !ok || err != nil {
				t.Fatalf("settle: %v %v", ok, err)
			}
			if got := x.lastError(x.tbl, x.id); got.String != reason {
				t.Errorf("last_error %q, want %q", got.String, reason)
			}
			s, found := x.state(x.tbl, x.id)
			if !found || s.Group != "g" || s.LockedUntil != nil {
				t.Fatalf("row %+v found %v", s, found)
			}
			if f.form == dialects.FormRowLock && s.Attempt != before.Attempt {
				t.Errorf("attempt %d, was %d: the built-in retry ran too", s.Attempt, before.Attempt)
			}
			x.checkHandlerWrite()
			if !x.claimable(t0) {
				t.Error("the retried row is not claimable")
			}
		})
	}
}

// A custom event binds the handler's values to {arg1}, {arg2}, ... (each occurrence of
// its own), and {group}, {attempt} and {now} as the dialect binds them; a time among the
// values is stored as a time the claims compare (and {now} reads as Caps.NowText where a
// time binds as text).
func testEventCustom(t *testing.T, h Harness) {
	concat := h.Caps().Concat
	for _, f := range eventForms(h) {
		t.Run(f.name, func(t *testing.T) {
			x := newEventFixture(t, h, f, func(table string) map[string]string {
				return map[string]string{"park": "UPDATE " + table + " SET last_error = " +
					concat("{arg1}", "'/'", "{group}", "'/'", "{attempt}", "'/'", "{arg1}") + ", grp = {arg2}, " +
					"retry_after = {now}" + f.unlease() + " WHERE id = {id}"}
			})
			step := dialects.Step{Kind: dialects.StepCustom, Now: t0, Event: "park", Attempt: 3, Args: []any{"note", "parked"}}
			ok, err := x.settle(step)
			if !ok || err != nil {
				t.Fatalf("settle: %v %v", ok, err)
			}
			if got := x.lastError(x.tbl, x.id); got.String != "note/g/3/note" {
				t.Errorf("last_error %q", got.String)
			}
			s, _ := x.state(x.tbl, x.id)
			if s.Group != "parked" {
				t.Errorf("group %q", s.Group)
			}
			sameTime(t, "retry_after", s.RetryAfter, t0)
			x.checkHandlerWrite()

			// A time among the values.
			nowText := h.Caps().NowText
			later := t0.Add(time.Hour)
			y := newEventFixture(t, h, f, func(table string) map[string]string {
				set := "grp = {arg2}, retry_after = {arg3}"
				if nowText != nil {
					set += ", last_error = {now}"
				}
				return map[string]string{"park": "UPDATE " + table + " SET " + set + f.unlease() + " WHERE id = {id}"}
			})
			step.Args = []any{"note", "parked", later}
			if ok, err := y.settle(step); !ok || err != nil {
				t.Fatalf("settle with a time value: %v %v", ok, err)
			}
			s, _ = y.state(y.tbl, y.id)
			sameTime(t, "retry_after bound from a value", s.RetryAfter, later)
			if nowText != nil {
				if got := y.lastError(y.tbl, y.id); got.String != nowText(t0) {
					t.Errorf("{now} stored as %q, want %q", got.String, nowText(t0))
				}
			}
			y.checkHandlerWrite()
			// The stored time compares as a time: the row is due from later only.
			if f.form == dialects.FormAdvisory {
				y.exec("UPDATE " + y.q(y.tbl.Name) + " SET grp = 'g'")
				if y.claimable(later.Add(-time.Microsecond)) || !y.claimable(later) {
					t.Error("retry_after written by the event does not compare as a time")
				}
			}
		})
	}
}

// A step naming an event the subscription lacks, or a custom event given too few values,
// fails before anything runs.
func testEventBadStep(t *testing.T, h Harness) {
	for _, f := range eventForms(h) {
		t.Run(f.name, func(t *testing.T) {
			x := newEventFixture(t, h, f, func(table string) map[string]string {
				return map[string]string{"park": "UPDATE " + table + " SET grp = {arg2} WHERE id = {id}"}
			})
			for _, step := range []dialects.Step{
				{Kind: dialects.StepCustom, Event: "park", Args: []any{"one"}},
				{Kind: dialects.StepCustom, Event: "nope"},
			} {
				if _, err := x.settle(step); err == nil || !strings.Contains(err.Error(), "event") {
					t.Errorf("step %+v: %v", step, err)
				}
				if s, found := x.state(x.tbl, x.id); !found || s.Group != "g" {
					t.Errorf("row %+v found %v", s, found)
				}
				if f.form == dialects.FormLease {
					// The failed settlement left the lease: free the row for the next claim.
					x.exec("UPDATE " + x.q(x.tbl.Name) + " SET locked_until = NULL")
				}
			}
		})
	}
}

// The lease form's event runs only while the row holds the delivery's token: a stale
// token (or a row gone) reports false with nothing run, and in a transactional delivery
// the handler's writes roll back with it.
func testEventLeaseLost(t *testing.T, h Harness) {
	for _, tx := range []bool{false, true} {
		t.Run(fmt.Sprint("tx=", tx), func(t *testing.T) {
			e := setup(t, h)
			tbl := e.withLastError("ra_evlost", leaseTable)
			fx := e.effects()
			q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g", Transactional: tx, Events: map[string]string{
				dialects.EventAck: "UPDATE " + e.q(tbl.Name) + " SET grp = 'done', last_error = 'ran' WHERE id = {id}",
			}})
			held := e.claimOne(q, tbl)
			before, _ := e.state(tbl, held.ID)
			step := dialects.Step{Kind: dialects.StepAck, Now: t0, Event: dialects.EventAck}
			settle := func(l dialects.Lease, fxID int64) (bool, error) {
				if !tx {
					return q.SettleLease(ctx, step, l)
				}
				ltx := e.beginDelivery(q)
				e.handlerWrite(ltx, fx, fxID)
				return ltx.SettleLease(ctx, step, l)
			}

			stale := held
			stale.Token = held.Token.Add(-time.Second)
			if ok, err := settle(stale, 1); ok || err != nil {
				t.Fatalf("stale settlement: %v %v", ok, err)
			}
			if after, found := e.state(tbl, held.ID); !found || !sameState(before, after) {
				t.Fatalf("a stale settlement changed the row: %+v, was %+v", after, before)
			}
			if n := e.count("SELECT COUNT(*) FROM " + e.q(tbl.Name) + " WHERE last_error IS NOT NULL"); n != 0 {
				t.Error("the event ran for a stale token")
			}
			if ok, err := settle(dialects.Lease{ID: held.ID + 1000, Token: held.Token}, 2); ok || err != nil {
				t.Fatalf("settlement of a missing row: %v %v", ok, err)
			}
			if e.committed(fx, 1) || e.committed(fx, 2) {
				t.Error("a lost lease committed the handler's write")
			}

			if ok, err := settle(held, 3); !ok || err != nil {
				t.Fatalf("settle: %v %v", ok, err)
			}
			if s, _ := e.state(tbl, held.ID); s.Group != "done" || e.lastError(tbl, held.ID).String != "ran" {
				t.Errorf("row %+v", s)
			}
			if tx && !e.committed(fx, 3) {
				t.Error("the handler's write did not commit with the event")
			}
		})
	}
}

// An extend event replaces the lease extension: it runs per lease, with times bound as
// the dialect stores them, and the leases whose statement changed a row are the ones moved.
func testEventExtend(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.withLastError("ra_evext", leaseTable)
	q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g", Events: map[string]string{
		dialects.EventExtend: "UPDATE " + e.q(tbl.Name) + " SET locked_until = {until}, last_error = 'extended' " +
			"WHERE id = {id} AND locked_until = {held}",
	}})
	a := e.claimOne(q, tbl)
	b := e.claimOne(q, tbl)
	until := t0.Add(5 * time.Minute)
	stale := dialects.Lease{ID: b.ID, Token: b.Token.Add(-time.Second)}
	moved, err := q.ExtendLeases(ctx, until, []dialects.Lease{a, stale})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(moved, []int64{a.ID}) {
		t.Fatalf("moved %v, want only %d", moved, a.ID)
	}
	sa, _ := e.state(tbl, a.ID)
	sameTime(t, "locked_until", sa.LockedUntil, until)
	if got := e.lastError(tbl, a.ID); got.String != "extended" {
		t.Errorf("extended row's last_error %q", got.String)
	}
	sb, _ := e.state(tbl, b.ID)
	sameTime(t, "the stale lease's locked_until", sb.LockedUntil, b.Token)
	if got := e.lastError(tbl, b.ID); got.Valid {
		t.Errorf("stale row's last_error %q", got.String)
	}
	// The moved lease settles with its new token.
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, dialects.Lease{ID: a.ID, Token: until}); !ok || err != nil {
		t.Errorf("settle with the extended token: %v %v", ok, err)
	}
}

// An event that does not compile, or does not prepare against the live table, is refused
// at Open with a *ConfigError naming the event, carrying the database's own error.
func testEventRefused(t *testing.T, h Harness) {
	e := setup(t, h)
	// other is a table of a form other than the lease: row lock where served, advisory.
	otherShape := groupedAdvisoryTable
	if e.caps.RowLock {
		otherShape = rowLockTable
	}
	other := e.table("ra_evbad", otherShape)
	le := e.table("ra_evbadl", leaseTable)
	missing := e.name("ra_no_such_table")
	cases := []struct {
		name, event, sql string
		tbl              dialects.Table
		reason           string
	}{
		{"missing column", dialects.EventAck, "UPDATE %s SET nope = 1 WHERE id = {id}", le, "does not prepare"},
		{"missing column other form", dialects.EventAck, "UPDATE %s SET nope = 1 WHERE id = {id}", other, "does not prepare"},
		{"missing table", "park", "DELETE FROM " + e.q(missing) + " WHERE id = {id}", other, "does not prepare"},
		{"syntax", dialects.EventRetry, "UPDAT %s SET grp = 'x' WHERE id = {id}", le, "does not prepare"},
		{"unknown placeholder", dialects.EventAck, "UPDATE %s SET grp = {nope} WHERE id = {id}", other, "{nope}"},
		{"held outside extend", dialects.EventAck, "UPDATE %s SET grp = 'x' WHERE id = {id} AND locked_until = {held}", le, "{held}"},
		{"no id", dialects.EventDrop, "DELETE FROM %s", other, "{id}"},
		{"extend without a lease", dialects.EventExtend, "UPDATE %s SET grp = 'x' WHERE id = {id}", other, "lease form"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			text := c.sql
			if strings.Contains(text, "%s") {
				text = fmt.Sprintf(text, e.q(c.tbl.Name))
			}
			_, err := e.d.Open(ctx, dialects.QueueSpec{Table: c.tbl, Group: "g", Events: map[string]string{
				"fine":  "UPDATE " + e.q(c.tbl.Name) + " SET grp = 'x' WHERE id = {id}",
				c.event: text,
			}})
			ce := configError(t, err)
			if want := fmt.Sprintf("OnEvent(%q)", c.event); ce.Option != want {
				t.Errorf("option %q, want %q (%v)", ce.Option, want, err)
			}
			contains(t, err.Error(), c.reason)
		})
	}
	// The database's own error is kept.
	_, err := e.d.Open(ctx, dialects.QueueSpec{Table: other, Group: "g", Events: map[string]string{
		dialects.EventAck: "UPDATE " + e.q(other.Name) + " SET nope = 1 WHERE id = {id}"}})
	if dialects.Classify(e.d, err) != dialects.FaultSchema || !errors.Is(err, dialects.ErrConfig) {
		t.Errorf("the refusal does not carry the database's error: %v", err)
	}
}
