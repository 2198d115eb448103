package rowactor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/postgres"
)

func init() {
	scenarios = append(scenarios, scenario{
		name:   "review ret: a round whose session is killed mid-delete stops deleting before another leads",
		forms:  []rowactor.Form{rowactor.FormLease},
		shapes: []tableShape{withProcessedAt},
		run:    reviewRetTwoLeadersScenario,
	})
}

func reviewRetTwoLeadersScenario(t *testing.T, h *harness, _ rowactor.Form) {
	pd, ok := h.d.(*postgres.Dialect)
	if !ok {
		t.Skip("PostgreSQL's pg_terminate_backend")
	}
	ctx := context.Background()
	if _, err := pd.Pool().Exec(ctx, fmt.Sprintf("INSERT INTO %q (grp, payload, processed_at) SELECT 'q', 'x', now() - interval '2 hours' FROM generate_series(1, 20000)", h.table.Name)); err != nil {
		t.Fatal(err)
	}
	b1, b2 := h.broker(), h.second()
	r1, err := b1.Retain(ctx, h.table, time.Hour, rowactor.RetainEvery(time.Hour), rowactor.RetainBatch(1))
	if err != nil {
		t.Fatal(err)
	}
	// Its round runs (and its count is told at the round's end): watch the table.
	waitUntil(t, "the first round to delete", func() bool {
		return h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)) < 20000-10
	})
	if _, err := b2.Retain(ctx, h.table, time.Hour, rowactor.RetainEvery(20*time.Millisecond), rowactor.RetainBatch(1)); err != nil {
		t.Fatal(err)
	}
	// The session holding this table's round key, and only it: other tests' sessions
	// hold advisory keys too.
	key := dialects.LockKey("retain:" + h.table.Name)
	var killed int
	if err := pd.Pool().QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND granted"+
		" AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 0)", key).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("kill the round's session: %d %v", killed, err)
	}
	// A count is told at its round's end: the killed round's once it ended; the second
	// broker's round may run for seconds. The table tells who deletes meanwhile.
	waitUntil(t, "the killed round to end", func() bool { return r1.Deleted() > 0 })
	left := func() int { return h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)) }
	c := left()
	waitUntil(t, "the second broker to delete", func() bool { return left() < c-10 })
	a1 := r1.Deleted()
	time.Sleep(300 * time.Millisecond)
	if a2 := r1.Deleted(); a2 != a1 || a1 >= 20000 {
		t.Fatalf("the killed round deleted %d rows, then %d more after the second led; want its round ended with its session", a1, a2-a1)
	}
}
