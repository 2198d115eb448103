package rowactor

import (
	"slices"
	"testing"
	"time"
)

func TestDueRuns(t *testing.T) {
	t.Parallel()
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	daily, err := Cron("CRON_TZ=UTC 0 3 * * *")
	if err != nil {
		t.Fatal(err)
	}
	everyHour, err := Cron("@every 1h")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := everyHour.(every); !ok {
		t.Fatalf("@every 1h parsed as %T, want Every's aligned schedule", everyHour)
	}
	cases := []struct {
		name              string
		s                 Schedule
		after, since, now string
		skip              bool
		want              []string
	}{
		{"on time", Every(time.Second), "2030-01-01T00:00:09Z", "2000-01-01T00:00:00Z", "2030-01-01T00:00:10.2Z", false, []string{"2030-01-01T00:00:10Z"}},
		{"nothing due", Every(time.Second), "2030-01-01T00:00:10Z", "2000-01-01T00:00:00Z", "2030-01-01T00:00:10.9Z", false, nil},
		{"late runs each", Every(time.Second), "2030-01-01T00:00:07Z", "2000-01-01T00:00:00Z", "2030-01-01T00:00:10.2Z", false,
			[]string{"2030-01-01T00:00:08Z", "2030-01-01T00:00:09Z", "2030-01-01T00:00:10Z"}},
		{"missed once, then the last minute", Every(20 * time.Second), "2030-01-01T00:00:00Z", "2000-01-01T00:00:00Z", "2030-01-01T00:10:05Z", false,
			[]string{"2030-01-01T00:09:00Z", "2030-01-01T00:09:20Z", "2030-01-01T00:09:40Z", "2030-01-01T00:10:00Z"}},
		{"missed skipped", Every(20 * time.Second), "2030-01-01T00:00:00Z", "2000-01-01T00:00:00Z", "2030-01-01T00:10:05Z", true,
			[]string{"2030-01-01T00:09:20Z", "2030-01-01T00:09:40Z", "2030-01-01T00:10:00Z"}},
		{"daily, missed during a week's outage", daily, "2030-01-01T03:00:00Z", "2000-01-01T00:00:00Z", "2030-01-08T05:00:00Z", false, []string{"2030-01-08T03:00:00Z"}},
		{"daily, missed and skipped", daily, "2030-01-01T03:00:00Z", "2000-01-01T00:00:00Z", "2030-01-08T05:00:00Z", true, nil},
		{"daily, a round 10 s late", daily, "2030-01-07T03:00:00Z", "2000-01-01T00:00:00Z", "2030-01-08T03:00:10Z", true, []string{"2030-01-08T03:00:00Z"}},
		{"a 30 s outage: the runs before the restart were missed", Every(time.Second), "2030-01-01T00:00:00Z", "2030-01-01T00:00:30.5Z",
			"2030-01-01T00:00:31.2Z", false, []string{"2030-01-01T00:00:30Z", "2030-01-01T00:00:31Z"}},
		{"a 30 s outage, skipped", Every(time.Second), "2030-01-01T00:00:00Z", "2030-01-01T00:00:30.5Z", "2030-01-01T00:00:31.2Z", true,
			[]string{"2030-01-01T00:00:31Z"}},
		// A broker that found another holding the job's lock passes the zero time as since:
		// it takes over a job that was running, and nothing after the newest run was missed.
		{"a takeover in line, started after the runs", Every(2 * time.Second), "2030-01-01T00:00:00Z", "0001-01-01T00:00:00Z",
			"2030-01-01T00:00:06.5Z", true, []string{"2030-01-01T00:00:02Z", "2030-01-01T00:00:04Z", "2030-01-01T00:00:06Z"}},
		{"the same broker not in line: the runs before it started were missed", Every(2 * time.Second), "2030-01-01T00:00:00Z",
			"2030-01-01T00:00:06.5Z", "2030-01-01T00:00:06.6Z", true, nil},
		{"hourly from @every", everyHour, "2030-01-01T01:00:00Z", "2000-01-01T00:00:00Z", "2030-01-01T02:00:00.5Z", false, []string{"2030-01-01T02:00:00Z"}},
	}
	for _, c := range cases {
		var got []string
		for _, r := range dueRuns(c.s, at(c.after), at(c.since), at(c.now), c.skip) {
			got = append(got, r.UTC().Format(time.RFC3339))
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestTakeoverSince: a broker that found another holding the job's lock counts the runs
// after the newest published one as late (since is the zero time) only when that run's
// successor came at most a minute before the broker started (the job was running then);
// after an outage, being in line proves nothing, and the broker's start stays the cut.
func TestTakeoverSince(t *testing.T) {
	t.Parallel()
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	daily, err := Cron("CRON_TZ=UTC 0 3 * * *")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name          string
		s             Schedule
		newest, since string // newest "" for no run known
		inLine        bool
		want          string // "" for the zero time
	}{
		{"a rolling deploy: the holder hangs in T, the broker started 4.5 s after T", Every(2 * time.Second),
			"2030-01-01T00:00:00Z", "2030-01-01T00:00:06.5Z", true, ""},
		{"the same broker, not in line", Every(2 * time.Second),
			"2030-01-01T00:00:00Z", "2030-01-01T00:00:06.5Z", false, "2030-01-01T00:00:06.5Z"},
		{"in line after a 10 minute outage", Every(2 * time.Second),
			"2030-01-01T00:00:00Z", "2030-01-01T00:10:00.5Z", true, "2030-01-01T00:10:00.5Z"},
		{"in line, the run after the newest a minute before the start", Every(2 * time.Second),
			"2030-01-01T00:00:00Z", "2030-01-01T00:01:02Z", true, ""},
		{"in line, the run after the newest just over a minute before the start", Every(2 * time.Second),
			"2030-01-01T00:00:00Z", "2030-01-01T00:01:02.001Z", true, "2030-01-01T00:01:02.001Z"},
		{"in line, no run known", Every(2 * time.Second), "", "2030-01-01T00:00:06.5Z", true, "2030-01-01T00:00:06.5Z"},
		{"daily, in line 20 s after the run the holder hangs in", daily,
			"2030-01-07T03:00:00Z", "2030-01-08T03:00:20Z", true, ""},
		{"daily, in line after a missed day", daily,
			"2030-01-06T03:00:00Z", "2030-01-08T03:00:20Z", true, "2030-01-08T03:00:20Z"},
	}
	for _, c := range cases {
		var newest, want time.Time
		if c.newest != "" {
			newest = at(c.newest)
		}
		if c.want != "" {
			want = at(c.want)
		}
		if got := takeoverSince(c.s, newest, c.inLine, at(c.since)); !got.Equal(want) {
			t.Errorf("%s: %v, want %v", c.name, got, want)
		}
	}
}

// A cron schedule's runs are computed in its zone, CRON_TZ's here, even when the newest run
// comes parsed back from its key in UTC, as publishDue hands it to dueRuns; the process's
// own zone is checked by TestPeriodicJobSurvivesPayloadPanicSelfStopAndLocalZone/tz.
func TestCronRunsInItsZoneAfterAStoredUTCKey(t *testing.T) {
	t.Parallel()
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
