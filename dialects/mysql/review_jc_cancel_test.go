package mysql

import (
	"testing"

	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// Cancel of a row whose lease ran out while its delivery still runs: the delivery's ack
// (and renewer) must find the row lost, whether Cancel kept the row or deleted it.
func TestReviewJCCancelFencesLateDelivery(t *testing.T) {
	d := newDialect(t)
	for _, shape := range []struct {
		name string
		keep bool
	}{{"processed_at", true}, {"deleted", false}} {
		t.Run(shape.name, func(t *testing.T) {
			tbl := dialecttest.LeaseTable(tableName(t, d, "rajc"))
			if shape.keep {
				tbl.ProcessedAt, tbl.Error = "processed_at", "error"
			}
			createTable(t, d, tbl)
			dialecttest.CancelFencesLateDelivery(t, d, tbl)
		})
	}
}
