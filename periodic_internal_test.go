package rowactor

import (
	"slices"
	"testing"
	"time"
)

func TestDueRuns(t *testing.T) {
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
