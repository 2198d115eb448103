package mysql

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// The advisory take reads the row first, then counts its attempt fenced by the read and
// saturating at the cap. At the cap the count changes nothing (MySQL reports no row
// changed), so the take decides from the read: a row read at the cap is taken, and
// reports the attempt read; a row changed since (re-keyed, delayed) is still refused, and
// nothing is written.
func TestAdvisoryTakeAtTheCapIsFencedByTheRead(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_takecap", advisoryTable)
	narrowAttempt(t, d, tbl, "SMALLINT")
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET account = 'alice', attempt = 32767 WHERE id = ?", id)
	key := keyOf(t, d, tbl, id)
	takeAtTheCapRekeyed(t, d, tbl, q, id, key)
	takeAtTheCapDelayedThenDue(t, d, tbl, q, id, key)
	takeOneBelowTheCap(t, d, tbl, q, id, key)
}

// takeAtTheCapRekeyed: a row re-keyed after the candidates were read is not taken, at
// the cap as below it.
func takeAtTheCapRekeyed(t *testing.T, d *Dialect, tbl dialects.Table, q dialects.AdvisoryQueue, id int64, key string) {
	t.Helper()
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET account = 'ALICE' WHERE id = ?", id)
	s := dialecttest.NewSession(t, q)
	if !dialecttest.TryLock(t, s, key) {
		t.Fatal("lock refused")
	}
	if r, ok, err := s.Take(ctx, id, t0); ok || err != nil {
		t.Fatalf("take of a re-keyed row at the cap: %+v %v %v, want not taken", r, ok, err)
	}
	if closed, err := s.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock %v %v", closed, err)
	}
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET account = 'alice' WHERE id = ?", id)
}

// takeAtTheCapDelayedThenDue: a delayed row at the cap is not taken; due again, it is
// taken, reporting the attempt read, which stays at the cap.
func takeAtTheCapDelayedThenDue(t *testing.T, d *Dialect, tbl dialects.Table, q dialects.AdvisoryQueue, id int64, key string) {
	t.Helper()
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET retry_after = ? WHERE id = ?", dbTime(t0.Add(time.Hour)), id)
	s := dialecttest.NewSession(t, q)
	if !dialecttest.TryLock(t, s, key) {
		t.Fatal("lock refused")
	}
	if r, ok, err := s.Take(ctx, id, t0); ok || err != nil {
		t.Fatalf("take of a delayed row at the cap: %+v %v %v, want not taken", r, ok, err)
	}
	// Due again: taken, reporting the attempt read, which stays at the cap.
	r, ok, err := s.Take(ctx, id, t0.Add(time.Hour))
	if !ok || err != nil || r.ID != id || r.Attempt != 32767 || r.Key != key || r.Fault != nil {
		t.Fatalf("take of a due row at the cap: %+v %v %v", r, ok, err)
	}
	if got := attemptOf(t, d, tbl, id); got != 32767 {
		t.Fatalf("attempt %d, want 32767", got)
	}

	if closed, err := s.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock %v %v", closed, err)
	}
}

// takeOneBelowTheCap: one below the cap, the take counts to the cap, fenced as usual.
func takeOneBelowTheCap(t *testing.T, d *Dialect, tbl dialects.Table, q dialects.AdvisoryQueue, id int64, key string) {
	t.Helper()
	setAttempt(t, d, tbl, id, 32766)
	s := dialecttest.NewSession(t, q)
	if !dialecttest.TryLock(t, s, key+"x") {
		t.Fatal("lock refused")
	}
	if _, ok, err := s.Take(ctx, id, t0.Add(time.Hour)); ok || err != nil {
		t.Fatalf("take under another key: %v %v, want not taken", ok, err)
	}
	if closed, err := s.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock %v %v", closed, err)
	}
	s2 := dialecttest.NewSession(t, q)
	if !dialecttest.TryLock(t, s2, key) {
		t.Fatal("lock refused")
	}
	r, ok, err := s2.Take(ctx, id, t0.Add(time.Hour))
	if !ok || err != nil || r.Attempt != 32766 {
		t.Fatalf("take below the cap: %+v %v %v", r, ok, err)
	}
	if got := attemptOf(t, d, tbl, id); got != 32767 {
		t.Fatalf("attempt %d, want 32767", got)
	}
}

// A NULL attempt is one the saturating count leaves NULL (no row changed): the take
// decides from the read, and takes the row.
func TestAdvisoryTakeNullAttempt(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_takenull", advisoryTable)
	mustExec(t, d.DB(), "ALTER TABLE "+quote(tbl.Name)+" MODIFY attempt INT NULL")
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET attempt = NULL WHERE id = ?", id)
	s := dialecttest.NewSession(t, q)
	if !dialecttest.TryLock(t, s, keyOf(t, d, tbl, id)) {
		t.Fatal("lock refused")
	}
	r, ok, err := s.Take(ctx, id, t0)
	if !ok || err != nil || r.ID != id || r.Attempt != 0 {
		t.Fatalf("take of a row with a NULL attempt: %+v %v %v", r, ok, err)
	}
}

// A row whose values do not scan (an unsigned attempt beyond what an int64 reads, so
// beyond every cap) is taken and returned flagged, its key held, nothing written.
func TestAdvisoryTakeUnreadableRow(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_takebad", advisoryTable)
	narrowAttempt(t, d, tbl, "BIGINT UNSIGNED")
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET attempt = 18446744073709551615 WHERE id = ?", id)
	s := dialecttest.NewSession(t, q)
	key := keyOf(t, d, tbl, id)
	if !dialecttest.TryLock(t, s, key) {
		t.Fatal("lock refused")
	}
	r, ok, err := s.Take(ctx, id, t0)
	if !ok || err != nil || r.ID != id || r.Key != key || !errors.Is(r.Fault, dialects.ErrRowData) {
		t.Fatalf("take of an unreadable row: %+v %v %v", r, ok, err)
	}
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(tbl.Name)+" WHERE attempt = 18446744073709551615"); n != 1 {
		t.Fatal("the unreadable row's attempt changed")
	}
	if closed, err := s.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock %v %v", closed, err)
	}
}

// An attempt that is no integer (a DECIMAL column holding a fraction) does not scan into
// the delivery's attempt: the row is flagged, and its count is fenced by the attempt as
// the driver gave it (and counted once).
func TestAdvisoryTakeFencesAnUnreadableAttemptAsRead(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_takedec", advisoryTable)
	mustExec(t, d.DB(), "ALTER TABLE "+quote(tbl.Name)+" MODIFY attempt DECIMAL(12,2) NOT NULL DEFAULT 1")
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET attempt = 1.5 WHERE id = ?", id)
	s := dialecttest.NewSession(t, q)
	if !dialecttest.TryLock(t, s, keyOf(t, d, tbl, id)) {
		t.Fatal("lock refused")
	}
	r, ok, err := s.Take(ctx, id, t0)
	if !ok || err != nil || r.ID != id || !errors.Is(r.Fault, dialects.ErrRowData) {
		t.Fatalf("take: %+v %v %v", r, ok, err)
	}
	var got string
	if err := d.DB().QueryRowContext(ctx, "SELECT attempt FROM "+quote(tbl.Name)+" WHERE id = ?", id).Scan(&got); err != nil || got != "2.50" {
		t.Fatalf("attempt %q (%v), want 2.50: counted once", got, err)
	}
}

// A one-pair row-value IN, (id, t) IN ((?, ?)), is a full table scan in a MariaDB UPDATE
// (Handler_read_rnd_next counts every row), which waits on every row another session
// locks. The extension now locks its rows by (id, token) pairs (padded to two pairs, as
// every pair list is) and updates them by id: no statement the lease queue prepares names
// one pair, and one lease's extension or batch settlement waits on no other row.
func TestExtendOneLeaseBesideALockedRow(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_extpad", leaseTable)
	mine := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("mine")})
	other := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("other")})
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	until := t0.Add(30 * time.Second)
	rows, err := q.ClaimLeases(ctx, t0, until, 1)
	if err != nil || len(rows) != 1 || rows[0].ID != mine {
		t.Fatalf("claim %v %v", dialecttest.IDs(rows), err)
	}
	lq := q.(*leaseQueue)
	for _, text := range lq.texts() {
		if strings.Contains(text, "IN ((?,?))") {
			t.Errorf("a one-pair row-value IN: %s", text)
		}
	}
	tx, err := d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "SELECT id FROM "+quote(tbl.Name)+" WHERE id = ? FOR UPDATE", other); err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	moved, err := q.ExtendLeases(c, until.Add(30*time.Second), []dialects.Lease{{ID: mine, Token: until}})
	if err != nil || len(moved) != 1 || moved[0] != mine {
		t.Fatalf("extension of one lease beside a locked row: %v %v", moved, err)
	}
	c2, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	settled, err := q.(dialects.LeaseBatchQueue).SettleLeases(c2, dialects.StepRelease, t0,
		[]dialects.Lease{{ID: mine, Token: until.Add(30 * time.Second)}, {ID: mine, Token: until.Add(30 * time.Second)}})
	if err != nil || len(settled) != 1 {
		t.Fatalf("batch beside a locked row: %v %v", settled, err)
	}
}
