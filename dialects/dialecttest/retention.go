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
	{name: "RetainDeadLetters", run: testRetainDeadLetters},
	{name: "DeadAtSetByMoveClearedByRequeue", run: testDeadAtSetByMove},
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

// deadTable is the lease table with a dead_at column, and an error column that a move
// into a dead-letter table binds beside it.
func deadTable(name string) dialects.Table {
	tb := leaseTable(name)
	tb.DeadAt, tb.Error = "dead_at", "last_error"
	return tb
}

func deadRetainer(t *testing.T, d dialects.Dialect) dialects.DeadLetterRetainer {
	t.Helper()
	r, ok := d.(dialects.DeadLetterRetainer)
	if !ok {
		t.Fatalf("%T is not a dialects.DeadLetterRetainer", d)
	}
	return r
}

// A round of a dead-letter group deletes the group's rows that died before the cutoff,
// limit a statement, and lets its lock go. It keeps the rows that died since, the rows
// whose dead_at is NULL, the rows of other groups (another dead-letter group, the queue)
// and a row a subscription of the group leases past the cutoff. A description without
// dead_at or group, no group named, or a dead_at the table lacks are refused.
func testRetainDeadLetters(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_retd", deadTable)
	died := func(group string, at time.Time) int64 {
		id := e.publish(tbl, dialects.Message{Group: group, Payload: []byte("x")})
		if !at.IsZero() {
			e.exec("UPDATE "+e.q(tbl.Name)+" SET dead_at = ? WHERE id = ?", h.TimeArg(at), id)
		}
		return id
	}
	long := t0.Add(-2 * time.Hour)
	var old []int64
	for range 3 {
		old = append(old, died("dead", long))
	}
	leased := died("dead", long)
	e.exec("UPDATE "+e.q(tbl.Name)+" SET locked_until = ? WHERE id = ?", h.TimeArg(t0.Add(time.Minute)), leased)
	kept := map[string]int64{
		"died since the cutoff":        died("dead", t0),
		"dead_at NULL":                 died("dead", time.Time{}),
		"of another dead-letter group": died("dead2", long),
		"queued":                       died("g", time.Time{}),
		"leased past the cutoff":       leased,
	}
	r := deadRetainer(t, e.d)
	cutoff := t0.Add(-time.Hour)
	lock := e.name("ra_retdlock")
	if n, led, err := r.RetainDeadLetters(ctx, tbl, "dead", lock, cutoff, 2); err != nil || !led || n != 3 {
		t.Fatalf("RetainDeadLetters: %d %v %v, want 3 rows deleted", n, led, err)
	}
	for _, id := range old {
		if _, ok := e.state(tbl, id); ok {
			t.Errorf("dead letter %d outlived retention", id)
		}
	}
	for what, id := range kept {
		if _, ok := e.state(tbl, id); !ok {
			t.Errorf("row %d (%s) was deleted", id, what)
		}
	}
	// The round let its lock go: another dialect's round leads.
	if n, led, err := deadRetainer(t, e.other().d).RetainDeadLetters(ctx, tbl, "dead", lock, cutoff, 2); err != nil || !led || n != 0 {
		t.Fatalf("a later round: %d %v %v, want led and 0 rows", n, led, err)
	}
	for _, c := range []struct {
		what, group, option string
		edit                func(*dialects.Table)
	}{
		{"a table without dead_at", "dead", "Table.DeadAt", func(tb *dialects.Table) { tb.DeadAt = "" }},
		{"a table without a group", "dead", "Table.Group", func(tb *dialects.Table) { tb.Group = "" }},
		{"no group named", "", "RetainDeadLetters", func(*dialects.Table) {}},
		{"a dead_at the table lacks", "dead", "Table.DeadAt", func(tb *dialects.Table) { tb.DeadAt = "no_such_column" }},
	} {
		wrong := tbl
		c.edit(&wrong)
		var ce *dialects.ConfigError
		if _, _, err := r.RetainDeadLetters(ctx, wrong, c.group, lock, cutoff, 0); !errors.As(err, &ce) || ce.Option != c.option {
			t.Errorf("%s: %v, want a *ConfigError naming %s", c.what, err, c.option)
		}
	}
}

// Every dead-letter move writes the settlement's now into dead_at: into a dead-letter
// group in each form, and into a dead-letter table (the moved row arrives with it); a
// requeue, from the group or from the table, clears it.
func testDeadAtSetByMove(t *testing.T, h Harness) {
	e := setup(t, h)
	admin, ok := e.d.(dialects.Admin)
	if !ok {
		t.Fatalf("%T is not a dialects.Admin", e.d)
	}
	// diedAt reports whether row id of table sits in group (when not "") with dead_at at
	// t0 (as the database stores it: within a second).
	diedAt := func(table string, id int64, group string) bool {
		q := "SELECT COUNT(*) FROM " + e.q(table) + " WHERE id = ? AND dead_at > ? AND dead_at < ?"
		args := []any{id, h.TimeArg(t0.Add(-time.Second)), h.TimeArg(t0.Add(time.Second))}
		if group != "" {
			q += " AND grp = ?"
			args = append(args, group)
		}
		return e.count(q, args...) == 1
	}
	undead := func(table string, id int64) bool {
		return e.count("SELECT COUNT(*) FROM "+e.q(table)+" WHERE id = ? AND dead_at IS NULL AND grp = 'g'", id) == 1
	}
	requeue := func(spec dialects.RequeueSpec) {
		t.Helper()
		if n, err := admin.Requeue(ctx, spec, nil); err != nil || n != 1 {
			t.Fatalf("requeue %+v: %d, %v", spec, n, err)
		}
	}
	step := dialects.Step{Kind: dialects.StepDeadLetter, Now: t0}

	// The lease form, into a group, and back.
	tbl := e.table("ra_dead", deadTable)
	lid := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("lease")})
	DeadLetterOne(t, e.openLease(dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"}))
	if !diedAt(tbl.Name, lid, "dead") {
		t.Errorf("the lease form's move into the dead-letter group left dead_at unset")
	}
	requeue(dialects.RequeueSpec{Table: tbl, FromGroup: "dead", ToGroup: "g"})
	if !undead(tbl.Name, lid) {
		t.Errorf("a requeue from the group kept dead_at")
	}

	// Into a dead-letter table rendered from the same description, with the outcome's
	// error, and back.
	dead := e.table("ra_dead_tbl", deadTable)
	lq := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterTable: dead.Name})
	rows, err := lq.ClaimLeases(ctx, t0, t0.Add(30*time.Second), 1)
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v, %v", rows, err)
	}
	failed := step
	failed.Error = "boom"
	if ok, err := lq.SettleLease(ctx, failed, dialects.Lease{ID: rows[0].ID, Token: rows[0].Token}); err != nil || !ok {
		t.Fatalf("dead-letter move: %v, %v", ok, err)
	}
	if !diedAt(dead.Name, lid, "g") {
		t.Errorf("the move into the dead-letter table left dead_at unset")
	}
	if e.count("SELECT COUNT(*) FROM "+e.q(dead.Name)+" WHERE id = ? AND last_error = 'boom'", lid) != 1 {
		t.Errorf("the move into the dead-letter table lost the outcome's error")
	}
	requeue(dialects.RequeueSpec{Table: tbl, FromTable: dead.Name})
	if !undead(tbl.Name, lid) {
		t.Errorf("a requeue from the dead-letter table kept dead_at")
	}

	// The row lock form.
	if e.caps.RowLock {
		rl := e.table("ra_deadrl", func(name string) dialects.Table {
			tb := rowLockTable(name)
			tb.DeadAt = "dead_at"
			return tb
		})
		id := e.publish(rl, dialects.Message{Group: "g", Payload: []byte("rowlock")})
		q := OpenRowLock(t, e.d, dialects.QueueSpec{Table: rl, Group: "g", DeadLetterGroup: "dead"})
		if err := claimLocked(t, q, t0).Settle(ctx, step); err != nil {
			t.Fatal(err)
		}
		if !diedAt(rl.Name, id, "dead") {
			t.Errorf("the row lock form's move left dead_at unset")
		}
	}

	// The advisory form, on a session that holds no key.
	adv := e.table("ra_deadadv", func(name string) dialects.Table {
		tb := advisoryTable(name)
		tb.Group, tb.DeadAt = "grp", "dead_at"
		return tb
	})
	id := e.publish(adv, dialects.Message{Group: "g", Payload: []byte("advisory")})
	aq := e.openAdvisory(dialects.QueueSpec{Table: adv, Group: "g", DeadLetterGroup: "dead"})
	if err := e.session(aq).Settle(ctx, step, id); err != nil {
		t.Fatal(err)
	}
	if !diedAt(adv.Name, id, "dead") {
		t.Errorf("the advisory form's move left dead_at unset")
	}
}
