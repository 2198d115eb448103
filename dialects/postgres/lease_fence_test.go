package postgres

import (
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// A renewer that comes after its lease expired and another consumer claimed the row with
// the very expiry it asks for must not count the row as extended, nor may its batched
// settlement by its old token touch the row: only a row that still held the old token
// when the statement changed it counts (UPDATE ... RETURNING names exactly those rows).
func TestExtendLeasesNeverConfirmsByValue(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	stolen := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("stolen")})
	kept := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("kept")})
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})

	start := t0.Truncate(time.Second)
	tokenA := start.Add(10 * time.Second)
	if rows, err := q.ClaimLeases(ctx, start, tokenA, 2); err != nil || len(rows) != 2 {
		t.Fatalf("A's claim: %v %v", ids(rows), err)
	}
	mustExec(t, d, "UPDATE "+quote(tbl.Name)+" SET locked_until = $1 WHERE id = $2", tokenA.Add(time.Hour), kept)
	until := tokenA.Add(30 * time.Second)
	rows, err := q.ClaimLeases(ctx, tokenA, until, 10)
	if err != nil || !slices.Equal(ids(rows), []int64{stolen}) {
		t.Fatalf("B's claim: %v %v", ids(rows), err)
	}
	before, _ := stateOf(t, d, tbl, stolen)
	mustExec(t, d, "UPDATE "+quote(tbl.Name)+" SET locked_until = $1 WHERE id = $2", tokenA, kept)

	moved, err := q.ExtendLeases(ctx, until, []dialects.Lease{{ID: stolen, Token: tokenA}, {ID: kept, Token: tokenA}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(moved, []int64{kept}) {
		t.Fatalf("A's renewer reported %v moved, want only row %d (row %d belongs to B)", moved, kept, stolen)
	}
	after, ok := stateOf(t, d, tbl, stolen)
	if !ok || after.Attempt != before.Attempt || !sameTime(after.LockedUntil, until) {
		t.Fatalf("B's row changed: %+v -> %+v (exists %v)", before, after, ok)
	}
	if s, _ := stateOf(t, d, tbl, kept); !sameTime(s.LockedUntil, until) {
		t.Fatalf("A's lease was not extended: %+v", s)
	}

	released, err := q.(dialects.LeaseBatchQueue).SettleLeases(ctx, dialects.StepRelease, tokenA,
		[]dialects.Lease{{ID: stolen, Token: tokenA}, {ID: kept, Token: until}})
	if err != nil || !slices.Equal(released, []int64{kept}) {
		t.Fatalf("A's batched release settled %v %v, want only row %d", released, err, kept)
	}
	if after, _ = stateOf(t, d, tbl, stolen); !sameTime(after.LockedUntil, until) {
		t.Fatalf("A's release changed B's lease: %+v", after)
	}
}

// A renewal in the same second as the claim asks for the token the row already holds:
// the row still holds the delivery's token, so it counts as extended.
func TestExtendLeasesToTheSameToken(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	id := publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := openLease(t, d, dialects.QueueSpec{Table: tbl})
	until := t0.Truncate(time.Second).Add(2 * time.Second)
	if rows, err := q.ClaimLeases(ctx, t0, until, 1); err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", rows, err)
	}
	moved, err := q.ExtendLeases(ctx, until, []dialects.Lease{{ID: id, Token: until}, {ID: id + 1000, Token: until}})
	if err != nil || !slices.Equal(moved, []int64{id}) {
		t.Fatalf("moved %v %v, want [%d]", moved, err, id)
	}
}

// A row's new claim always writes a token later than the one it expired with, so no two
// claims of one row write the same token: the claim takes only rows whose lease ended at
// or before now, and refuses an expiry that is not after now (as stored).
func TestClaimTokenIsLaterThanTheExpiredOne(t *testing.T) {
	d := newDialect(t)
	for _, fifo := range []bool{false, true} {
		tbl := leaseTable(tableName(t, d))
		tbl.FIFO = fifo
		createTable(t, d, tbl)
		id := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
		q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
		first := t0.Add(time.Second)
		if rows, err := q.ClaimLeases(ctx, t0, first, 1); err != nil || len(rows) != 1 {
			t.Fatalf("fifo %v: claim: %v %v", fifo, rows, err)
		}
		sameMicro := micro(first).Add(999 * time.Nanosecond)
		for _, bad := range []time.Time{first, first.Add(-time.Second), sameMicro} {
			if rows, err := q.ClaimLeases(ctx, first, bad, 1); err == nil || len(rows) != 0 {
				t.Errorf("fifo %v: a claim at %v with expiry %v: %v %v, want an error", fifo, first, bad, ids(rows), err)
			}
		}
		if s, _ := stateOf(t, d, tbl, id); !sameTime(s.LockedUntil, first) || s.Attempt != 2 {
			t.Errorf("fifo %v: after refused claims the row is %+v", fifo, s)
		}
		second := first.Add(time.Second)
		if rows, err := q.ClaimLeases(ctx, first, second, 1); err != nil || len(rows) != 1 {
			t.Fatalf("fifo %v: claim at expiry: %v %v", fifo, rows, err)
		}
		if s, _ := stateOf(t, d, tbl, id); !sameTime(s.LockedUntil, second) || !s.LockedUntil.After(first) {
			t.Errorf("fifo %v: the new token %v is not after the expired %v", fifo, s.LockedUntil, first)
		}
	}
}
