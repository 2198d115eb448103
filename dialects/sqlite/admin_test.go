package sqlite

import (
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// TestStatsTimeText: times are TimeLayout text, compared as text: a retry_after or a
// lease equal to now is past (due), one a microsecond later is not; the oldest due row's
// times are read back as times. The advisory form's keys live in the consuming process,
// so its rows in work cannot be counted.
func TestStatsTimeText(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("stats_text")
	tbl.ProcessedAt = "processed_at"
	createTable(t, d, tbl)
	later := formatTime(t0.Add(time.Microsecond))
	insert := func(column, value string) {
		mustExec(t, d, "INSERT INTO stats_text (payload, grp, "+column+") VALUES (x'00', 'q', ?)", value)
	}
	insert("retry_after", formatTime(t0))  // id 1: due since now
	insert("retry_after", later)           // delayed
	insert("locked_until", later)          // in work
	insert("locked_until", formatTime(t0)) // lease ran out now: due
	insert("processed_at", formatTime(t0)) // processed
	got, err := d.Stats(ctx, tbl, t0)
	if err != nil {
		t.Fatal(err)
	}
	want := dialects.GroupStats{Group: "q", Due: 2, Delayed: 1, InWork: 1, InWorkCounted: true, Processed: 1,
		Oldest: dialects.DueRow{ID: 1, RetryAfter: t0.Truncate(time.Microsecond)}}
	if len(got) != 1 || got[0].Group != want.Group || got[0].Due != want.Due || got[0].Delayed != want.Delayed ||
		got[0].InWork != want.InWork || !got[0].InWorkCounted || got[0].Processed != want.Processed ||
		got[0].Oldest.ID != 1 || !got[0].Oldest.RetryAfter.Equal(want.Oldest.RetryAfter) || !got[0].Oldest.LockedUntil.IsZero() {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}

	adv := dialects.Table{Name: "stats_text", ID: "id", Payload: "payload", Group: "grp", RetryAfter: "retry_after",
		ProcessedAt: "processed_at", AdvisoryKey: "k-{id}"}
	got, err = d.Stats(ctx, adv, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].InWorkCounted || got[0].InWork != 0 || got[0].Due != 3 {
		t.Errorf("advisory Stats = %+v, want rows in work uncounted, read as due (3)", got)
	}

	// No time column: nothing binds now.
	got, err = d.Stats(ctx, dialects.Table{Name: "stats_text", ID: "id", Payload: "payload", AdvisoryKey: "k-{id}"}, t0)
	if err != nil || len(got) != 1 || got[0].Due != 5 || got[0].Oldest.ID != 1 {
		t.Errorf("Stats without time columns = %+v, %v; want 5 rows due", got, err)
	}

	bad := tbl
	bad.Group = "queue"
	dialecttest.ConfigError(t, func() error { _, err := d.Stats(ctx, bad, t0); return err }())
	dialecttest.ConfigError(t, func() error {
		_, err := d.Requeue(ctx, dialects.RequeueSpec{Table: tbl, FromTable: "no_such_table"}, nil)
		return err
	}())
}
