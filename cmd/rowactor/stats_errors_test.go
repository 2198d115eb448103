package main

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestStatsShowsTheMostFrequentErrors: with an error column, stats lists each group's most
// frequent error texts (three at most, most frequent first) among its rows holding one,
// in -json and in the table.
func TestStatsShowsTheMostFrequentErrors(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			f := newFixture(t, db)
			tb := queueTable(f.tableName("ra_cli_err_"), db.forms[0])
			tb.Error = "last_error"
			f.create(tb)
			set := func(group, text string, n int) {
				for range n {
					f.set(tb, f.publish(tb, group, "p"), tb.Error, text)
				}
			}
			set("jobs", "smtp: 451 try later", 3)
			set("jobs", "dns: no such host", 2)
			set("jobs", "tls: handshake timeout", 1)
			set("jobs", "rare", 1) // fourth: not listed
			f.publish(tb, "jobs", "no error")
			set("jobs-dead", "smtp: 550 no such user\nat line 2", 1)

			got := f.stats(tb)
			want := []errorLine{{"smtp: 451 try later", 3}, {"dns: no such host", 2}}
			if e := got["jobs"].Errors; len(e) != 3 || !slices.Equal(e[:2], want) || e[2].Rows != 1 {
				t.Fatalf("jobs errors %+v, want %+v then one of the single ones", e, want)
			}
			if e := got["jobs-dead"].Errors; len(e) != 1 || e[0].Rows != 1 || e[0].Error != "smtp: 550 no such user\nat line 2" {
				t.Fatalf("jobs-dead errors %+v", e)
			}
			code, out, errOut := cli(append([]string{"stats", "-dsn", f.dsn}, append(columnFlags(tb), tb.Name)...)...)
			if code != exitOK {
				t.Fatalf("stats: exit %d: %s", code, errOut)
			}
			for _, line := range []string{"MOST FREQUENT ERRORS", "jobs       3     smtp: 451 try later", "jobs-dead  1     smtp: 550 no such user at line 2"} {
				if !strings.Contains(out, line) {
					t.Fatalf("stats printed\n%s\nwant a line with %q", out, line)
				}
			}
		})
	}
}

// TestStatsAndInspectShowCancelledRows: a row `rowactor cancel` ended reads as cancelled,
// stats counts it apart from the processed rows, and its reason is not among the most
// frequent errors; a failure's error is.
func TestStatsAndInspectShowCancelledRows(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			f := newFixture(t, db)
			tb := queueTable(f.tableName("ra_cli_cancelled_"), db.forms[0])
			tb.Error = "last_error"
			f.create(tb)
			cancelled := f.publish(tb, "jobs", "c")
			f.set(tb, f.publish(tb, "jobs", "f"), tb.Error, "smtp: 451 try later")
			if code, out, errOut := cli(append([]string{"cancel", "-dsn", f.dsn, "-reason", "customer left"}, append(columnFlags(tb), tb.Name, strconv.FormatInt(cancelled, 10))...)...); code != exitOK {
				t.Fatalf("cancel: exit %d: %s%s", code, out, errOut)
			}
			l := f.stats(tb)["jobs"]
			if l.Cancelled == nil || *l.Cancelled != 1 || l.Processed == nil || *l.Processed != 0 || l.Due != 1 {
				t.Fatalf("stats %+v: want 1 cancelled, 0 processed, 1 due", l)
			}
			if want := []errorLine{{"smtp: 451 try later", 1}}; !slices.Equal(l.Errors, want) {
				t.Fatalf("stats' errors %+v, want %+v: no cancellation's reason", l.Errors, want)
			}
			code, out, errOut := cli(append([]string{"inspect", "-dsn", f.dsn, "-json"}, append(columnFlags(tb), tb.Name, strconv.FormatInt(cancelled, 10))...)...)
			if code != exitOK || !strings.Contains(out, `"state":"cancelled"`) || !strings.Contains(out, `"error":"cancelled: customer left"`) {
				t.Fatalf("inspect: exit %d: %s%s", code, out, errOut)
			}
			code, out, errOut = cli(append([]string{"stats", "-dsn", f.dsn}, append(columnFlags(tb), tb.Name)...)...)
			if code != exitOK || !strings.Contains(out, "PROCESSED  CANCELLED") || strings.Contains(out, "customer left") {
				t.Fatalf("stats: exit %d: %s%s", code, out, errOut)
			}
		})
	}
}
