package sqlite

import (
	"errors"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// SQLite serves no row lock form, so a description without locked_until or an advisory
// key (rowactor cancel jobs 42 with no column flags) cannot be the one its consumers
// use: RetryNow and Cancel must refuse it, naming the fix, rather than change a row a
// lease holds without its fence.
func TestCancelAndRetryNowRefuseATableWithoutLockedUntil(t *testing.T) {
	d := newDialect(t)
	tbl := dialecttest.LeaseTable("rajc_form")
	tbl.ProcessedAt = "processed_at"
	createTable(t, d, tbl)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	held := dialecttest.ClaimOne(t, d, q, tbl) // in work until t0+1m
	bare := tbl
	bare.LockedUntil = ""
	for op, err := range map[string]error{
		"Cancel":   d.Cancel(ctx, bare, held.ID, t0, "x"),
		"RetryNow": d.RetryNow(ctx, bare, held.ID, t0),
	} {
		var ce *dialects.ConfigError
		if !errors.As(err, &ce) || ce.Option != "Table.LockedUntil" {
			t.Errorf("%s of a SQLite table described without locked_until or an advisory key: %v, want a *ConfigError on Table.LockedUntil", op, err)
		}
	}
	j, err := d.Inspect(ctx, tbl, held.ID, t0)
	if err != nil || j.State != dialects.JobInWork {
		t.Errorf("the row in work after the refusals: %+v, %v", j, err)
	}
}
