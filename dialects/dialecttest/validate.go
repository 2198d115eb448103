package dialecttest

import (
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

// validateScenarios are Open's checks of a subscription against the live database.
var validateScenarios = []scenario{
	{name: "OpenRefuses", run: testOpenRefuses},
}

// A description that cannot work is refused by Open with a *ConfigError that names the
// table, the column and the option, and says why; the harness adds the refusals only its
// database makes (Refuser).
func testOpenRefuses(t *testing.T, h Harness) {
	e := setup(t, h)
	jobs := e.table("ra_val", leaseTable).Name
	dead := e.name("ra_val_dead")
	ty := e.caps.Types
	e.exec("CREATE TABLE " + e.q(dead) + " (id " + ty.ID + ", payload " + ty.Blob + ", grp " + ty.Text + ", attempt " + ty.Int +
		", retry_after " + ty.Time + ", locked_until " + ty.Time + ")")
	missing := e.name("ra_val_nope")
	graveyard := e.name("ra_val_graveyard")

	with := func(edit func(*dialects.Table)) dialects.Table {
		tbl := leaseTable(jobs)
		edit(&tbl)
		return tbl
	}
	cases := []Refusal{
		{"missing column", dialects.QueueSpec{Table: with(func(t *dialects.Table) { t.ProcessedAt = "done_at" })},
			"done_at", "Table.ProcessedAt", "no such column"},
		{"missing key column", dialects.QueueSpec{Table: with(func(t *dialects.Table) { t.LockedUntil = ""; t.AdvisoryKey = "k-{account}" })},
			"account", "Table.AdvisoryKey", "no such column"},
		{"missing table", dialects.QueueSpec{Table: leaseTable(missing)}, "", "", "does not exist"},
		{"database clock", dialects.QueueSpec{Table: with(func(t *dialects.Table) { t.DatabaseClock = true })},
			"", "Table.DatabaseClock", "host"},
		{"dead-letter table missing", dialects.QueueSpec{Table: leaseTable(jobs), DeadLetterTable: graveyard},
			"", "DeadLetterTable", `"` + graveyard + `" does not exist`},
		{"dead-letter table lacks a column", dialects.QueueSpec{Table: leaseTable(jobs), DeadLetterTable: dead},
			"headers", "DeadLetterTable", `dead-letter table "` + dead + `" has no column "headers"`},
		{"dead-letter group without group", dialects.QueueSpec{Table: with(func(t *dialects.Table) { t.Group = "" }), DeadLetterGroup: "dead"},
			"", "DeadLetterGroup", "group column"},
		{"both dead letters", dialects.QueueSpec{Table: leaseTable(jobs), DeadLetterGroup: "dead", DeadLetterTable: dead},
			"", "DeadLetterTable", "not both"},
	}
	if r, ok := h.(Refuser); ok {
		cases = append(cases, r.Refusals(t, e.d, jobs, dead)...)
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			q, err := e.d.Open(ctx, c.Spec)
			if err == nil {
				q.Close()
				t.Fatal("Open accepted the spec")
			}
			ce := configError(t, err)
			if ce.Table != c.Spec.Table.Name || ce.Column != c.Column || ce.Option != c.Option {
				t.Errorf("table %q column %q option %q; want %q %q %q (%v)", ce.Table, ce.Column, ce.Option,
					c.Spec.Table.Name, c.Column, c.Option, err)
			}
			contains(t, err.Error(), c.Reason)
		})
	}
}
