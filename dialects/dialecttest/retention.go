package dialecttest

import (
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// retentionScenarios are the Elector's and the Retainer's.
var retentionScenarios = []scenario{
	{name: "DeleteProcessed", run: testDeleteProcessed},
	{name: "OneLeader", run: testOneLeader},
}

// Finished rows older than the cutoff go, lowest ids first, limit at a time; recent
// finished rows and unfinished ones stay.
func testDeleteProcessed(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_ret", func(name string) dialects.Table {
		tb := leaseTable(name)
		tb.ProcessedAt = "processed_at"
		return tb
	})
	var old []int64
	for range 3 {
		id := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("old")})
		e.exec("UPDATE "+e.q(tbl.Name)+" SET processed_at = ? WHERE id = ?", h.TimeArg(t0.Add(-2*time.Hour)), id)
		old = append(old, id)
	}
	recent := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("recent")})
	e.exec("UPDATE "+e.q(tbl.Name)+" SET processed_at = ? WHERE id = ?", h.TimeArg(t0), recent)
	queued := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("queued")})
	r, ok := e.d.(dialects.Retainer)
	if !ok {
		t.Fatalf("%T is not a dialects.Retainer", e.d)
	}
	cutoff := t0.Add(-time.Hour)
	for _, want := range []int64{2, 1, 0} {
		n, err := r.DeleteProcessed(ctx, tbl, cutoff, 2)
		if err != nil || n != want {
			t.Fatalf("DeleteProcessed: %d %v, want %d", n, err, want)
		}
	}
	for _, id := range old {
		if _, ok := e.state(tbl, id); ok {
			t.Errorf("old finished row %d outlived retention", id)
		}
	}
	for _, id := range []int64{recent, queued} {
		if _, ok := e.state(tbl, id); !ok {
			t.Errorf("row %d was deleted", id)
		}
	}
	wrong := tbl
	wrong.ProcessedAt = "no_such_column"
	var ce *dialects.ConfigError
	if _, err := r.DeleteProcessed(ctx, wrong, cutoff, 0); !errors.As(err, &ce) {
		t.Errorf("a check of a description the table does not match: %v, want a *ConfigError", err)
	}
}

// One dialect leads a name; another on the same database does not until the leader
// resigns; names are independent.
func testOneLeader(t *testing.T, h Harness) {
	e := setup(t, h)
	o := e.other()
	a, ok1 := e.d.(dialects.Elector)
	b, ok2 := o.d.(dialects.Elector)
	if !ok1 || !ok2 {
		t.Fatalf("%T is not a dialects.Elector", e.d)
	}
	name := e.name("ra_lead")
	la, ok, err := a.Lead(ctx, name)
	if err != nil || !ok {
		t.Fatalf("the first Lead: %v %v", ok, err)
	}
	if err := la.Alive(ctx); err != nil {
		t.Fatalf("Alive: %v", err)
	}
	if _, ok, err := b.Lead(ctx, name); err != nil || ok {
		t.Fatalf("a second leader of %s: %v %v", name, ok, err)
	}
	lo, ok, err := b.Lead(ctx, name+"_other")
	if err != nil || !ok {
		t.Fatalf("another name: %v %v", ok, err)
	}
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	lb, ok, err := b.Lead(ctx, name)
	if err != nil || !ok {
		t.Fatalf("Lead after the leader resigned: %v %v", ok, err)
	}
	for _, l := range []dialects.Leadership{lb, lo} {
		if err := l.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// WaitLeads waits up to 5 s for el to lead name (its leader's session ended, say), then
// resigns; it fails t if el never leads.
func WaitLeads(t *testing.T, el dialects.Elector, name string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, ok, err := el.Lead(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if err := l.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was not handed over within 5 s", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
