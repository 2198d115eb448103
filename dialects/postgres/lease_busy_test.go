package postgres

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// Another session holding one leased row's lock must not hold up the extension or the
// batched settlement of the other leases: a round that waited for that lock would keep
// every other lease of the round from moving and let them run out. The busy row is
// skipped and reported busy (still ours, not lost); a lost row is still reported lost.
func TestExtendAndBatchSkipARowAnotherSessionHolds(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	var in []int64
	for range 3 {
		in = append(in, publish(t, d, tbl, dialects.Message{Payload: []byte("p")}))
	}
	q := openLease(t, d, dialects.QueueSpec{Table: tbl})
	start := t0.Truncate(time.Second)
	token := start.Add(10 * time.Second)
	if rows, err := q.ClaimLeases(ctx, start, token, 3); err != nil || len(rows) != 3 {
		t.Fatalf("claim: %v %v", ids(rows), err)
	}
	held := []dialects.Lease{{ID: in[0], Token: token}, {ID: in[1], Token: token}, {ID: in[2], Token: token}}

	other, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if _, err := other.Exec(ctx, "SELECT id FROM "+quote(tbl.Name)+" WHERE id = $1 FOR UPDATE", in[1]); err != nil {
		t.Fatal(err)
	}
	lostToken := token.Add(time.Hour)
	mustExec(t, d, "UPDATE "+quote(tbl.Name)+" SET locked_until = $1 WHERE id = $2", lostToken, in[2])

	until := token.Add(20 * time.Second)
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	moved, err := q.ExtendLeases(short, until, held)
	var busy *dialects.RowsBusyError
	if !errors.As(err, &busy) || !slices.Equal(moved, []int64{in[0]}) || !slices.Equal(busy.IDs, []int64{in[1]}) {
		t.Fatalf("extension: moved %v, err %v; want [%d] moved and row %d busy", moved, err, in[0], in[1])
	}
	if s, _ := stateOf(t, d, tbl, in[0]); !sameTime(s.LockedUntil, until) {
		t.Fatalf("free row's lease %v, want %v", s.LockedUntil, until)
	}

	acked, err := q.(dialects.LeaseBatchQueue).SettleLeases(short, dialects.StepAck, start,
		[]dialects.Lease{{ID: in[0], Token: until}, {ID: in[1], Token: token}, {ID: in[2], Token: token}})
	if !errors.As(err, &busy) || !slices.Equal(busy.IDs, []int64{in[1]}) || !slices.Equal(acked, []int64{in[0]}) {
		t.Fatalf("batched ack: acked %v, err %v; want [%d] acked and row %d busy", acked, err, in[0], in[1])
	}
	if _, ok := stateOf(t, d, tbl, in[0]); ok {
		t.Fatalf("row %d not acked", in[0])
	}
	if s, _ := stateOf(t, d, tbl, in[2]); !sameTime(s.LockedUntil, lostToken) {
		t.Fatalf("the lost row's other lease changed: %v", s.LockedUntil)
	}

	if err := other.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: start}, held[1]); !ok || err != nil {
		t.Fatalf("busy row's own ack: %v %v", ok, err)
	}
}
