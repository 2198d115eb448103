package dashboard

import (
	"context"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// The overview's numbers are the table's, as SQL counts them: per group, rows queued, due
// now, scheduled, in work, dead letters, the oldest due row, the most frequent error, and
// the chart's finished rows by processed_at.
func TestOverviewMatchesSQL(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_ov_")
		f.finishedIndex(tb) // the chart by processed_at needs it
		now := time.Now()
		tq := f.q(tb.Name)
		var emails []int64
		for i := range 13 {
			emails = append(emails, f.publish(tb, "emails", fmt.Sprintf(`{"n":%d}`, i)))
		}
		in := func(ids ...int64) string {
			s := make([]string, len(ids))
			for i, id := range ids {
				s[i] = strconv.FormatInt(id, 10)
			}
			return "(" + strings.Join(s, ", ") + ")"
		}
		f.exec("UPDATE "+tq+" SET retry_after = ? WHERE id IN "+in(emails[5], emails[6], emails[7]), now.Add(time.Hour))
		f.exec("UPDATE "+tq+" SET locked_until = ?, attempt = 2 WHERE id IN "+in(emails[8], emails[9]), now.Add(time.Hour))
		f.exec("UPDATE "+tq+" SET processed_at = ? WHERE id = ?", now.Add(-10*time.Minute), emails[10])
		f.exec("UPDATE "+tq+" SET processed_at = ?, error = ? WHERE id = ?", now.Add(-5*time.Minute), "dropped: bad address", emails[11])
		f.exec("UPDATE "+tq+" SET retry_after = ? WHERE id = ?", now.Add(-time.Minute), emails[12])
		for range 4 {
			id := f.publish(tb, "emails-dead", `{"n":-1}`)
			f.exec("UPDATE "+tq+" SET error = ?, dead_at = ?, attempt = 5 WHERE id = ?", "smtp: connection refused", now, id)
		}
		delayedDead := f.publish(tb, "emails-dead", `{"n":-2}`) // a dead letter still counts when delayed
		f.exec("UPDATE "+tq+" SET retry_after = ? WHERE id = ?", now.Add(time.Hour), delayedDead)
		f.publish(tb, "sms", "not json \x00\x01")

		d, err := New(f.b, []Table{{Table: tb, DeadLetters: map[string]string{"emails": "emails-dead"}}})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "")
		status, body := get(t, c, u+"/")
		if status != http.StatusOK {
			t.Fatalf("GET /: %d\n%s", status, body)
		}
		sqlNow := time.Now()
		unfinished := "SELECT count(*) FROM " + tq + " WHERE queue = ? AND processed_at IS NULL"
		live := " AND locked_until IS NOT NULL AND locked_until > ?"
		notLive := " AND (locked_until IS NULL OR locked_until <= ?)"
		want := map[string]int64{
			"queued":    f.count(unfinished, "emails"),
			"due":       f.count(unfinished+notLive+" AND (retry_after IS NULL OR retry_after <= ?)", "emails", sqlNow, sqlNow),
			"scheduled": f.count(unfinished+notLive+" AND retry_after > ?", "emails", sqlNow, sqlNow),
			"in-work":   f.count(unfinished+live, "emails", sqlNow),
			"dead":      f.count(unfinished, "emails-dead"),
		}
		if want["queued"] != 11 || want["due"] != 6 || want["scheduled"] != 3 || want["in-work"] != 2 || want["dead"] != 5 {
			t.Fatalf("the fixture's own counts are off: %v", want)
		}
		got := counts(t, body, tb.Name, "emails")
		for k, n := range want {
			if got[k] != strconv.FormatInt(n, 10) {
				t.Errorf("emails: %s = %q on the page, %d by SQL", k, got[k], n)
			}
		}
		if !strings.Contains(body, fmt.Sprintf("&amp;id=%d\">#%d</a>", emails[0], emails[0])) {
			t.Errorf("the oldest due row is not #%d", emails[0])
		}
		// The chart counts the finished rows of the last hour by processed_at: one
		// handled, one failed (it holds an error).
		if got["handled"] != "1" || got["failed"] != "1" {
			t.Errorf("chart: handled %q, failed %q; want 1 and 1", got["handled"], got["failed"])
		}
		if !strings.Contains(body, "<svg class=\"chart\"") || !strings.Contains(body, `class="failed"`) {
			t.Error("no chart with a failed bar")
		}
		// The dead-letter group's rows are dead, not queued: none due, none scheduled
		// (the delayed one too), no oldest due.
		if dl := counts(t, body, tb.Name, "emails-dead"); dl["dead"] != "5" || dl["queued"] != "0" || dl["due"] != "0" ||
			dl["scheduled"] != "0" || dl["oldest"] != "–" || !strings.Contains(body, "dead letters of emails") {
			t.Errorf("the dead-letter group's line: %v", dl)
		}
		if !strings.Contains(body, "smtp: connection refused") {
			t.Error("the dead letters' error is not among the most frequent")
		}
		if sms := counts(t, body, tb.Name, "sms"); sms["due"] != "1" || sms["dead"] != "–" {
			t.Errorf("sms: %v", sms)
		}
	})
}

// The job list filters by state, attempt and error text, and pages by id forwards and
// backwards, every row once.
func TestJobListFiltersAndPages(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_list_")
		tq := f.q(tb.Name)
		var ids []int64
		for i := range 8 {
			ids = append(ids, f.publish(tb, "g", fmt.Sprintf(`{"n":%d}`, i)))
		}
		f.publish(tb, "other", "{}")
		f.exec("UPDATE "+tq+" SET retry_after = ? WHERE id IN (?, ?)", time.Now().Add(time.Hour), ids[1], ids[6])
		// Three and four calls made: a lease table's column runs one ahead of them.
		f.exec("UPDATE "+tq+" SET attempt = 4, error = ? WHERE id IN (?, ?)", "smtp: connection refused", ids[2], ids[6])
		f.exec("UPDATE "+tq+" SET attempt = 5, error = ? WHERE id = ?", "template missing", ids[3])

		d, err := New(f.b, []Table{{Table: tb}}, PageSize(3))
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "/ops")
		list := u + "/jobs?table=" + url.QueryEscape(tb.Name) + "&group=g"
		var pages [][]int64
		next := list
		for next != "" {
			status, body := get(t, c, next)
			if status != http.StatusOK {
				t.Fatalf("GET %s: %d\n%s", next, status, body)
			}
			page := listed(t, body)
			if len(page) > 0 {
				pages = append(pages, page)
			}
			if next = link(body, "next"); next != "" {
				next = strings.TrimSuffix(u, "/ops") + next
			}
			if len(pages) > 5 {
				t.Fatal("paging does not end")
			}
		}
		if !slices.Equal(slices.Concat(pages...), ids) || len(pages[0]) != 3 {
			t.Errorf("pages %v, want %v in pages of 3", pages, ids)
		}
		// Back from the last page: the page before it.
		_, body := get(t, c, list+"&after="+strconv.FormatInt(pages[1][2], 10))
		prev := link(body, "prev")
		if prev == "" {
			t.Fatal("the last page has no previous page")
		}
		_, body = get(t, c, strings.TrimSuffix(u, "/ops")+prev)
		if got := listed(t, body); !slices.Equal(got, pages[1]) {
			t.Errorf("previous page %v, want %v", got, pages[1])
		}
		for _, c2 := range []struct {
			query string
			want  []int64
		}{
			{"&state=scheduled", []int64{ids[1], ids[6]}},
			{"&min_attempt=3", []int64{ids[2], ids[3]}}, // a page of 3, then the next: ids[6]
			{"&error=" + url.QueryEscape("connection refused"), []int64{ids[2], ids[6]}},
			{"&state=due&min_attempt=4", []int64{ids[3]}},
		} {
			_, body := get(t, c, list+c2.query)
			got := listed(t, body)
			if c2.query == "&min_attempt=3" {
				got = got[:min(2, len(got))]
			}
			if !slices.Equal(got, c2.want) {
				t.Errorf("%s: %v, want %v", c2.query, got, c2.want)
			}
		}
		// Every group, when none is named.
		_, body = get(t, c, u+"/jobs?table="+url.QueryEscape(tb.Name))
		if got := listed(t, body); len(got) != 3 || got[0] != ids[0] {
			t.Errorf("every group's first page: %v", got)
		}
	})
}

// Each action changes the rows it says it changes, and only with the page's token: a POST
// without it, or with another, is refused (403) and changes nothing.
func TestActions(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_act_")
		tq := f.q(tb.Name)
		now := time.Now()
		delayed := f.publish(tb, "emails", "{}", rowactor.After(time.Hour))
		due := f.publish(tb, "emails", "{}")
		var dead []int64
		for range 3 {
			id := f.publish(tb, "emails-dead", "{}")
			f.exec("UPDATE "+tq+" SET attempt = 5, error = ?, dead_at = ? WHERE id = ?", "boom", now, id)
			dead = append(dead, id)
		}
		d, err := New(f.b, []Table{{Table: tb, DeadLetters: map[string]string{"emails": "emails-dead"}}})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "/admin/queues")
		_, body := get(t, c, u+"/")
		tok := token(t, body)
		act := func(form url.Values) (int, string) {
			t.Helper()
			form.Set("table", tb.Name)
			return post(t, c, u+"/action", form)
		}

		// Refused without the token, with a forged one, and with a token but no cookie.
		if status, _ := act(url.Values{"op": {"retry"}, "id": {strconv.FormatInt(delayed, 10)}}); status != http.StatusForbidden {
			t.Errorf("POST without a token: %d, want 403", status)
		}
		if status, _ := act(url.Values{"op": {"retry"}, "id": {strconv.FormatInt(delayed, 10)}, "csrf": {strings.Repeat("ab", 32)}}); status != http.StatusForbidden {
			t.Errorf("POST with a forged token: %d, want 403", status)
		}
		bare := &http.Client{Timeout: 30 * time.Second}
		if status, _ := post(t, bare, u+"/action", url.Values{"op": {"retry"}, "table": {tb.Name}, "id": {strconv.FormatInt(delayed, 10)}, "csrf": {tok}}); status != http.StatusForbidden {
			t.Errorf("POST with the token but without its cookie: %d, want 403", status)
		}
		bare.CloseIdleConnections()
		if n := f.count("SELECT count(*) FROM "+tq+" WHERE id = ? AND retry_after IS NOT NULL", delayed); n != 1 {
			t.Fatal("a refused POST changed the row")
		}

		status, body := act(url.Values{"op": {"retry"}, "id": {strconv.FormatInt(delayed, 10)}, "csrf": {tok}})
		if status != http.StatusOK || !strings.Contains(body, "is due now") {
			t.Errorf("retry: %d\n%s", status, body)
		}
		if n := f.count("SELECT count(*) FROM "+tq+" WHERE id = ? AND retry_after IS NULL", delayed); n != 1 {
			t.Error("retry now left retry_after set")
		}

		status, body = act(url.Values{"op": {"cancel"}, "id": {strconv.FormatInt(due, 10)}, "csrf": {tok}, "confirm": {"1"}})
		if status != http.StatusOK || !strings.Contains(body, "cancelled") {
			t.Errorf("cancel: %d\n%s", status, body)
		}
		if n := f.count("SELECT count(*) FROM "+tq+" WHERE id = ? AND processed_at IS NOT NULL AND error = ?", due, dialects.CancelledError(cancelReason)); n != 1 {
			t.Error("cancel did not finish the row with its reason")
		}
		// The row reads as cancelled, in the list and on its page, with no cancel of its own.
		_, list := get(t, c, u+"/jobs?table="+url.QueryEscape(tb.Name)+"&state=cancelled")
		if line := jobLine(list, due); !strings.Contains(line, `data-state="cancelled"`) || strings.Contains(line, `data-op="cancel"`) {
			t.Errorf("the cancelled row's line in the list of cancelled rows: want cancelled, no cancel:\n%s", line)
		}
		if _, page := get(t, c, fmt.Sprintf("%s/job?table=%s&id=%d", u, url.QueryEscape(tb.Name), due)); !strings.Contains(page, `data-field="state">cancelled<`) || strings.Contains(page, `data-op="cancel"`) {
			t.Errorf("the cancelled row's page: want cancelled, no cancel:\n%s", page)
		}
		// A second cancel is refused by the row's state, and says so.
		if status, body = act(url.Values{"op": {"cancel"}, "id": {strconv.FormatInt(due, 10)}, "csrf": {tok}, "confirm": {"1"}}); status != http.StatusConflict || !strings.Contains(body, "finished") {
			t.Errorf("cancel of a finished row: %d\n%s", status, body)
		}

		status, body = act(url.Values{"op": {"requeue"}, "group": {"emails-dead"}, "id": {strconv.FormatInt(dead[0], 10)}, "csrf": {tok}})
		if status != http.StatusOK || !strings.Contains(body, "Moved 1 dead letter") {
			t.Errorf("requeue one: %d\n%s", status, body)
		}
		if n := f.count("SELECT count(*) FROM "+tq+" WHERE id = ? AND queue = 'emails' AND attempt = 1 AND dead_at IS NULL", dead[0]); n != 1 {
			t.Error("requeue of one dead letter did not move it back")
		}
		status, body = act(url.Values{"op": {"requeue"}, "group": {"emails-dead"}, "csrf": {tok}, "confirm": {"1"}})
		if status != http.StatusOK || !strings.Contains(body, "Moved 2 dead letter") {
			t.Errorf("requeue all: %d\n%s", status, body)
		}
		if n := f.count("SELECT count(*) FROM " + tq + " WHERE queue = 'emails-dead'"); n != 0 {
			t.Errorf("%d dead letters left after requeue all", n)
		}
		if n := f.count("SELECT count(*) FROM " + tq + " WHERE queue = 'emails' AND processed_at IS NULL"); n != 4 {
			t.Errorf("%d unfinished rows in emails after the requeues, want 4", n)
		}
		if status, _ = act(url.Values{"op": {"requeue"}, "group": {"emails"}, "csrf": {tok}}); status != http.StatusBadRequest {
			t.Errorf("requeue from a group that holds no dead letters: %d, want 400", status)
		}
	})
}

// Pause and resume act on this process's subscription, whose settlements the chart counts.
func TestPauseResumeAndLiveCounts(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_pause_")
		handled := make(chan struct{}, 4)
		sub, err := f.b.Subscribe(ctx, tb, "sms", func(ctx context.Context, dl *rowactor.Delivery) rowactor.Outcome {
			defer func() { handled <- struct{}{} }()
			if string(dl.Payload()) == "fail" {
				return rowactor.Fail(fmt.Errorf("provider down"))
			}
			return rowactor.Ack()
		}, rowactor.PollInterval(50*time.Millisecond), rowactor.MaxAttempts(1), rowactor.DeadLetterGroup("sms-dead"))
		if err != nil {
			t.Fatal(err)
		}
		f.publish(tb, "sms", "ok")
		f.publish(tb, "sms", "ok")
		f.publish(tb, "sms", "fail")
		for range 3 {
			select {
			case <-handled:
			case <-time.After(30 * time.Second):
				t.Fatal("the subscription handled no row")
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			var h, fl int64
			for _, m := range f.b.Throughput(tb, "sms") {
				h, fl = h+m.Handled, fl+m.Failed
			}
			if h == 2 && fl == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("throughput: %d handled, %d failed; want 2 and 1", h, fl)
			}
			time.Sleep(10 * time.Millisecond)
		}
		d, err := New(f.b, []Table{{Table: tb, DeadLetters: map[string]string{"sms": "sms-dead"}}})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "")
		_, body := get(t, c, u+"/")
		got := counts(t, body, tb.Name, "sms-dead")
		if got["dead"] != "1" || got["queued"] != "0" {
			t.Errorf("sms-dead: %v, want the failed row dead", got)
		}
		// Paused from the dashboard, the subscription takes no row.
		if err := sub.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if err := sub.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		tok := token(t, body)
		status, body := post(t, c, u+"/action", url.Values{"op": {"pause"}, "table": {tb.Name}, "group": {"sms"}, "csrf": {tok}})
		if status != http.StatusOK || !sub.Paused() || !strings.Contains(body, "Paused") {
			t.Fatalf("pause: %d, paused %v\n%s", status, sub.Paused(), body)
		}
		id := f.publish(tb, "sms", "ok")
		f.b.Wake(tb, "sms")
		time.Sleep(300 * time.Millisecond) // six polls: a running subscription would take it
		if n := f.count("SELECT count(*) FROM "+f.q(tb.Name)+" WHERE id = ?", id); n != 1 {
			t.Error("a paused subscription took a row")
		}
		_, body = get(t, c, u+"/")
		sms := counts(t, body, tb.Name, "sms")
		if sms["handled"] != "2" || sms["failed"] != "1" || !strings.Contains(body, "settled by this process") || !strings.Contains(body, `<span class="badge paused">paused</span>`) {
			t.Errorf("sms line: %v", sms)
		}
		status, _ = post(t, c, u+"/action", url.Values{"op": {"resume"}, "table": {tb.Name}, "group": {"sms"}, "csrf": {tok}})
		if status != http.StatusOK || sub.Paused() {
			t.Fatalf("resume: %d, paused %v", status, sub.Paused())
		}
		select {
		case <-handled:
		case <-time.After(30 * time.Second):
			t.Fatal("the resumed subscription took no row")
		}
	})
}

// ReadOnly shows no action and refuses every POST, token or not.
func TestReadOnly(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_ro_")
		id := f.publish(tb, "emails", "{}", rowactor.After(time.Hour))
		ro, err := New(f.b, []Table{{Table: tb}}, ReadOnly())
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, ro, "")
		for _, page := range []string{"/", "/jobs?table=" + tb.Name, fmt.Sprintf("/job?table=%s&id=%d", tb.Name, id)} {
			status, body := get(t, c, u+page)
			if status != http.StatusOK || strings.Contains(body, `method="post"`) || strings.Contains(body, `name="csrf"`) {
				t.Errorf("%s in read-only mode: %d, or it shows an action", page, status)
			}
		}
		// Even a token this dashboard would accept, with its cookie, is no use: the
		// read-only dashboard never hands one out, and refuses before it checks.
		srvURL, _ := url.Parse(u)
		nonce := strings.Repeat("0f", 16)
		c.Jar.SetCookies(srvURL, []*http.Cookie{{Name: csrfCookie, Value: nonce}})
		for _, op := range []string{"retry", "cancel", "requeue", "pause"} {
			status, _ := post(t, c, u+"/action", url.Values{"op": {op}, "table": {tb.Name}, "id": {strconv.FormatInt(id, 10)}, "csrf": {ro.sign(nonce)}})
			if status != http.StatusForbidden {
				t.Errorf("%s in read-only mode: %d, want 403", op, status)
			}
		}
		if n := f.count("SELECT count(*) FROM "+f.q(tb.Name)+" WHERE id = ? AND retry_after IS NOT NULL AND processed_at IS NULL", id); n != 1 {
			t.Error("a read-only dashboard changed a row")
		}
	})
}

// The job page shows the payload (pretty JSON, or hex), headers, attempt, due, lease, last
// error and the trace id linked to the tracing UI.
func TestJobPage(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_job_")
		trace := "4bf92f3577b34da6a3ce929d0e0e4736"
		js := f.publish(tb, "emails", `{"to":"a@example.com","n":[1,2]}`,
			rowactor.WithHeaders(map[string]string{"traceparent": "00-" + trace + "-00f067aa0ba902b7-01", "tenant": "acme"}))
		bin := f.publish(tb, "emails", "\x00\x01\x02binary")
		// Three calls made, the third under way: a lease table's column reads 4.
		f.exec("UPDATE "+f.q(tb.Name)+" SET attempt = 4, error = ?, locked_until = ? WHERE id = ?", "smtp: 421 try later", time.Now().Add(time.Hour), js)
		d, err := New(f.b, []Table{{Table: tb}}, TraceURL("http://jaeger.local/trace/{trace_id}"))
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "/q")
		status, body := get(t, c, fmt.Sprintf("%s/job?table=%s&id=%d", u, tb.Name, js))
		if status != http.StatusOK {
			t.Fatalf("job page: %d\n%s", status, body)
		}
		for _, want := range []string{
			"{\n  &#34;to&#34;: &#34;a@example.com&#34;,", // indented JSON
			`data-field="attempt">3<`, `data-field="state">in-work<`, "smtp: 421 try later",
			`<a href="http://jaeger.local/trace/` + trace + `" data-field="trace">` + trace + `</a>`,
			"<th>tenant</th><td>acme</td>", "locked_until ",
		} {
			if !strings.Contains(body, want) {
				t.Errorf("job page lacks %q:\n%s", want, body)
			}
		}
		_, body = get(t, c, fmt.Sprintf("%s/job?table=%s&id=%d", u, tb.Name, bin))
		if !strings.Contains(body, "00 01 02 62 69 6e 61 72  79") || !strings.Contains(body, ", hex") {
			t.Errorf("binary payload not shown in hex:\n%s", body)
		}
		if status, _ := get(t, c, fmt.Sprintf("%s/job?table=%s&id=%d", u, tb.Name, bin+100)); status != http.StatusNotFound {
			t.Errorf("a missing row: %d, want 404", status)
		}
	})
}

// Every link, form and asset of every page stays under the mount prefix, with
// http.StripPrefix at any depth or at the root.
func TestMountPrefix(t *testing.T) {
	f := newFixture(t, databases[0])
	tb := f.jobsTable("dash_mount_")
	id := f.publish(tb, "emails", "{}", rowactor.After(time.Hour))
	d, err := New(f.b, []Table{{Table: tb, DeadLetters: map[string]string{"emails": "emails-dead"}}})
	if err != nil {
		t.Fatal(err)
	}
	attr := regexp.MustCompile(`(?:href|src|action)="([^"]*)"`)
	for _, prefix := range []string{"", "/admin", "/internal/ops/queues"} {
		c, u := serve(t, d, prefix)
		for _, page := range []string{"/", "/jobs?table=" + tb.Name, fmt.Sprintf("/job?table=%s&id=%d", tb.Name, id), "/static/style.css"} {
			status, body := get(t, c, u+page)
			if status != http.StatusOK {
				t.Fatalf("%s%s: %d", prefix, page, status)
			}
			for _, m := range attr.FindAllStringSubmatch(body, -1) {
				if !strings.HasPrefix(m[1], prefix+"/") {
					t.Errorf("%s%s links %q, outside the mount point", prefix, page, m[1])
				}
			}
		}
	}
}

// The overview and job lists reload themselves no more often than every MinRefresh, by
// the one embedded script; Refresh(0) turns it off, and the job page never reloads.
func TestRefresh(t *testing.T) {
	f := newFixture(t, databases[0])
	tb := f.jobsTable("dash_refresh_")
	id := f.publish(tb, "emails", "{}")
	for _, c := range []struct {
		opts []Option
		want string // data-refresh, "" for no script
	}{
		{nil, "10"},
		{[]Option{Refresh(time.Second)}, "5"},
		{[]Option{Refresh(30 * time.Second)}, "30"},
		{[]Option{Refresh(0)}, ""},
	} {
		d, err := New(f.b, []Table{{Table: tb}}, c.opts...)
		if err != nil {
			t.Fatal(err)
		}
		cl, u := serve(t, d, "/x")
		for _, page := range []string{"/", "/jobs?table=" + tb.Name, fmt.Sprintf("/job?table=%s&id=%d", tb.Name, id)} {
			_, body := get(t, cl, u+page)
			m := regexp.MustCompile(`<script src="/x/static/refresh.js" data-refresh="(\d+)" defer>`).FindStringSubmatch(body)
			switch {
			case strings.HasPrefix(page, "/job?") && m != nil:
				t.Errorf("the job page reloads itself")
			case strings.HasPrefix(page, "/job?"):
			case c.want == "" && m != nil, c.want != "" && (m == nil || m[1] != c.want):
				t.Errorf("%s with %d options: refresh %v, want %q", page, len(c.opts), m, c.want)
			}
		}
		status, js := get(t, cl, u+"/static/refresh.js")
		if status != http.StatusOK || !strings.Contains(js, "Math.max(5,") {
			t.Errorf("refresh.js: %d, or it does not hold its floor of 5 s", status)
		}
	}
}

// A queue whose rows are all finished keeps its line while its dead-letter group holds
// rows, with the count and the requeue button; finished rows are not counted.
func TestQueueLineWithoutRows(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_empty_")
		f.finishedIndex(tb)
		done := f.publish(tb, "emails", "{}")
		f.exec("UPDATE "+f.q(tb.Name)+" SET processed_at = ? WHERE id = ?", time.Now(), done)
		f.publish(tb, "emails-dead", "{}")
		f.publish(tb, "emails-dead", "{}")
		d, err := New(f.b, []Table{{Table: tb, DeadLetters: map[string]string{"emails": "emails-dead"}}})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "")
		_, body := get(t, c, u+"/")
		if got := counts(t, body, tb.Name, "emails"); got["dead"] != "2" || got["queued"] != "0" || got["handled"] != "1" {
			t.Errorf("emails: %v, want no queued row, 2 dead letters, 1 handled in the chart", got)
		}
		if !strings.Contains(body, `data-op="requeue"`) {
			t.Error("no requeue button")
		}
	})
}

// An action's "back" link stays under the mount point, whatever the form says.
func TestActionBackLink(t *testing.T) {
	f := newFixture(t, databases[0])
	tb := f.jobsTable("dash_back_")
	id := f.publish(tb, "emails", "{}", rowactor.After(time.Hour))
	d, err := New(f.b, []Table{{Table: tb}})
	if err != nil {
		t.Fatal(err)
	}
	c, u := serve(t, d, "/ops")
	_, body := get(t, c, u+"/jobs?table="+tb.Name)
	tok := token(t, body)
	for back, want := range map[string]string{
		"/jobs?table=x": "/ops/jobs?table=x", "//evil.example": "/ops/", `/\evil.example`: "/ops/", "https://evil.example": "/ops/",
	} {
		_, body := post(t, c, u+"/action", url.Values{"op": {"retry"}, "table": {tb.Name}, "id": {strconv.FormatInt(id, 10)}, "csrf": {tok}, "back": {back}})
		if got := link(body, "back"); got != want {
			t.Errorf("back %q: links %q, want %q", back, got, want)
		}
	}
}

// The chart by processed_at is drawn only when an index leads with processed_at: without
// one, the overview says so and shows the statement that creates it (and reads no
// finished row); once it exists, the chart shows (the check is redone after
// indexRecheck, here 0).
func TestChartNeedsFinishedIndex(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_idx_")
		done := f.publish(tb, "emails", "{}")
		f.exec("UPDATE "+f.q(tb.Name)+" SET processed_at = ? WHERE id = ?", time.Now().Add(-time.Minute), done)
		f.publish(tb, "emails", "{}")
		d, err := New(f.b, []Table{{Table: tb}}, func(c *config) { c.indexRecheck = 0 })
		if err != nil {
			t.Fatal(err)
		}
		stmt := f.b.Dialect().(dialects.FinishedCounter).FinishedIndexStatement(tb)
		c, u := serve(t, d, "")
		_, body := get(t, c, u+"/")
		if !strings.Contains(body, `data-no-chart="`+tb.Name+`"`) || !strings.Contains(body, html.EscapeString(stmt)) {
			t.Errorf("without the index: no note with %s in:\n%s", stmt, body)
		}
		if got := counts(t, body, tb.Name, "emails"); strings.Contains(body, `<svg class="chart"`) || got["handled"] != "" {
			t.Errorf("without the index: a chart (%v)", got)
		}
		f.exec(stmt)
		_, body = get(t, c, u+"/")
		if got := counts(t, body, tb.Name, "emails"); !strings.Contains(body, `<svg class="chart"`) || got["handled"] != "1" {
			t.Errorf("with the index: chart %v, want 1 handled", got)
		}
		if strings.Contains(body, "data-no-chart") {
			t.Error("with the index: the note is still shown")
		}
	})
}

// The check for the index holds for indexRecheck: an index created meanwhile shows the
// chart only once it has passed.
func TestFinishedIndexCheckCached(t *testing.T) {
	f := newFixture(t, databases[0])
	tb := f.jobsTable("dash_idxc_")
	d, err := New(f.b, []Table{{Table: tb}}, func(c *config) { c.indexRecheck = time.Hour })
	if err != nil {
		t.Fatal(err)
	}
	overview := func() string { // served in this goroutine: the test changes d.cfg between pages
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		return rec.Body.String()
	}
	f.publish(tb, "emails", "{}")
	if !strings.Contains(overview(), "data-no-chart") {
		t.Fatal("no note without the index")
	}
	f.finishedIndex(tb)
	if !strings.Contains(overview(), "data-no-chart") {
		t.Error("the index was read again before indexRecheck passed")
	}
	d.cfg.indexRecheck = 0
	if strings.Contains(overview(), "data-no-chart") {
		t.Error("the index was not read again after indexRecheck")
	}
}

// serveAs serves method u through d in this goroutine with the Host header host (and
// headers), and returns the status.
func serveAs(d http.Handler, method, u, host string, form url.Values, headers map[string]string) (int, string) {
	var r *http.Request
	if form != nil {
		r = httptest.NewRequest(method, u, strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		r = httptest.NewRequest(method, u, nil)
	}
	r.Host = host
	for k, v := range headers {
		r.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, r)
	return rec.Code, rec.Body.String()
}

// Under AllowHosts a request for another host name (a DNS-rebinding page's) is refused,
// pages and actions alike, even with a valid token: the row stays. Its own names,
// localhost names and IP addresses are served, whatever the port.
func TestAllowHostsRefusesOtherHosts(t *testing.T) {
	f := newFixture(t, databases[0])
	tb := f.jobsTable("dash_host_")
	id := f.publish(tb, "emails", `{"secret":"payload"}`)
	d, err := New(f.b, []Table{{Table: tb}}, AllowHosts("queues.example.com"))
	if err != nil {
		t.Fatal(err)
	}
	nonce := strings.Repeat("0f", 16)
	cancel := url.Values{"op": {"cancel"}, "table": {tb.Name}, "id": {strconv.FormatInt(id, 10)}, "csrf": {d.sign(nonce)}, "confirm": {"1"}}
	cookie := map[string]string{"Cookie": csrfCookie + "=" + nonce}
	job := fmt.Sprintf("/job?table=%s&id=%d", tb.Name, id)
	for _, host := range []string{"rebind.attacker.example:8080", "rebind.attacker.example", "queues.example.com.attacker.example"} {
		for _, page := range []string{"/", job, "/jobs?table=" + tb.Name} {
			if status, body := serveAs(d, http.MethodGet, page, host, nil, nil); status != http.StatusForbidden || strings.Contains(body, "secret") {
				t.Errorf("GET %s for host %s: %d, want 403", page, host, status)
			}
		}
		if status, _ := serveAs(d, http.MethodPost, "/action", host, cancel, cookie); status != http.StatusForbidden {
			t.Errorf("POST cancel for host %s: %d, want 403", host, status)
		}
	}
	if n := f.count("SELECT count(*) FROM "+f.q(tb.Name)+" WHERE id = ? AND processed_at IS NULL", id); n != 1 {
		t.Fatal("a request for another host cancelled the row")
	}
	for _, host := range []string{"queues.example.com", "Queues.Example.com.:443", "localhost:8080", "ops.localhost", "127.0.0.1:8080", "[::1]:8080", "10.1.2.3"} {
		if status, _ := serveAs(d, http.MethodGet, job, host, nil, nil); status != http.StatusOK {
			t.Errorf("GET for host %s: %d, want 200", host, status)
		}
	}
	// A POST whose Origin names another host is refused though its Host is allowed.
	if status, _ := serveAs(d, http.MethodPost, "/action", "localhost:8080", cancel, map[string]string{"Cookie": cookie["Cookie"], "Origin": "http://rebind.attacker.example:8080"}); status != http.StatusForbidden {
		t.Errorf("POST from origin rebind.attacker.example: %d, want 403", status)
	}
	if n := f.count("SELECT count(*) FROM "+f.q(tb.Name)+" WHERE id = ? AND processed_at IS NULL", id); n != 1 {
		t.Fatal("a POST from another origin cancelled the row")
	}
	// Without AllowHosts, any host is served (the service mounting it checks hosts).
	open, err := New(f.b, []Table{{Table: tb}})
	if err != nil {
		t.Fatal(err)
	}
	if status, _ := serveAs(open, http.MethodGet, job, "queues.internal.example", nil, nil); status != http.StatusOK {
		t.Errorf("without AllowHosts: %d, want 200", status)
	}
}

// A POST a browser says comes from another site (Sec-Fetch-Site, or Origin against Host)
// is refused before its token is looked at, and changes nothing.
func TestActionRefusesCrossOriginPost(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_origin_")
		id := f.publish(tb, "emails", "{}", rowactor.After(time.Hour))
		d, err := New(f.b, []Table{{Table: tb}})
		if err != nil {
			t.Fatal(err)
		}
		nonce := strings.Repeat("0f", 16)
		retry := url.Values{"op": {"retry"}, "table": {tb.Name}, "id": {strconv.FormatInt(id, 10)}, "csrf": {d.sign(nonce)}}
		cookie := csrfCookie + "=" + nonce
		for _, h := range []map[string]string{
			{"Sec-Fetch-Site": "cross-site"},
			{"Sec-Fetch-Site": "same-site"},
			{"Origin": "http://evil.example"},
		} {
			h["Cookie"] = cookie
			if status, body := serveAs(d, http.MethodPost, "/action", "127.0.0.1:8080", retry, h); status != http.StatusForbidden {
				t.Errorf("POST with %v: %d, want 403\n%s", h, status, body)
			}
		}
		if n := f.count("SELECT count(*) FROM "+f.q(tb.Name)+" WHERE id = ? AND retry_after IS NOT NULL", id); n != 1 {
			t.Fatal("a cross-origin POST made the row due")
		}
		// The dashboard's own page's POST passes.
		status, _ := serveAs(d, http.MethodPost, "/action", "127.0.0.1:8080", retry, map[string]string{"Cookie": cookie, "Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1:8080"})
		if status != http.StatusOK && status != http.StatusSeeOther {
			t.Errorf("a same-origin POST: %d", status)
		}
		if n := f.count("SELECT count(*) FROM "+f.q(tb.Name)+" WHERE id = ? AND retry_after IS NULL", id); n != 1 {
			t.Error("a same-origin POST did not make the row due")
		}
	})
}

// A table described in a form its database cannot serve (SQLite has no row locks) is
// refused by New with the *ConfigError Subscribe returns for it, rather than shown with
// buttons that all fail; the databases that serve the form accept it.
func TestNewRefusesAFormTheDatabaseCannotServe(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := rowactor.Table{Name: "dash_rowlock", ID: "id", Payload: "payload", Group: "queue", Attempt: "attempt",
			ProcessedAt: "processed_at", Error: "error"} // no LockedUntil, no AdvisoryKey: the row lock form
		_, subErr := f.b.Subscribe(ctx, tb, "g", func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
		var subCE *dialects.ConfigError
		served := !errors.As(subErr, &subCE) || subCE.Option != "Table.LockedUntil"
		_, err := New(f.b, []Table{{Table: tb}})
		var ce *dialects.ConfigError
		switch {
		case served && err != nil:
			t.Errorf("%s serves the row lock form, and New refused it: %v", f.db.name, err)
		case !served && (!errors.As(err, &ce) || ce.Option != subCE.Option || ce.Reason != subCE.Reason):
			t.Errorf("New: %v; want the *ConfigError Subscribe returns: %v", err, subErr)
		}
		if f.db.name == "sqlite" && served {
			t.Errorf("SQLite's Subscribe accepted the row lock form: %v", subErr)
		}
	})
}
