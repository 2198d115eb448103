package mysql

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// While the lease form's event transaction holds the row (the confirmation locks it), a
// renewal cannot move the lease between the confirmation and the event: it skips the row
// (reporting it busy, not lost), and once the event returned the row, finds it lost.
func TestEventLeaseLocksRow(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_evlock", leaseTable)
	fx := effectsTable(t, d)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true, Events: map[string]string{
		"park": "UPDATE " + quote(tbl.Name) + " SET grp = 'parked', locked_until = NULL WHERE id = {id}",
	}})
	held := dialecttest.ClaimOne(t, d, q, tbl)
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
