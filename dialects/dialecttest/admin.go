package dialecttest

import (
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

// adminScenarios are what the schema command and the admin tools ask of a dialect.
var adminScenarios = []scenario{
	{name: "ZeroDialectSchema", run: testZeroDialectSchema},
	{name: "NewLeavesThePoolToTheCaller", run: testNewLeavesThePoolToTheCaller},
}

// Schema reads only the description, so the zero Dialect (which cmd/rowactor's schema
// command uses, with no database) renders what an open one does, and refuses alike.
func testZeroDialectSchema(t *testing.T, h Harness) {
	e := setup(t, h)
	zero := h.Zero()
	for _, tbl := range []dialects.Table{
		leaseTable("jobs"),
		rowLockTable("a_table_name_long_enough_to_need_a_hashed_claim_index_name_xx"),
		rowLockTable("a_table_name_long_enough_to_need_the_fixed_claim_index_name_x"),
		{Name: "jobs", ID: "id", Payload: "payload", AdvisoryKey: "jobs-{account}", ProcessedAt: "processed_at"},
		{Name: "jobs", ID: "id"},
		{Name: "jobs", ID: "id", Payload: "payload", Mode: dialects.Immediate},
	} {
		want, wantErr := e.d.Schema(tbl)
		got, err := zero.Schema(tbl)
		if got != want || (err == nil) != (wantErr == nil) {
			t.Errorf("zero Dialect Schema(%+v) = %q, %v; an open one renders %q, %v", tbl, got, err, want, wantErr)
		}
	}
}

// A dialect made by New on the caller's pool leaves the pool open when it closes; its
// publishers and Open refuse afterwards (unless Caps.ClosedStillServes).
func testNewLeavesThePoolToTheCaller(t *testing.T, h Harness) {
	d, ping := h.OnCallerPool(t)
	e := &env{t: t, h: h, d: d, caps: h.Caps()}
	tbl := e.table("ra_new", leaseTable)
	if _, err := d.Open(ctx, dialects.QueueSpec{Table: tbl}); err != nil {
		t.Fatal(err)
	}
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ping(); err != nil {
		t.Fatalf("Close closed the caller's pool: %v", err)
	}
	if e.caps.ClosedStillServes {
		return
	}
	// The dialect's statements are gone with it.
	if _, err := p.Publish(ctx, nil, dialects.Message{Payload: []byte("x")}); err == nil {
		t.Error("a closed dialect published")
	}
	if _, err := d.Open(ctx, dialects.QueueSpec{Table: tbl}); err == nil {
		t.Error("a closed dialect opened a queue")
	}
}
