package dialecttest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// retentionScenarios are the Retainer's.
var retentionScenarios = []scenario{
	{name: "RetainRound", run: testRetainRound},
	{name: "RoundLockHeldElsewhere", run: testRoundLockHeldElsewhere,
		applies: func(h Harness) bool { _, ok := h.(KeyInspector); return ok }},
}

// retentionTable has three rows finished two hours before t0, one finished at t0 and one
// queued; it returns the table and the old rows' ids.
func retentionTable(e *env, prefix string) (dialects.Table, []int64, []int64) {
	tbl := e.table(prefix, func(name string) dialects.Table {
		tb := leaseTable(name)
		tb.ProcessedAt = "processed_at"
		return tb
	})
	var old []int64
	for range 3 {
		id := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("old")})
		e.exec("UPDATE "+e.q(tbl.Name)+" SET processed_at = ? WHERE id = ?", e.h.TimeArg(t0.Add(-2*time.Hour)), id)
		old = append(old, id)
	}
	recent := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("recent")})
	e.exec("UPDATE "+e.q(tbl.Name)+" SET processed_at = ? WHERE id = ?", e.h.TimeArg(t0), recent)
	queued := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("queued")})
	return tbl, old, []int64{recent, queued}
}

func retainer(t *testing.T, d dialects.Dialect) dialects.Retainer {
	t.Helper()
	r, ok := d.(dialects.Retainer)
	if !ok {
		t.Fatalf("%T is not a dialects.Retainer", d)
	}
	return r
}

// A round deletes every row finished before the cutoff, limit a statement, and lets its
// lock go; recent finished rows and unfinished ones stay. A description the table does
// not match is refused by the check (limit 0).
func testRetainRound(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl, old, kept := retentionTable(e, "ra_ret")
	r := retainer(t, e.d)
	cutoff := t0.Add(-time.Hour)
	lock := e.name("ra_retlock")
	if n, led, err := r.RetainRound(ctx, tbl, lock, cutoff, 2); err != nil || !led || n != 3 {
		t.Fatalf("RetainRound: %d %v %v, want 3 rows deleted", n, led, err)
	}
	for _, id := range old {
		if _, ok := e.state(tbl, id); ok {
			t.Errorf("old finished row %d outlived retention", id)
		}
	}
	for _, id := range kept {
		if _, ok := e.state(tbl, id); !ok {
			t.Errorf("row %d was deleted", id)
		}
	}
	// The round let its lock go: another dialect's round leads.
	if n, led, err := retainer(t, e.other().d).RetainRound(ctx, tbl, lock, cutoff, 2); err != nil || !led || n != 0 {
		t.Fatalf("a later round: %d %v %v, want led and 0 rows", n, led, err)
	}
	wrong := tbl
	wrong.ProcessedAt = "no_such_column"
	var ce *dialects.ConfigError
	if _, _, err := r.RetainRound(ctx, wrong, lock, cutoff, 0); !errors.As(err, &ce) {
		t.Errorf("a check of a description the table does not match: %v, want a *ConfigError", err)
	}
}

// While another session holds the round's lock, a round does not lead and deletes
// nothing; once it is free, the round runs.
func testRoundLockHeldElsewhere(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl, old, _ := retentionTable(e, "ra_reth")
	r := retainer(t, e.d)
	lock := e.name("ra_retlock")
	hold := h.(KeyInspector).HoldKey(t, e.d, dialects.LockKey(lock))
	var once sync.Once
	release := func() { once.Do(hold) }
	t.Cleanup(release) // a failing check must not leave the key's connection held
	if n, led, err := r.RetainRound(ctx, tbl, lock, t0, 2); err != nil || led || n != 0 {
		t.Fatalf("a round whose lock another session holds: %d %v %v, want not led", n, led, err)
	}
	if _, ok := e.state(tbl, old[0]); !ok {
		t.Fatal("a round that did not lead deleted rows")
	}
	release()
	if n, led, err := r.RetainRound(ctx, tbl, lock, t0, 2); err != nil || !led || n != 3 {
		t.Fatalf("the round once the lock is free: %d %v %v", n, led, err)
	}
}
