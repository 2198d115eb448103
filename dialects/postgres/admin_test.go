package postgres

import (
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// TestRequeueOwnTypes: a table of the service's own making (an integer id GENERATED
// ALWAYS, a text payload, an integer attempt) takes its dead letters back with their ids.
func TestRequeueOwnTypes(t *testing.T) {
	d := newDialect(t)
	name, dead := tableName(t, d), tableName(t, d)
	for _, n := range []string{name, dead} {
		mustExec(t, d, "CREATE TABLE "+quote(n)+" (id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "+
			"body text NOT NULL, tries integer NOT NULL DEFAULT 1, not_before timestamptz)")
	}
	tbl := dialects.Table{Name: name, ID: "id", Payload: "body", Attempt: "tries", RetryAfter: "not_before", AdvisoryKey: "own-{id}"}
	mustExec(t, d, "INSERT INTO "+quote(dead)+" (id, body, tries, not_before) OVERRIDING SYSTEM VALUE "+
		"VALUES (41, 'a', 5, now() + interval '1 hour'), (42, 'b', 5, NULL)")
	n, err := d.Requeue(ctx, dialects.RequeueSpec{Table: tbl, FromTable: dead}, nil)
	if err != nil || n != 2 {
		t.Fatalf("Requeue = %d, %v; want 2 rows", n, err)
	}
	if got := count(t, d, "SELECT count(*) FROM "+quote(name)+" WHERE id IN (41, 42) AND tries = 1 AND not_before IS NULL"); got != 2 {
		t.Errorf("%d rows back with their ids, attempt 1 and no delay; want 2", got)
	}
	if got := count(t, d, "SELECT count(*) FROM "+quote(dead)); got != 0 {
		t.Errorf("the dead-letter table keeps %d rows", got)
	}
}

// TestStatsAdvisoryHeldKeys: a key a delivery holds (an exclusive session lock) puts its
// row in work; a candidate probe (a shared transaction lock, gone a moment later) does not.
func TestStatsAdvisoryHeldKeys(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d)
	tbl := dialects.Table{Name: name, ID: "id", Payload: "payload", AdvisoryKey: name + "-{id}"}
	createTable(t, d, tbl)
	for range 3 {
		dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("x")})
	}
	held, err := d.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	if _, err := held.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", name+"-1"); err != nil {
		t.Fatal(err)
	}
	defer held.Exec(ctx, "SELECT pg_advisory_unlock_all()")
	probe, err := d.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Rollback(ctx)
	if _, err := probe.Exec(ctx, "SELECT pg_try_advisory_xact_lock_shared(hashtextextended($1, 0))", name+"-2"); err != nil {
		t.Fatal(err)
	}
	got, err := d.Stats(ctx, tbl, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !got[0].InWorkCounted || got[0].InWork != 1 || got[0].Due != 2 || got[0].Oldest.ID != 2 {
		t.Errorf("Stats = %+v; want row 1 in work, rows 2 and 3 due, row 2 next", got)
	}
}
