package mysql

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// Another session holding one leased row's lock (a service's own transaction, a slow
// report) must not hold up the extension or the batched settlement of the other leases:
// a round that waited for that lock would keep every other lease of the round from moving
// and let them run out. The busy row is skipped, reported busy (still ours, not lost), and
// a batch leaves it for a settlement of its own.
func TestExtendAndBatchSkipARowAnotherSessionHolds(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_busy", leaseTable)
	var idsIn []int64
	for range 3 {
		idsIn = append(idsIn, publish(t, d, tbl, dialects.Message{Payload: []byte("p")}))
	}
	q := openLease(t, d, dialects.QueueSpec{Table: tbl})
	start := t0.Truncate(time.Second)
	token := start.Add(10 * time.Second)
	rows, err := q.ClaimLeases(ctx, start, token, 3)
	if err != nil || len(rows) != 3 {
		t.Fatalf("claim: %v %v", ids(rows), err)
	}
	held := []dialects.Lease{{ID: idsIn[0], Token: token}, {ID: idsIn[1], Token: token}, {ID: idsIn[2], Token: token}}

	// The outside session locks the middle row and keeps it.
	other, err := d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback()
	if _, err := other.ExecContext(ctx, "SELECT id FROM "+quote(tbl.Name)+" WHERE id = ? FOR UPDATE", idsIn[1]); err != nil {
		t.Fatal(err)
	}

	// A row whose lease was lost meanwhile is reported lost, not busy.
	lostToken := token.Add(time.Hour)
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET locked_until = ? WHERE id = ?", dbTime(lostToken), idsIn[2])

	until := token.Add(20 * time.Second)
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	moved, err := q.ExtendLeases(short, until, held)
	var busy *dialects.RowsBusyError
	if !errors.As(err, &busy) {
		t.Fatalf("extension: moved %v, err %v; want a RowsBusyError for row %d", moved, err, idsIn[1])
	}
	if !slices.Equal(moved, []int64{idsIn[0]}) || !slices.Equal(busy.IDs, []int64{idsIn[1]}) {
		t.Fatalf("extension moved %v, busy %v; want moved [%d], busy [%d]", moved, busy.IDs, idsIn[0], idsIn[1])
	}
	s, _ := stateOf(t, d, tbl, idsIn[0])
	sameTime(t, "free row's lease", s.LockedUntil, until)

	// A batched ack of the held row and the free one: the free one is acked at once.
	acked, err := q.(dialects.LeaseBatchQueue).SettleLeases(short, dialects.StepAck, start,
		[]dialects.Lease{{ID: idsIn[0], Token: until}, {ID: idsIn[1], Token: token}, {ID: idsIn[2], Token: token}})
	if !errors.As(err, &busy) || !slices.Equal(busy.IDs, []int64{idsIn[1]}) || !slices.Equal(acked, []int64{idsIn[0]}) {
		t.Fatalf("batched ack: acked %v, err %v; want [%d] acked and row %d busy", acked, err, idsIn[0], idsIn[1])
	}
	if _, ok := stateOf(t, d, tbl, idsIn[0]); ok {
		t.Fatalf("row %d not acked", idsIn[0])
	}
	s, _ = stateOf(t, d, tbl, idsIn[2])
	sameTime(t, "the lost row's other lease", s.LockedUntil, lostToken)

	// Once the other session ends, the busy row is still ours and settles alone.
	if err := other.Rollback(); err != nil {
		t.Fatal(err)
	}
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: start}, held[1]); !ok || err != nil {
		t.Fatalf("busy row's own ack: %v %v", ok, err)
	}
}
