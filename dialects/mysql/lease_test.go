package mysql

import (
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// The copy matches the token but the delete does not (the row was taken between the two
// statements): the move rolls back.
func TestMoveRollsBackWhenTheDeleteMisses(t *testing.T) {
	d := newDialect(t)
	noGroup := func(name string) dialects.Table {
		tbl := leaseTable(name)
		tbl.Group = ""
		return tbl
	}
	tbl := newTable(t, d, "ra_mv", noGroup)
	dead := newTable(t, d, "ra_mv_dead", noGroup)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, DeadLetterTable: dead.Name}).(*leaseQueue)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 {
		t.Fatal(err)
	}
	// A delete that names another token stands in for a row re-leased in between.
	q.settle.moveDelete = "DELETE FROM " + quote(tbl.Name) + " WHERE id = ? AND locked_until = ? AND FALSE"
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, dialects.Lease{ID: id, Token: rows[0].Token}); ok || err != nil {
		t.Fatalf("move: %v %v", ok, err)
	}
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(dead.Name)); n != 0 {
		t.Fatal("the copy was committed")
	}
	if _, ok := stateOf(t, d, tbl, id); !ok {
		t.Fatal("the row is gone")
	}
}
