package dialecttest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// A renewer that comes after its lease expired and another consumer claimed the row with
// the very expiry it asks for (tokens are whole seconds, so two hosts computing "now +
// lease" in the same second write the same value) must not count the row as extended, nor
// may its batched settlement by its old token touch the row: only a row that still held
// the old token when the statement changed it counts.
func testExtendLeasesNeverConfirmsByValue(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_extv", leaseTable)
	stolen := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("stolen")})
	kept := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("kept")})
	q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g"})

	// Consumer A claims both rows with the token T.
	start := t0.Truncate(time.Second)
	tokenA := start.Add(10 * time.Second)
	if rows, err := q.ClaimLeases(ctx, start, tokenA, 2); err != nil || len(rows) != 2 {
		t.Fatalf("A's claim: %v %v", ids(rows), err)
	}
	// A's lease on the first row runs out; consumer B claims it at T with the expiry U
	// that A's late renewer is about to ask for. (The second row is made to look
	// unexpired, so B's claim passes it by: A still holds it.)
	update := "UPDATE " + e.q(tbl.Name) + " SET locked_until = ? WHERE id = ?"
	e.exec(update, h.TimeArg(tokenA.Add(time.Hour)), kept)
	until := tokenA.Add(30 * time.Second)
	rows, err := q.ClaimLeases(ctx, tokenA, until, 10)
	if err != nil || !slices.Equal(ids(rows), []int64{stolen}) {
		t.Fatalf("B's claim: %v %v", ids(rows), err)
	}
	before, _ := e.state(tbl, stolen)
	e.exec(update, h.TimeArg(tokenA), kept)

	// A's renewer: both leases in one statement, one lost and one held.
	moved, err := q.ExtendLeases(ctx, until, []dialects.Lease{{ID: stolen, Token: tokenA}, {ID: kept, Token: tokenA}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(moved, []int64{kept}) {
		t.Fatalf("A's renewer reported %v moved, want only row %d (row %d belongs to B)", moved, kept, stolen)
	}
	after, ok := e.state(tbl, stolen)
	if !ok || !sameState(before, after) {
		t.Fatalf("B's row changed: %+v -> %+v (exists %v)", before, after, ok)
	}
	sameTime(t, "B's lease", after.LockedUntil, until)
	s, _ := e.state(tbl, kept)
	sameTime(t, "A's extended lease", s.LockedUntil, until)

	// A's batched release names its old token for B's row: B's lease stays.
	released, err := q.(dialects.LeaseBatchQueue).SettleLeases(ctx, dialects.StepRelease, tokenA,
		[]dialects.Lease{{ID: stolen, Token: tokenA}, {ID: kept, Token: until}})
	if err != nil || !slices.Equal(released, []int64{kept}) {
		t.Fatalf("A's batched release settled %v %v, want only row %d", released, err, kept)
	}
	after, _ = e.state(tbl, stolen)
	sameTime(t, "B's lease after A's release", after.LockedUntil, until)

	// B's delivery settles with its token, untouched by A.
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepRelease}, dialects.Lease{ID: stolen, Token: until}); !ok || err != nil {
		t.Fatalf("B's release: %v %v", ok, err)
	}
}

// A renewal in the same second as the claim asks for the token the row already holds: the
// row still holds the delivery's token, so it counts as extended (to the same value),
// whatever the server counts as changed.
func testExtendLeasesToTheSameToken(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_exts", leaseTable)
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := e.openLease(dialects.QueueSpec{Table: tbl})
	until := t0.Truncate(time.Second).Add(2 * time.Second)
	if rows, err := q.ClaimLeases(ctx, t0, until, 1); err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", ids(rows), err)
	}
	moved, err := q.ExtendLeases(ctx, until, []dialects.Lease{{ID: id, Token: until}, {ID: id + 1000, Token: until}})
	if err != nil || !slices.Equal(moved, []int64{id}) {
		t.Fatalf("moved %v %v, want [%d]", moved, err, id)
	}
	s, _ := e.state(tbl, id)
	sameTime(t, "locked_until", s.LockedUntil, until)
}

// A row's new claim always writes a token later than the one it expired with, so no two
// claims of one row write the same token: the claim takes only rows whose lease ended at
// or before now, and refuses an expiry that is not after now (as stored), writing nothing.
func testClaimTokenIsLaterThanTheExpiredOne(t *testing.T, h Harness) {
	e := setup(t, h)
	for _, fifo := range []bool{false, true} {
		tbl := e.table("ra_tok", func(name string) dialects.Table {
			tbl := leaseTable(name)
			tbl.FIFO = fifo
			return tbl
		})
		id := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("p")})
		q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g"})
		first := t0.Add(time.Second)
		if rows, err := q.ClaimLeases(ctx, t0, first, 1); err != nil || len(rows) != 1 {
			t.Fatalf("fifo %v: claim: %v %v", fifo, ids(rows), err)
		}
		// Also an expiry after now by less than the microsecond the database keeps.
		sameMicro := first.Truncate(time.Microsecond).Add(999 * time.Nanosecond)
		for _, bad := range []time.Time{first, first.Add(-time.Second), sameMicro} {
			if rows, err := q.ClaimLeases(ctx, first, bad, 1); err == nil || len(rows) != 0 {
				t.Errorf("fifo %v: a claim at %v with expiry %v: %v %v, want an error", fifo, first, bad, ids(rows), err)
			}
		}
		s, _ := e.state(tbl, id)
		sameTime(t, "locked_until", s.LockedUntil, first)
		if s.Attempt != 2 {
			t.Errorf("fifo %v: attempt %d after refused claims, want 2", fifo, s.Attempt)
		}
		second := first.Add(time.Second)
		if rows, err := q.ClaimLeases(ctx, first, second, 1); err != nil || len(rows) != 1 {
			t.Fatalf("fifo %v: claim at expiry: %v %v", fifo, ids(rows), err)
		}
		s, _ = e.state(tbl, id)
		if s.LockedUntil == nil || !s.LockedUntil.After(first) {
			t.Fatalf("fifo %v: the new token %v is not after the expired %v", fifo, s.LockedUntil, first)
		}
		sameTime(t, "locked_until", s.LockedUntil, second)
	}
}

// Another session holding one leased row's lock (a service's own transaction, a slow
// report) must not hold up the extension or the batched settlement of the other leases: a
// round that waited for that lock would keep every other lease of the round from moving
// and let them run out. The busy row is skipped, reported busy (still ours, not lost), and
// a batch leaves it for a settlement of its own; a lost row is still reported lost.
func testExtendAndBatchSkipARowAnotherSessionHolds(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_busy", leaseTable)
	var in []int64
	for range 3 {
		in = append(in, e.publish(tbl, dialects.Message{Payload: []byte("p")}))
	}
	q := e.openLease(dialects.QueueSpec{Table: tbl})
	start := t0.Truncate(time.Second)
	token := start.Add(10 * time.Second)
	if rows, err := q.ClaimLeases(ctx, start, token, 3); err != nil || len(rows) != 3 {
		t.Fatalf("claim: %v %v", ids(rows), err)
	}
	held := []dialects.Lease{{ID: in[0], Token: token}, {ID: in[1], Token: token}, {ID: in[2], Token: token}}

	// The outside session locks the middle row and keeps it.
	other := h.Begin(t, e.d)
	defer other.Rollback()
	if err := other.Exec("SELECT id FROM "+e.q(tbl.Name)+" WHERE id = ? FOR UPDATE", in[1]); err != nil {
		t.Fatal(err)
	}
	// A row whose lease was lost meanwhile is reported lost, not busy.
	lostToken := token.Add(time.Hour)
	e.exec("UPDATE "+e.q(tbl.Name)+" SET locked_until = ? WHERE id = ?", h.TimeArg(lostToken), in[2])

	until := token.Add(20 * time.Second)
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	moved, err := q.ExtendLeases(short, until, held)
	var busy *dialects.RowsBusyError
	if !errors.As(err, &busy) || !slices.Equal(moved, []int64{in[0]}) || !slices.Equal(busy.IDs, []int64{in[1]}) {
		t.Fatalf("extension: moved %v, err %v; want [%d] moved and row %d busy", moved, err, in[0], in[1])
	}
	s, _ := e.state(tbl, in[0])
	sameTime(t, "free row's lease", s.LockedUntil, until)

	// A batched ack of the held row and the free one: the free one is acked at once.
	acked, err := q.(dialects.LeaseBatchQueue).SettleLeases(short, dialects.StepAck, start,
		[]dialects.Lease{{ID: in[0], Token: until}, {ID: in[1], Token: token}, {ID: in[2], Token: token}})
	if !errors.As(err, &busy) || !slices.Equal(busy.IDs, []int64{in[1]}) || !slices.Equal(acked, []int64{in[0]}) {
		t.Fatalf("batched ack: acked %v, err %v; want [%d] acked and row %d busy", acked, err, in[0], in[1])
	}
	if _, ok := e.state(tbl, in[0]); ok {
		t.Fatalf("row %d not acked", in[0])
	}
	s, _ = e.state(tbl, in[2])
	sameTime(t, "the lost row's other lease", s.LockedUntil, lostToken)

	// Once the other session ends, the busy row is still ours and settles alone.
	if err := other.Rollback(); err != nil {
		t.Fatal(err)
	}
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: start}, held[1]); !ok || err != nil {
		t.Fatalf("busy row's own ack: %v %v", ok, err)
	}
}

// A statement that waits for a row another session holds, cut short by its context, must
// change nothing, also once that session lets the row go. A driver gives up on a cancelled
// statement by closing its socket, but the server does not notice while the statement
// waits in the lock's queue: run on its own (autocommit), the orphan would take the lock
// when the other session ends and commit. An extension would then move the token the book
// no longer knows, and the delivery's own settlement would find its lease lost; an ack
// reported failed would take effect. Both waiting statements (the renewer's retry of a
// busy lease, the batcher's waiter) must end on the server too, or never commit.
func testWaitCutShortChangesNothing(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_waitcut", leaseTable)
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := e.openLease(dialects.QueueSpec{Table: tbl})
	start := t0.Truncate(time.Second)
	token := start.Add(10 * time.Second)
	if rows, err := q.ClaimLeases(ctx, start, token, 1); err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", ids(rows), err)
	}
	held := dialects.Lease{ID: id, Token: token}
	other := h.Begin(t, e.d)
	defer other.Rollback()
	if err := other.Exec("UPDATE "+e.q(tbl.Name)+" SET payload = payload WHERE id = ?", id); err != nil {
		t.Fatal(err)
	}

	if w, ok := q.(dialects.WaitingExtender); ok {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		moved, err := w.ExtendLeasesWaiting(short, token.Add(20*time.Second), []dialects.Lease{held})
		cancel()
		if len(moved) != 0 || err == nil {
			t.Fatalf("waiting extension of a row another session holds: moved %v, err %v", moved, err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	acked, err := q.(dialects.LeaseBatchQueue).SettleLeaseWaiting(short, dialects.Step{Kind: dialects.StepAck, Now: start}, held)
	cancel()
	if acked || err == nil {
		t.Fatalf("waiting ack of a row another session holds: acked %v, err %v", acked, err)
	}

	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	// Whatever the server still ran would have run by now.
	time.Sleep(time.Second)
	s, ok := e.state(tbl, id)
	if !ok {
		t.Fatalf("row %d was acked by a settlement that returned %v", id, err)
	}
	sameTime(t, "the lease after the waits were cut short", s.LockedUntil, token)
	// The lease is still the delivery's: its own ack settles it.
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: start}, held); !ok || err != nil {
		t.Fatalf("the delivery's ack after the cut waits: %v %v", ok, err)
	}
}

// A settlement that waits for a row another session holds, with its lease run out
// meanwhile (the renewer cannot write a row held by another session), races the claims
// that come when that session ends. Whoever wins, the row is settled once: the waiting
// ack settles it, or a claim takes it and the ack changes nothing. Where the waiter keeps
// its place (Caps.WaiterKeepsPlace) the ack always wins.
func testWaitingSettlementAndALateClaim(t *testing.T, h Harness) {
	e := setup(t, h)
	o := e.other()
	const trials = 6
	acked, claimed := 0, 0
	for range trials {
		tbl := e.table("ra_waitclaim", leaseTable)
		id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
		q := e.openLease(dialects.QueueSpec{Table: tbl})
		q2 := o.openLease(dialects.QueueSpec{Table: tbl})
		now := time.Now()
		token := now.Add(200 * time.Millisecond)
		if rows, err := q.ClaimLeases(ctx, now, token, 1); err != nil || len(rows) != 1 {
			t.Fatalf("claim: %v %v", ids(rows), err)
		}
		other := h.Begin(t, e.d)
		if err := other.Exec("UPDATE "+e.q(tbl.Name)+" SET payload = payload WHERE id = ?", id); err != nil {
			t.Fatal(err)
		}
		type result struct {
			ok  bool
			err error
		}
		done := make(chan result, 1)
		go func() {
			ok, err := q.(dialects.LeaseBatchQueue).SettleLeaseWaiting(ctx,
				dialects.Step{Kind: dialects.StepAck, Now: now}, dialects.Lease{ID: id, Token: token})
			done <- result{ok, err}
		}()
		time.Sleep(300 * time.Millisecond) // the lease runs out; the ack waits
		stop := make(chan struct{})
		took := make(chan int, 1)
		go func() { // another process claims as fast as it can
			n := 0
			defer func() { took <- n }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c := time.Now()
				rows, err := q2.ClaimLeases(ctx, c, c.Add(time.Minute), 1)
				if err != nil {
					t.Errorf("the other process's claim: %v", err)
					return
				}
				n += len(rows)
			}
		}()
		time.Sleep(20 * time.Millisecond)
		if err := other.Commit(); err != nil {
			t.Fatal(err)
		}
		r := <-done
		close(stop)
		n := <-took
		if r.err != nil {
			t.Fatalf("the waiting ack: %v", r.err)
		}
		_, exists := e.state(tbl, id)
		switch {
		case r.ok && (n != 0 || exists):
			t.Fatalf("the waiting ack settled the row and yet it was claimed %d times (exists %v)", n, exists)
		case !r.ok && (n != 1 || !exists):
			t.Fatalf("the waiting ack settled nothing and the row was claimed %d times (exists %v)", n, exists)
		case r.ok:
			acked++
		default:
			claimed++
		}
	}
	t.Logf("of %d trials, the waiting ack settled %d; a later claim took the row in %d", trials, acked, claimed)
	if h.Caps().WaiterKeepsPlace && claimed > 0 {
		t.Fatalf("a claim took the row before its waiting ack in %d of %d trials", claimed, trials)
	}
}

// A waiting ack and a waiting extension whose context has no deadline (PostgreSQL sets no
// lock_timeout then; MariaDB goes through its kill path) and is cancelled while another
// session holds the row change nothing, also once that session commits, and name the
// table in their errors. Run on a lease table and on one with only the lease columns.
func testWaitCancelledWithoutDeadlineChangesNothing(t *testing.T, h Harness) {
	e := setup(t, h)
	minimal := func(name string) dialects.Table {
		return dialects.Table{Name: name, ID: "id", Payload: "payload", Attempt: "attempt", LockedUntil: "locked_until"}
	}
	for _, shape := range []func(string) dialects.Table{leaseTable, minimal} {
		tbl := e.table("ra_rbw", shape)
		id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
		q := e.openLease(dialects.QueueSpec{Table: tbl}).(dialects.LeaseBatchQueue)
		now := time.Now()
		held := dialects.Lease{ID: id, Token: now.Truncate(time.Second).Add(30 * time.Second)}
		if rows, err := q.ClaimLeases(ctx, now, held.Token, 1); err != nil || len(rows) != 1 {
			t.Fatalf("claim: %v %v", ids(rows), err)
		}
		other := h.Begin(t, e.d)
		defer other.Rollback()
		if err := other.Exec("UPDATE "+e.q(tbl.Name)+" SET payload = payload WHERE id = ?", id); err != nil {
			t.Fatal(err)
		}
		cut := func() context.Context {
			c, cancel := context.WithCancel(ctx)
			time.AfterFunc(300*time.Millisecond, cancel)
			return c
		}
		moved, err := q.(dialects.WaitingExtender).ExtendLeasesWaiting(cut(), held.Token.Add(time.Minute), []dialects.Lease{held})
		if len(moved) != 0 || err == nil {
			t.Fatalf("%s: waiting extension cancelled: moved %v, err %v", tbl.Name, moved, err)
		}
		contains(t, err.Error(), tbl.Name)
		done, err := q.SettleLeaseWaiting(cut(), dialects.Step{Kind: dialects.StepAck, Now: now}, held)
		if done || err == nil {
			t.Fatalf("%s: waiting ack cancelled: done %v, err %v", tbl.Name, done, err)
		}
		contains(t, err.Error(), tbl.Name)
		if err := other.Commit(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if found, err := q.Holding(ctx, []dialects.Lease{held}); err != nil || len(found) != 1 {
			t.Fatalf("%s: the row after the cancelled waits no longer holds its token: %v %v", tbl.Name, found, err)
		}
	}
}
