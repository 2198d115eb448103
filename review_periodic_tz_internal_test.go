package rowactor

import (
	"slices"
	"testing"
	"time"
)

// Review: a cron schedule's runs are computed in its zone whatever zone the times come
// in: publishDue hands dueRuns the newest run parsed back from its key, in UTC. Here the
// zone is CRON_TZ's (Asia/Kolkata, +05:30, and America/New_York); the process's own
// zone, which robfig takes from the time it is given, is checked by a child process run
// with TZ set (TestReviewPeriodicProcess/tz).
func TestReviewPeriodicCronLocalZoneFromStoredKey(t *testing.T) {
	for _, zone := range []string{"Asia/Kolkata", "America/New_York"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		hourly, err := Cron("CRON_TZ=" + zone + " 0 * * * *") // the zone's hours
		if err != nil {
			t.Fatal(err)
		}
		daily, err := Cron("CRON_TZ=" + zone + " 0 3 * * *") // 03:00 in the zone
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name string
			s    Schedule
			// prev is the run the table holds; now is the round's time, local.
			prev, now time.Time
		}{
			// The round of the next local hour, on time: only that run is due.
			{"hourly on time", hourly, time.Date(2030, 1, 1, 10, 0, 0, 0, loc), time.Date(2030, 1, 1, 11, 0, 0, 300e6, loc)},
			// The next day's 03:00 local, on time.
			{"daily on time", daily, time.Date(2030, 1, 1, 3, 0, 0, 0, loc), time.Date(2030, 1, 2, 3, 0, 0, 300e6, loc)},
		}
		for _, c := range cases {
			// As publishDue: the newest key, parsed back.
			key := c.prev.UTC().Format(periodicKeyTime)
			after, err := time.Parse(periodicKeyTime, key)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range dueRuns(c.s, after, time.Time{}, c.now, false) {
				got = append(got, r.UTC().Format(periodicKeyTime))
			}
			want := []string{c.now.Truncate(time.Second).UTC().Format(periodicKeyTime)}
			if !slices.Equal(got, want) {
				t.Errorf("%s in %s: runs %v, want only %v (the schedule's local run); the stored key's UTC location made robfig compute runs in UTC",
					c.name, zone, got, want)
			}
		}
	}
}
