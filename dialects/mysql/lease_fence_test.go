package mysql

import (
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// A renewer that comes after its lease expired and another consumer claimed the row with
// the very expiry the renewer asks for (tokens are whole seconds, so two hosts computing
// "now + lease" in the same second write the same value) must not count the row as
// extended: its later settlement, named by that value, would end the other consumer's
// delivery. Only a row that still held the renewer's old token when it was moved counts.
func TestExtendLeasesNeverConfirmsByValue(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_extv", leaseTable)
	stolen := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("stolen")})
	kept := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("kept")})
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})

	// Consumer A claims both rows at t0 with the token T.
	start := t0.Truncate(time.Second)
	tokenA := start.Add(10 * time.Second)
	rows, err := q.ClaimLeases(ctx, start, tokenA, 2)
	if err != nil || len(rows) != 2 {
		t.Fatalf("A's claim: %v %v", ids(rows), err)
	}
	// A's lease on the first row runs out; consumer B claims it at T with the expiry U
	// that A's late renewer is about to ask for. (The second row is made to look
	// unexpired, so B's claim passes it by: A still holds it.)
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET locked_until = ? WHERE id = ?", dbTime(tokenA.Add(time.Hour)), kept)
	until := tokenA.Add(30 * time.Second)
	rows, err = q.ClaimLeases(ctx, tokenA, until, 10)
	if err != nil || !slices.Equal(ids(rows), []int64{stolen}) {
		t.Fatalf("B's claim: %v %v", ids(rows), err)
	}
	before, _ := stateOf(t, d, tbl, stolen)
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET locked_until = ? WHERE id = ?", dbTime(tokenA), kept)

	// A's renewer: both leases in one statement, one lost and one held.
	moved, err := q.ExtendLeases(ctx, until, []dialects.Lease{{ID: stolen, Token: tokenA}, {ID: kept, Token: tokenA}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(moved, []int64{kept}) {
		t.Fatalf("A's renewer reported %v moved, want only row %d (row %d belongs to B)", moved, kept, stolen)
	}
	after, ok := stateOf(t, d, tbl, stolen)
	if !ok || after.Attempt != before.Attempt {
		t.Fatalf("B's row changed: %+v -> %+v (exists %v)", before, after, ok)
	}
	sameTime(t, "B's lease", after.LockedUntil, until)
	s, _ := stateOf(t, d, tbl, kept)
	sameTime(t, "A's extended lease", s.LockedUntil, until)

	// A's batched release names its old token for B's row: B's lease stays.
	released, err := q.(dialects.LeaseBatchQueue).SettleLeases(ctx, dialects.StepRelease, tokenA,
		[]dialects.Lease{{ID: stolen, Token: tokenA}, {ID: kept, Token: until}})
	if err != nil || !slices.Equal(released, []int64{kept}) {
		t.Fatalf("A's batched release settled %v %v, want only row %d", released, err, kept)
	}
	after, _ = stateOf(t, d, tbl, stolen)
	sameTime(t, "B's lease after A's release", after.LockedUntil, until)

	// B's delivery settles with its token, untouched by A.
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepRelease}, dialects.Lease{ID: stolen, Token: until}); !ok || err != nil {
		t.Fatalf("B's release: %v %v", ok, err)
	}
}

// A renewal in the same second as the claim asks for the token the row already holds: the
// row still holds the delivery's token, so it is extended (to the same value), whatever
// the server counts as changed.
func TestExtendLeasesToTheSameToken(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_exts", leaseTable)
	id := publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := openLease(t, d, dialects.QueueSpec{Table: tbl})
	until := t0.Truncate(time.Second).Add(2 * time.Second)
	rows, err := q.ClaimLeases(ctx, t0, until, 1)
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", rows, err)
	}
	moved, err := q.ExtendLeases(ctx, until, []dialects.Lease{{ID: id, Token: until}, {ID: id + 1000, Token: until}})
	if err != nil || !slices.Equal(moved, []int64{id}) {
		t.Fatalf("moved %v %v, want [%d]", moved, err, id)
	}
	s, _ := stateOf(t, d, tbl, id)
	sameTime(t, "locked_until", s.LockedUntil, until)
}

// A row's new claim always writes a token later than the one it expired with: the claim
// takes only rows whose lease is at or before now, and refuses an expiry that is not
// after now. So no two claims of one row write the same token.
func TestClaimTokenIsLaterThanTheExpiredOne(t *testing.T) {
	d := newDialect(t)
	for _, fifo := range []bool{false, true} {
		tbl := newTable(t, d, "ra_tok", func(name string) dialects.Table {
			tbl := leaseTable(name)
			tbl.FIFO = fifo
			return tbl
		})
		id := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
		q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
		first := t0.Add(time.Second)
		if rows, err := q.ClaimLeases(ctx, t0, first, 1); err != nil || len(rows) != 1 {
			t.Fatalf("fifo %v: claim: %v %v", fifo, rows, err)
		}
		// At the very instant the lease ends the row is claimable again, but an expiry
		// that is not after now is refused, with nothing written: also one after now by
		// less than the microsecond DATETIME(6) keeps.
		sameMicro := first.Truncate(time.Microsecond).Add(999 * time.Nanosecond)
		for _, bad := range []time.Time{first, first.Add(-time.Second), sameMicro} {
			if rows, err := q.ClaimLeases(ctx, first, bad, 1); err == nil || len(rows) != 0 {
				t.Errorf("fifo %v: a claim at %v with expiry %v: %v %v, want an error", fifo, first, bad, ids(rows), err)
			}
		}
		s, _ := stateOf(t, d, tbl, id)
		sameTime(t, "locked_until", s.LockedUntil, first)
		if s.Attempt != 2 {
			t.Errorf("fifo %v: attempt %d after refused claims, want 2", fifo, s.Attempt)
		}
		second := first.Add(time.Second)
		rows, err := q.ClaimLeases(ctx, first, second, 1)
		if err != nil || len(rows) != 1 {
			t.Fatalf("fifo %v: claim at expiry: %v %v", fifo, rows, err)
		}
		s, _ = stateOf(t, d, tbl, id)
		if s.LockedUntil == nil || !s.LockedUntil.After(first) {
			t.Fatalf("fifo %v: the new token %v is not after the expired %v", fifo, s.LockedUntil, first)
		}
		sameTime(t, "locked_until", s.LockedUntil, second)
	}
}
