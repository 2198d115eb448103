package sqlite

import (
	"testing"

	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// HasFinishedIndex counts neither an index on an expression of processed_at nor one
// partial on processed_at IS NULL (the finished rows are not in it); one partial on
// processed_at IS NOT NULL, as FinishedIndexStatement renders, it does.
func TestHasFinishedIndexRefusesPartialAndExpression(t *testing.T) {
	d := newDialect(t)
	tbl := dialecttest.LeaseTable("jobs")
	tbl.ProcessedAt = "processed_at"
	createTable(t, d, tbl)
	has := func(when string, want bool) {
		t.Helper()
		got, err := d.HasFinishedIndex(ctx, tbl)
		if err != nil || got != want {
			t.Errorf("%s: HasFinishedIndex %v, %v; want %v", when, got, err, want)
		}
	}
	mustExec(t, d, "CREATE INDEX "+quote(tbl.Name+"_expr")+" ON "+quote(tbl.Name)+" (substr(processed_at, 1, 16))")
	has("an index on an expression", false)
	mustExec(t, d, "CREATE INDEX "+quote(tbl.Name+"_unfinished")+" ON "+quote(tbl.Name)+" (processed_at) WHERE processed_at IS NULL")
	has("an index partial on processed_at IS NULL", false)
	mustExec(t, d, "CREATE INDEX "+quote(tbl.Name+"_finished")+" ON "+quote(tbl.Name)+" (processed_at) WHERE processed_at IS NOT NULL")
	has("an index partial on processed_at IS NOT NULL", true)
}
