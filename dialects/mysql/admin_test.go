package mysql

import (
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// TestStatsShapes: an empty table with groups has no group to report, one without groups
// one line of zeros; DATETIME(6) times equal to now are past; an advisory table with no
// time column binds no now, and counts the row whose key a session holds (GET_LOCK on
// LockName's name) as in work.
func TestStatsShapes(t *testing.T) {
	d := newDialect(t)
	grouped := newTable(t, d, "ra_stats", leaseTable)
	got, err := d.Stats(ctx, grouped, t0)
	if err != nil || len(got) != 0 {
		t.Errorf("empty table with groups: %+v, %v; want no groups", got, err)
	}
	plain := newTable(t, d, "ra_stats", func(name string) dialects.Table {
		return dialects.Table{Name: name, ID: "id", Payload: "payload", AdvisoryKey: name + "-{id}"}
	})
	got, err = d.Stats(ctx, plain, t0)
	if err != nil || len(got) != 1 || got[0].Due+got[0].Delayed+got[0].InWork+got[0].Processed+got[0].Oldest.ID != 0 || !got[0].InWorkCounted {
		t.Errorf("empty table without groups: %+v, %v; want one line of zeros", got, err)
	}

	mustExec(t, d.DB(), "INSERT INTO "+quote(grouped.Name)+" (payload, grp, retry_after, locked_until) VALUES "+
		"(x'00', 'q', ?, NULL), (x'00', 'q', ?, NULL), (x'00', 'q', NULL, ?)",
		dbTime(t0), dbTime(t0.Add(time.Microsecond)), dbTime(t0.Add(time.Microsecond)))
	got, err = d.Stats(ctx, grouped, t0)
	if err != nil || len(got) != 1 || got[0].Due != 1 || got[0].Delayed != 1 || got[0].InWork != 1 ||
		!got[0].Oldest.RetryAfter.Equal(dbTime(t0)) {
		t.Errorf("Stats = %+v, %v; want one due since t0, one delayed, one in work", got, err)
	}

	for range 2 {
		dialecttest.Publish(t, d, plain, dialects.Message{Payload: []byte("x")})
	}
	conn, err := d.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var database string
	if err := conn.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&database); err != nil {
		t.Fatal(err)
	}
	var locked int
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", LockName(database, plain.Name+"-1")).Scan(&locked); err != nil || locked != 1 {
		t.Fatalf("GET_LOCK: %d, %v", locked, err)
	}
	defer conn.ExecContext(ctx, "SELECT RELEASE_ALL_LOCKS()")
	got, err = d.Stats(ctx, plain, t0)
	if err != nil || len(got) != 1 || got[0].InWork != 1 || got[0].Due != 1 || got[0].Oldest.ID != 2 {
		t.Errorf("Stats = %+v, %v; want row 1 in work, row 2 due and next", got, err)
	}
}
