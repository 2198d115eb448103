package sqlite

import (
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// evState is the row as stored, NULL reading as "NULL".
type evState struct {
	found                                     bool
	Group, LastError, RetryAfter, LockedUntil string
	Attempt                                   int
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

// A deferred delivery's event settlement waits for the write lock another connection
// holds, as the built-in settlement would: its confirmation is a write, where the busy
// handler waits (a read first would make the event's write fail at once with
// SQLITE_BUSY).
func TestEventLeaseTxWaitsForTheWriteLock(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
	txFixture(t, d, tbl)
	mustExec(t, d, "ALTER TABLE jobs ADD COLUMN last_error TEXT")
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true, Events: map[string]string{
		"park": "UPDATE jobs SET grp = 'parked', locked_until = NULL WHERE id = {id}",
	}})
	held := dialecttest.ClaimOne(t, d, q, tbl)
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
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true, Events: map[string]string{
		dialects.EventAck: "UPDATE jobs SET grp = 'done' WHERE id = {id}",
	}})
	r := dialecttest.ClaimOne(t, d, q, tbl)
	dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("second")})

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
