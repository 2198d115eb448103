package mysql

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
	{"rowlock", dialects.FormRowLock, rowLockTable, false},
	{"rowlock_tx", dialects.FormRowLock, rowLockTable, true},
	{"lease", dialects.FormLease, leaseTable, false},
	{"lease_tx", dialects.FormLease, leaseTable, true},
	{"advisory", dialects.FormAdvisory, groupedAdvisoryTable, false},
	{"advisory_tx", dialects.FormAdvisory, groupedAdvisoryTable, true},
}

func groupedAdvisoryTable(name string) dialects.Table {
	return dialects.Table{Name: name, ID: "id", Payload: "payload", Group: "grp", Attempt: "attempt",
		RetryAfter: "retry_after", AdvisoryKey: name + "-{id}"}
}

// eventFixture is a queue of form f on a fresh table with an extra last_error column, a
// table for the handler's writes, and one row published to group g.
type eventFixture struct {
	f   eventForm
	d   *Dialect
	tbl dialects.Table
	q   dialects.Queue
	fx  string
	id  int64
}

// newEventFixture renders each event's SQL with %[1]s as the quoted table name.
func newEventFixture(t *testing.T, f eventForm, events map[string]string) *eventFixture {
	t.Helper()
	d := newDialect(t)
	tbl := newTable(t, d, "ra_ev", f.shape)
	mustExec(t, d.DB(), "ALTER TABLE "+quote(tbl.Name)+" ADD COLUMN last_error VARCHAR(200) NULL")
	rendered := map[string]string{}
	for name, text := range events {
		rendered[name] = fmt.Sprintf(text, quote(tbl.Name))
	}
	q := openQueue(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Events: rendered, Transactional: f.tx})
	id := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	return &eventFixture{f: f, d: d, tbl: tbl, q: q, fx: effectsTable(t, d), id: id}
}

// unlease is the SET clause an event returning a lease-form row adds.
func (f eventForm) unlease() string {
	if f.form == dialects.FormLease {
		return ", locked_until = NULL"
	}
	return ""
}

// settle claims the fixture's row as of t0 and settles it with step; a transactional
// delivery writes to the effects table first. ok is false when the lease form reports the
// lease lost.
func (e *eventFixture) settle(t *testing.T, step dialects.Step) (ok bool, err error) {
	t.Helper()
	switch e.f.form {
	case dialects.FormRowLock:
		q := e.q.(dialects.RowLockQueue)
		if e.f.tx {
			c := claimTx(t, q)
			handlerWrite(t, c, e.fx, c.Row().ID)
			return true, c.Settle(ctx, step)
		}
		c := claimLocked(t, q)
		t.Cleanup(func() { c.Rollback(ctx) })
		return true, c.Settle(ctx, step)
	case dialects.FormLease:
		q := e.q.(dialects.LeaseQueue)
		rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
		if err != nil || len(rows) != 1 {
			t.Fatalf("claim: %v %v", rows, err)
		}
		held := dialects.Lease{ID: rows[0].ID, Token: rows[0].Token}
		if e.f.tx {
			tx := beginDelivery(t, q.(dialects.TxLeaseQueue))
			handlerWrite(t, tx, e.fx, held.ID)
			return tx.SettleLease(ctx, step, held)
		}
		return q.SettleLease(ctx, step, held)
	}
	q := e.q.(dialects.AdvisoryQueue)
	cands, err := q.Candidates(ctx, t0, 1)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates: %v %v", cands, err)
	}
	s := newSession(t, q)
	if !tryLock(t, s, cands[0].Key) {
		t.Fatal("lock refused")
	}
	if _, ok, err := s.Take(ctx, cands[0].ID, t0); !ok || err != nil {
		t.Fatalf("take %v %v", ok, err)
	}
	if e.f.tx {
		ts := s.(dialects.TxSession)
		if err := ts.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		handlerWrite(t, ts, e.fx, cands[0].ID)
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

// claimable reports whether the form would deliver a row of group g as of at (a lease
// claim stamps it).
func (e *eventFixture) claimable(t *testing.T, at time.Time) bool {
	t.Helper()
	switch e.f.form {
	case dialects.FormRowLock:
		c, ok, err := e.q.(dialects.RowLockQueue).ClaimLocked(ctx, at)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			c.Rollback(ctx)
		}
		return ok
	case dialects.FormLease:
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

func (e *eventFixture) lastError(t *testing.T) sql.NullString {
	t.Helper()
	var s sql.NullString
	if err := e.d.DB().QueryRowContext(ctx, "SELECT last_error FROM "+quote(e.tbl.Name)+" WHERE id = ?", e.id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// checkHandlerWrite fails unless a transactional delivery's write committed with its event.
func (e *eventFixture) checkHandlerWrite(t *testing.T) {
	t.Helper()
	if e.f.tx && !committed(t, e.d, e.fx, e.id) {
		t.Error("the handler's write did not commit with the event")
	}
}

// An ack event that moves the row to another group instead of deleting it runs in place
// of the built-in ack, in every form: the row stays, in group done, and is no longer
// claimable.
func TestEventAckMovesRow(t *testing.T) {
	for _, f := range eventForms {
		t.Run(f.name, func(t *testing.T) {
			e := newEventFixture(t, f, map[string]string{
				dialects.EventAck: "UPDATE %[1]s SET grp = 'done' WHERE id = {id}",
			})
			ok, err := e.settle(t, dialects.Step{Kind: dialects.StepAck, Now: t0, Event: dialects.EventAck})
			if !ok || err != nil {
				t.Fatalf("settle: %v %v", ok, err)
			}
			s, found := stateOf(t, e.d, e.tbl, e.id)
			if !found || s.Group != "done" {
				t.Fatalf("row %+v found %v, want it in group done", s, found)
			}
			e.checkHandlerWrite(t)
			// Past the lease, too: only the group keeps the row out.
			if e.claimable(t, t0.Add(2*time.Minute)) {
				t.Error("the row moved away is still claimable")
			}
		})
	}
}

// A retry event records the handler's error in an extra column and returns the row, in
// place of the built-in retry: the row lock form's retry no longer counts the attempt,
// and the advisory form's, which otherwise runs nothing, runs it.
func TestEventRetryRecordsError(t *testing.T) {
	const reason = `boom: it's "quoted" \ and long`
	for _, f := range eventForms {
		t.Run(f.name, func(t *testing.T) {
			e := newEventFixture(t, f, map[string]string{
				dialects.EventRetry: "UPDATE %[1]s SET last_error = {error}" + f.unlease() + " WHERE id = {id}",
			})
			before, _ := stateOf(t, e.d, e.tbl, e.id)
			ok, err := e.settle(t, dialects.Step{Kind: dialects.StepRetry, Now: t0, Event: dialects.EventRetry, Error: reason})
			if !ok || err != nil {
				t.Fatalf("settle: %v %v", ok, err)
			}
			if got := e.lastError(t); got.String != reason {
				t.Errorf("last_error %q, want %q", got.String, reason)
			}
			s, found := stateOf(t, e.d, e.tbl, e.id)
			if !found || s.Group != "g" || s.LockedUntil != nil {
				t.Fatalf("row %+v found %v", s, found)
			}
			if f.form == dialects.FormRowLock && s.Attempt != before.Attempt {
				t.Errorf("attempt %d, was %d: the built-in retry ran too", s.Attempt, before.Attempt)
			}
			e.checkHandlerWrite(t)
			if !e.claimable(t, t0) {
				t.Error("the retried row is not claimable")
			}
		})
	}
}

// A custom event binds the handler's values to {arg1}, {arg2} (each occurrence of its
// own), and {group}, {attempt} and {now} as the dialect binds them (times in UTC to the
// microsecond).
func TestEventCustom(t *testing.T) {
	for _, f := range eventForms {
		t.Run(f.name, func(t *testing.T) {
			e := newEventFixture(t, f, map[string]string{
				"park": "UPDATE %[1]s SET last_error = CONCAT({arg1}, '/', {group}, '/', {attempt}, '/', {arg1}), grp = {arg2}, " +
					"retry_after = {now}" + f.unlease() + " WHERE id = {id}",
			})
			step := dialects.Step{Kind: dialects.StepCustom, Now: t0, Event: "park", Attempt: 3, Args: []any{"note", "parked"}}
			ok, err := e.settle(t, step)
			if !ok || err != nil {
				t.Fatalf("settle: %v %v", ok, err)
			}
			if got := e.lastError(t); got.String != "note/g/3/note" {
				t.Errorf("last_error %q", got.String)
			}
			s, _ := stateOf(t, e.d, e.tbl, e.id)
			if s.Group != "parked" {
				t.Errorf("group %q", s.Group)
			}
			sameTime(t, "retry_after", s.RetryAfter, t0)
			e.checkHandlerWrite(t)
		})
	}
}

// A step naming an event the subscription lacks, or a custom event given too few values,
// fails before anything runs.
func TestEventBadStep(t *testing.T) {
	for _, f := range eventForms {
		t.Run(f.name, func(t *testing.T) {
			e := newEventFixture(t, f, map[string]string{"park": "UPDATE %[1]s SET grp = {arg2} WHERE id = {id}"})
			for _, step := range []dialects.Step{
				{Kind: dialects.StepCustom, Event: "park", Args: []any{"one"}},
				{Kind: dialects.StepCustom, Event: "nope"},
			} {
				if _, err := e.settle(t, step); err == nil || !strings.Contains(err.Error(), "event") {
					t.Errorf("step %+v: %v", step, err)
				}
				if s, found := stateOf(t, e.d, e.tbl, e.id); !found || s.Group != "g" {
					t.Errorf("row %+v found %v", s, found)
				}
				if f.form == dialects.FormLease {
					// The failed settlement left the lease: claim as of its end.
					mustExec(t, e.d.DB(), "UPDATE "+quote(e.tbl.Name)+" SET locked_until = NULL")
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
			tbl := newTable(t, d, "ra_evlost", leaseTable)
			mustExec(t, d.DB(), "ALTER TABLE "+quote(tbl.Name)+" ADD COLUMN last_error VARCHAR(200) NULL")
			fx := effectsTable(t, d)
			spec := dialects.QueueSpec{Table: tbl, Group: "g", Transactional: tx, Events: map[string]string{
				dialects.EventAck: "UPDATE " + quote(tbl.Name) + " SET grp = 'done', last_error = 'ran' WHERE id = {id}",
			}}
			q := openLease(t, d, spec)
			held := claimOne(t, d, q, tbl)
			before, _ := stateOf(t, d, tbl, held.ID)
			step := dialects.Step{Kind: dialects.StepAck, Now: t0, Event: dialects.EventAck}
			settle := func(l dialects.Lease, fxID int64) (bool, error) {
				if !tx {
					return q.SettleLease(ctx, step, l)
				}
				ltx := beginDelivery(t, q.(dialects.TxLeaseQueue))
				handlerWrite(t, ltx, fx, fxID)
				return ltx.SettleLease(ctx, step, l)
			}

			stale := held
			stale.Token = held.Token.Add(-time.Second)
			if ok, err := settle(stale, 1); ok || err != nil {
				t.Fatalf("stale settlement: %v %v", ok, err)
			}
			s, found := stateOf(t, d, tbl, held.ID)
			if !found || s.Group != "g" || !s.LockedUntil.Equal(*before.LockedUntil) {
				t.Fatalf("a stale settlement changed the row: %+v", s)
			}
			if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(tbl.Name)+" WHERE last_error IS NOT NULL"); n != 0 {
				t.Error("the event ran for a stale token")
			}
			if committed(t, d, fx, 1) {
				t.Error("a lost lease committed the handler's write")
			}
			if ok, err := settle(dialects.Lease{ID: held.ID + 1000, Token: held.Token}, 2); ok || err != nil {
				t.Fatalf("settlement of a missing row: %v %v", ok, err)
			}

			if ok, err := settle(held, 3); !ok || err != nil {
				t.Fatalf("settle: %v %v", ok, err)
			}
			if s, _ := stateOf(t, d, tbl, held.ID); s.Group != "done" {
				t.Errorf("row %+v", s)
			}
			if tx && !committed(t, d, fx, 3) {
				t.Error("the handler's write did not commit with the event")
			}
		})
	}
}

// While the lease form's event transaction holds the row (the confirmation locks it), a
// renewal cannot move the lease between the confirmation and the event: it skips the row
// (reporting it busy, not lost), and once the event returned the row, finds it lost.
func TestEventLeaseLocksRow(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_evlock", leaseTable)
	fx := effectsTable(t, d)
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true, Events: map[string]string{
		"park": "UPDATE " + quote(tbl.Name) + " SET grp = 'parked', locked_until = NULL WHERE id = {id}",
	}})
	held := claimOne(t, d, q, tbl)
	ltx := beginDelivery(t, q.(dialects.TxLeaseQueue))
	handlerWrite(t, ltx, fx, 1)
	// Confirm and run the event by hand in the delivery's transaction, so the renewal
	// can be started between them.
	lt := ltx.(*leaseTx)
	var one int
	if err := lt.x.tx.QueryRowContext(ctx, lt.q.confirm, held.ID, dbTime(held.Token)).Scan(&one); err != nil {
		t.Fatal(err)
	}
	moved, err := q.ExtendLeases(ctx, t0.Add(2*time.Minute), []dialects.Lease{held})
	var busy *dialects.RowsBusyError
	if !errors.As(err, &busy) || len(moved) != 0 || !slices.Equal(busy.IDs, []int64{held.ID}) {
		t.Fatalf("renewal while the event's transaction holds the row: moved %v, %v; want it busy", moved, err)
	}
	if ok, err := ltx.SettleLease(ctx, dialects.Step{Kind: dialects.StepCustom, Now: t0, Event: "park"}, held); !ok || err != nil {
		t.Fatalf("settle: %v %v", ok, err)
	}
	if moved, err := q.ExtendLeases(ctx, t0.Add(2*time.Minute), []dialects.Lease{held}); len(moved) != 0 || err != nil {
		t.Errorf("the renewal after the event returned the row: moved %v, %v; want it lost", moved, err)
	}
	if s, _ := stateOf(t, d, tbl, held.ID); s.Group != "parked" || s.LockedUntil != nil {
		t.Errorf("row %+v", s)
	}
}

// An extend event replaces the lease extension: it runs per lease, and the leases whose
// statement changed a row are the ones moved.
func TestEventExtend(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_evext", leaseTable)
	mustExec(t, d.DB(), "ALTER TABLE "+quote(tbl.Name)+" ADD COLUMN last_error VARCHAR(200) NULL")
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Events: map[string]string{
		dialects.EventExtend: "UPDATE " + quote(tbl.Name) + " SET locked_until = {until}, last_error = 'extended' " +
			"WHERE id = {id} AND locked_until = {held}",
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
	sa, _ := stateOf(t, d, tbl, a.ID)
	sameTime(t, "locked_until", sa.LockedUntil, until)
	sb, _ := stateOf(t, d, tbl, b.ID)
	sameTime(t, "the stale lease's locked_until", sb.LockedUntil, b.Token)
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(tbl.Name)+" WHERE last_error = 'extended'"); n != 1 {
		t.Errorf("%d rows extended by the event", n)
	}
	// The moved lease settles with its new token.
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, dialects.Lease{ID: a.ID, Token: until}); !ok || err != nil {
		t.Errorf("settle with the extended token: %v %v", ok, err)
	}
}

// An event that does not compile, or does not prepare against the live table, is refused
// at Open with a *ConfigError naming the event.
func TestEventRefused(t *testing.T) {
	d := newDialect(t)
	rl := newTable(t, d, "ra_evbad", rowLockTable)
	le := newTable(t, d, "ra_evbadl", leaseTable)
	cases := []struct {
		name, event, sql string
		tbl              dialects.Table
		reason           string
	}{
		{"missing column", dialects.EventAck, "UPDATE %s SET nope = 1 WHERE id = {id}", rl, "does not prepare"},
		{"missing table", "park", "DELETE FROM ra_no_such_table WHERE id = {id}", rl, "does not prepare"},
		{"syntax", dialects.EventRetry, "UPDAT %s SET grp = 'x' WHERE id = {id}", le, "does not prepare"},
		{"unknown placeholder", dialects.EventAck, "UPDATE %s SET grp = {nope} WHERE id = {id}", rl, "{nope}"},
		{"held outside extend", dialects.EventAck, "UPDATE %s SET grp = 'x' WHERE id = {id} AND locked_until = {held}", le, "{held}"},
		{"no id", dialects.EventDrop, "DELETE FROM %s", rl, "{id}"},
		{"extend without a lease", dialects.EventExtend, "UPDATE %s SET grp = 'x' WHERE id = {id}", rl, "lease form"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			text := c.sql
			if strings.Contains(text, "%s") {
				text = fmt.Sprintf(text, quote(c.tbl.Name))
			}
			_, err := d.Open(ctx, dialects.QueueSpec{Table: c.tbl, Group: "g", Events: map[string]string{
				"fine":  "UPDATE " + quote(c.tbl.Name) + " SET grp = 'x' WHERE id = {id}",
				c.event: text,
			}})
			ce := configError(t, err)
			if want := fmt.Sprintf("OnEvent(%q)", c.event); ce.Option != want {
				t.Errorf("option %q, want %q (%v)", ce.Option, want, err)
			}
			contains(t, err.Error(), c.reason)
		})
	}
	// The server's own error is kept.
	_, err := d.Open(ctx, dialects.QueueSpec{Table: rl, Group: "g", Events: map[string]string{
		dialects.EventAck: "UPDATE " + quote(rl.Name) + " SET nope = 1 WHERE id = {id}"}})
	if classify(err) != dialects.FaultSchema || !errors.Is(err, dialects.ErrConfig) {
		t.Errorf("the refusal does not carry the server's error: %v", err)
	}
}
