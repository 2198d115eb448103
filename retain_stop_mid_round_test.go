package rowactor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
)

var retainStopMidRoundScenarios = []scenario{
	{
		name:   "retain Stop mid-round leaves no round key on a pooled connection, another leads at once, and the table can be retained again",
		forms:  []rowactor.Form{rowactor.FormLease},
		shapes: []tableShape{withProcessedAt},
		run:    retainStopMidRoundScenario,
	},
}

// retainStopMidRoundScenario: a Retain stopped in the middle of a round leaves its round
// key held on no pooled connection, so another process leads a round at once and the
// table can be retained again.
func retainStopMidRoundScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	const rows = 10000
	switch d := h.d.(type) {
	case *postgres.Dialect:
		if _, err := d.Pool().Exec(ctx, fmt.Sprintf("INSERT INTO %q (grp, payload, processed_at) SELECT 'q', 'x', now() - interval '2 hours' FROM generate_series(1, %d)", h.table.Name, rows)); err != nil {
			t.Fatal(err)
		}
	case *mysql.Dialect:
		ten := "(SELECT 1 n UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9 UNION ALL SELECT 10)"
		if _, err := d.DB().ExecContext(ctx, fmt.Sprintf("INSERT INTO `%s` (grp, payload, processed_at) SELECT 'q', 'x', NOW(6) - INTERVAL 2 HOUR FROM %s a, %s b, %s c, %s d",
			h.table.Name, ten, ten, ten, ten)); err != nil {
			t.Fatal(err)
		}
	default:
		t.Skip("session locks")
	}
	small, _ := sizedDialect(t, h, 1)
	b := h.brokerOn(small)
	count := func() int { return h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)) }
	for i := 0; i < 3; i++ {
		r, err := b.Retain(ctx, h.table, time.Hour, rowactor.RetainEvery(time.Hour), rowactor.RetainBatch(1))
		if err != nil {
			t.Fatalf("Retain #%d (after a Stop): %v", i, err)
		}
		start := count()
		waitUntil(t, "the round to delete", func() bool { return count() < start-5 })
		r.Stop()
		if n := count(); n == 0 {
			t.Fatal("the round finished before the Stop: too few rows")
		}
		if pd, ok := h.d.(*postgres.Dialect); ok {
			holder := func() string {
				var st string
				err := pd.Pool().QueryRow(ctx, "SELECT coalesce(string_agg(a.pid::text || ' ' || coalesce(a.state, '?') || ' ' || left(coalesce(a.query, ''), 60), '; '), '') FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted"+
					" AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended($1, 0)", dialects.LockKey("retain:"+h.table.Name)).Scan(&st)
				if err != nil {
					t.Fatal(err)
				}
				return st
			}
			if st := holder(); st != "" {
				t.Fatalf("right after Stop, the round key is held: %s", st)
			}
		}
		// Another process leads a round at once.
		other := h.newD().(dialects.Retainer)
		_, led, err := other.RetainRound(ctx, h.table, "retain:"+h.table.Name, time.Now().Add(-3*time.Hour), 1)
		if err != nil || !led {
			t.Fatalf("another process after the Stop: led %v, %v", led, err)
		}
	}
}
