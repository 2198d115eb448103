package dashboard

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

var hrefAttrRE = regexp.MustCompile(`href="([^"]*)"`)

// hrefs are a page's links as a browser reads them (entities decoded), each parsed.
func hrefs(t *testing.T, body string) []*url.URL {
	t.Helper()
	var out []*url.URL
	for _, m := range hrefAttrRE.FindAllStringSubmatch(body, -1) {
		u, err := url.Parse(html.UnescapeString(m[1]))
		if err != nil {
			t.Fatalf("link %q: %v", m[1], err)
		}
		out = append(out, u)
	}
	return out
}

// A queue whose name holds a ':' and an error text with spaces, ':' and '&' are linked so
// that the link opens their rows: the overview's queue, dead-letter and "most frequent
// errors" links, and the job page's link back to its queue, each carry the name and text
// escaped once.
func TestOverviewLinksOpenTheirRows(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_links_")
		queue, deadGroup := "emails:high", "emails:high dead"
		errText := "smtp: 550 mailbox unavailable & gone"
		due := []int64{f.publish(tb, queue, "{}"), f.publish(tb, queue, "{}")}
		var dead []int64
		for range 3 {
			id := f.publish(tb, deadGroup, "{}")
			f.exec("UPDATE "+f.q(tb.Name)+" SET error = ?, dead_at = ?, attempt = 5 WHERE id = ?", errText, time.Now(), id)
			dead = append(dead, id)
		}
		d, err := New(f.b, []Table{{Table: tb, DeadLetters: map[string]string{queue: deadGroup}}})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "/ops")
		status, body := get(t, c, u+"/")
		if status != http.StatusOK {
			t.Fatalf("overview: %d\n%s", status, body)
		}
		want := map[string][]int64{queue: due, deadGroup: dead}
		followed := map[string]bool{}
		for _, l := range hrefs(t, body) {
			q := l.Query()
			if l.Path != "/ops/jobs" || !q.Has("group") {
				continue
			}
			key := q.Get("group")
			ids, ok := want[key]
			if !ok {
				t.Errorf("link %s names group %q: no such group (%q or %q)", l, key, queue, deadGroup)
				continue
			}
			if q.Has("error") {
				if q.Get("error") != errText {
					t.Errorf("link %s filters on error %q, the rows hold %q", l, q.Get("error"), errText)
				}
				key += " error"
			}
			status, list := get(t, c, strings.TrimSuffix(u, "/ops")+l.String())
			if got := listed(t, list); status != http.StatusOK || !slices.Equal(got, ids) {
				t.Errorf("link %s lists %v (%d), want %v", l, got, status, ids)
			}
			followed[key] = true
		}
		for _, k := range []string{queue, deadGroup, deadGroup + " error"} {
			if !followed[k] {
				t.Errorf("the overview has no link to %s", k)
			}
		}
		// The job page's link back to its queue.
		_, job := get(t, c, u+"/job?table="+url.QueryEscape(tb.Name)+"&id="+strconv.FormatInt(due[0], 10))
		back := false
		for _, l := range hrefs(t, job) {
			if l.Path == "/ops/jobs" && l.Query().Has("group") {
				back = true
				if g := l.Query().Get("group"); g != queue {
					t.Errorf("the job page links to queue %q, want %q", g, queue)
				}
			}
		}
		if !back {
			t.Error("the job page has no link to its queue")
		}
	})
}

// A table of thousands of groups does not make an overview of thousands of lines: it
// shows overviewGroups lines, the groups with the most rows queued (and the queues named
// in DeadLetters with theirs), and sums up the rest on one line.
func TestOverviewSummarizesManyGroups(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_many_")
		const n = 300
		for i := range n {
			f.publish(tb, fmt.Sprintf("tenant-%04d", i), "{}")
		}
		for range 3 {
			f.publish(tb, "zz-busy", "{}")
		}
		f.publish(tb, "zz-quiet-dead", "{}")
		d, err := New(f.b, []Table{{Table: tb, DeadLetters: map[string]string{"zz-quiet": "zz-quiet-dead"}}})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "")
		status, body := get(t, c, u+"/")
		if status != http.StatusOK {
			t.Fatalf("overview: %d", status)
		}
		lines := strings.Count(body, "<tr data-group=")
		t.Logf("%d groups: %d lines, a page of %d KB", n+3, lines, len(body)>>10)
		if lines > overviewGroups {
			t.Errorf("%d group lines (a page of %d KB), want at most %d", lines, len(body)>>10, overviewGroups)
		}
		for _, g := range []string{"zz-busy", "zz-quiet", "zz-quiet-dead"} {
			if !strings.Contains(body, `<tr data-group="`+g+`"`) {
				t.Errorf("group %s is not shown", g)
			}
		}
		hidden := n + 3 - lines // the tenants, zz-busy and the dead-letter pair: n+3 lines in all
		m := regexp.MustCompile(`data-hidden-groups="(\d+)" data-hidden-queued="(\d+)"`).FindStringSubmatch(body)
		if m == nil || m[1] != strconv.Itoa(hidden) || m[2] != strconv.Itoa(hidden) {
			t.Errorf("the summary of the groups not shown: %v, want %d groups, %d rows queued", m, hidden, hidden)
		}
	})
}

// section is the overview's section of table, for a failure's message.
func section(body, table string) string {
	i := strings.Index(body, `<section class="table" data-table="`+table+`"`)
	if i < 0 {
		return body
	}
	s := body[i:]
	if end := strings.Index(s, "</section>"); end >= 0 {
		s = s[:end+len("</section>")]
	}
	return s
}

// The overview has a line for every group that has rows, finished ones included, and for
// every queue this process subscribes to, with zeros where nothing is queued: a queue
// whose nine rows a subscription here handled, a subscribed queue that never had a row,
// and a group whose rows another process finished. Without the index on processed_at,
// the note under the table names the groups without a chart (only those no subscription
// here reads) and offers mounting the dashboard in the service only while no
// subscription of this process reads the table.
func TestOverviewShowsQueuesWithNothingQueued(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_idle_")
		for range 2 {
			f.exec("UPDATE "+f.q(tb.Name)+" SET processed_at = ? WHERE id = ?", time.Now().Add(-time.Hour), f.publish(tb, "sms", "{}"))
		}
		d, err := New(f.b, []Table{{Table: tb}})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "")
		_, body := get(t, c, u+"/")
		if got := counts(t, body, tb.Name, "sms"); got["queued"] != "0" || got["due"] != "0" {
			t.Errorf("sms, whose rows are all finished: %v, want a line of zeros", got)
		}
		if note := noChartNote(t, body, tb.Name); !strings.Contains(note, `<span data-uncharted="1">sms</span>`) || !strings.Contains(note, "mount the dashboard") {
			t.Errorf("the note without a subscription here: want sms named, and mounting offered:\n%s", note)
		}

		handled := make(chan struct{}, 9)
		for _, q := range []string{"emails", "push"} {
			if _, err := f.b.Subscribe(ctx, tb, q, func(context.Context, *rowactor.Delivery) rowactor.Outcome {
				handled <- struct{}{}
				return rowactor.Ack()
			}, rowactor.PollInterval(20*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
		}
		for range 9 {
			f.publish(tb, "emails", "{}")
		}
		for range 9 {
			select {
			case <-handled:
			case <-time.After(30 * time.Second):
				t.Fatal("the subscription handled fewer than 9 rows")
			}
		}
		waitUntil(t, "the 9 rows processed and counted", func() bool {
			var n int64
			for _, m := range f.b.Throughput(tb, "emails") {
				n += m.Handled
			}
			return n == 9 && f.count("SELECT count(*) FROM "+f.q(tb.Name)+" WHERE queue = 'emails' AND processed_at IS NOT NULL") == 9
		})
		_, body = get(t, c, u+"/")
		if got := counts(t, body, tb.Name, "emails"); got["queued"] != "0" || got["due"] != "0" || got["handled"] != "9" {
			t.Errorf("emails, its 9 rows handled here: %v, want a line of zeros and 9 handled", got)
		}
		for _, g := range []string{"push", "sms"} {
			if got := counts(t, body, tb.Name, g); got["queued"] != "0" || got["due"] != "0" {
				t.Errorf("%s: %v, want a line of zeros", g, got)
			}
		}
		note := noChartNote(t, body, tb.Name)
		if !strings.Contains(note, `<span data-uncharted="1">sms</span>`) || strings.Contains(note, "mount the dashboard") || !strings.Contains(note, "subscribes to chart its own") {
			t.Errorf("the note with subscriptions here: want sms alone named, and no mounting offered:\n%s", note)
		}
	})
}

// noChartNote is the note under table's section on why a chart is missing.
func noChartNote(t *testing.T, body, table string) string {
	t.Helper()
	i := strings.Index(body, `<p class="note" data-no-chart="`+table+`"`)
	if i < 0 {
		t.Fatalf("no note on the chart of %s:\n%s", table, section(body, table))
	}
	note := body[i:]
	return note[:strings.Index(note, "</p>")]
}

// waitUntil polls cond every 10 ms for up to 30 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
