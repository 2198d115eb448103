package postgres

import (
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// TestSettleLeases settles many leases in one statement: rows that still hold their
// tokens are acked (deleted, or marked processed) or released; a row whose token moved on
// is left as it is and missing from the result.
func TestSettleLeases(t *testing.T) {
	for _, processed := range []bool{false, true} {
		d := newDialect(t)
		tbl := leaseTable(tableName(t, d))
		if processed {
			tbl.ProcessedAt = "processed_at"
		}
		createTable(t, d, tbl)
		for range 6 {
			publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("x")})
		}
		q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"}).(dialects.LeaseBatchQueue)
		until := t0.Add(30 * time.Second)
		rows, err := q.ClaimLeases(ctx, t0, until, 6)
		if err != nil || len(rows) != 6 {
			t.Fatalf("claimed %d rows: %v", len(rows), err)
		}
		held := make([]dialects.Lease, len(rows))
		for i, r := range rows {
			held[i] = dialects.Lease{ID: r.ID, Token: r.Token}
		}
		// Row 2's lease went to another claim.
		other := until.Add(time.Hour)
		mustExec(t, d, "UPDATE "+quote(tbl.Name)+" SET locked_until = $1 WHERE id = $2", other, held[2].ID)

		now := t0.Add(time.Second)
		acked, err := q.SettleLeases(ctx, dialects.StepAck, now, held[:3])
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(acked)
		if !slices.Equal(acked, []int64{held[0].ID, held[1].ID}) {
			t.Fatalf("acked %v, want %d and %d", acked, held[0].ID, held[1].ID)
		}
		released, err := q.SettleLeases(ctx, dialects.StepRelease, now, held[3:])
		if err != nil || len(released) != 3 {
			t.Fatalf("released %v: %v", released, err)
		}
		for i, l := range held {
			s, exists := stateOf(t, d, tbl, l.ID)
			switch {
			case i < 2 && processed:
				if !exists || s.ProcessedAt == nil || !sameTime(s.ProcessedAt, now) || s.LockedUntil != nil {
					t.Errorf("acked row %d: %+v", l.ID, s)
				}
			case i < 2:
				if exists {
					t.Errorf("acked row %d still exists", l.ID)
				}
			case i == 2:
				if !exists || !sameTime(s.LockedUntil, other) || s.ProcessedAt != nil {
					t.Errorf("the row another claim holds changed: %+v", s)
				}
			default:
				if !exists || s.LockedUntil != nil {
					t.Errorf("released row %d: %+v", l.ID, s)
				}
			}
		}
	}
}
