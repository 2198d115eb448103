package dashboard

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// fakeFinished answers FinishedPerMinute from a list of minutes, and records each since.
type fakeFinished struct {
	rows   []dialects.MinuteCount
	sinces []time.Time
}

func (f *fakeFinished) FinishedPerMinute(_ context.Context, _ dialects.Table, since time.Time) ([]dialects.MinuteCount, error) {
	f.sinces = append(f.sinces, since)
	var out []dialects.MinuteCount
	for _, m := range f.rows {
		if !m.Minute.Before(since) {
			out = append(out, m)
		}
	}
	return out, nil
}

// The chart's cache reads the hour once, then only the last two minutes, keeps what it
// read before, drops what leaves the hour, and reads the hour again after a gap.
func TestFinishedCache(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 30, 10, 0, time.UTC)
	minute := func(d int) time.Time { return t0.Truncate(time.Minute).Add(time.Duration(d) * time.Minute) }
	fc := &fakeFinished{rows: []dialects.MinuteCount{{Group: "g", Minute: minute(-59), Handled: 5}, {Group: "g", Minute: minute(-10), Handled: 2, Failed: 1},
		{Group: "g", Minute: minute(0), Handled: 1}, {Group: "h", Minute: minute(0), Failed: 7}, {NullGroup: true, Minute: minute(0), Handled: 9}}}
	var c finishedCache
	tb := Table{Table: rowactor.Table{Name: "jobs", Group: "queue"}}
	sum := func(ms []rowactor.ThroughputMinute) (h, f int64) {
		for _, m := range ms {
			h, f = h+m.Handled, f+m.Failed
		}
		return h, f
	}
	all, err := c.minutes(ctx, fc, tb, t0)
	if err != nil {
		t.Fatal(err)
	}
	ms := all["g"]
	if len(all) != 2 || all["h"][59].Failed != 7 {
		t.Errorf("groups: %v, want g and h (the NULL group left out)", all)
	}
	if h, f := sum(ms); h != 8 || f != 1 || !fc.sinces[0].Equal(minute(-59)) || !ms[59].Minute.Equal(minute(0)) || ms[59].Handled != 1 {
		t.Fatalf("first read: %d handled, %d failed, since %v", h, f, fc.sinces)
	}
	// A minute on: the current minute filled, a new one began.
	fc.rows[2].Handled = 4
	fc.rows = append(fc.rows, dialects.MinuteCount{Group: "g", Minute: minute(1), Failed: 2})
	all, _ = c.minutes(ctx, fc, tb, t0.Add(time.Minute))
	ms = all["g"]
	if h, f := sum(ms); h != 6 || f != 3 || !fc.sinces[1].Equal(minute(-1)) {
		// minute(-59) left the hour: 2 + 4 handled, 1 + 2 failed; read from the minute before the last read one
		t.Errorf("second read: %d handled, %d failed, since %v", h, f, fc.sinces)
	}
	if n := len(c.m["jobs"].counts["g"]); n != 3 {
		t.Errorf("the cache holds %d minutes, want the 3 of the hour: it must forget the others", n)
	}
	// Two hours on, the hour is read whole again.
	_, _ = c.minutes(ctx, fc, tb, t0.Add(2*time.Hour))
	if got := fc.sinces[2]; !got.Equal(minute(120 - 59)) {
		t.Errorf("after a gap: since %v, want the hour", got)
	}
}
