package dashboard

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// noRedirect is c, not following redirects: the test reads the 303 itself.
func noRedirect(c *http.Client) *http.Client {
	nc := *c
	nc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &nc
}

// An action answers with a redirect (303) to its result page: reloading that page shows
// the result again and runs nothing again. A dead letter made after the requeue stays a
// dead letter however often the result page is loaded.
func TestActionResultSurvivesReload(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_prg_")
		tq := f.q(tb.Name)
		for range 2 {
			id := f.publish(tb, "emails-dead", "{}")
			f.exec("UPDATE "+tq+" SET error = ?, dead_at = ? WHERE id = ?", "boom", time.Now(), id)
		}
		d, err := New(f.b, []Table{{Table: tb, DeadLetters: map[string]string{"emails": "emails-dead"}}})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "/ops")
		_, body := get(t, c, u+"/")
		nc := noRedirect(c)
		resp, err := nc.PostForm(u+"/action", url.Values{"op": {"requeue"}, "table": {tb.Name}, "group": {"emails-dead"}, "csrf": {token(t, body)}, "confirm": {"1"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/ops/") {
			t.Fatalf("the action answered %d, Location %q; want 303 to a page under /ops/", resp.StatusCode, loc)
		}
		if n := f.count("SELECT count(*) FROM " + tq + " WHERE queue = 'emails' AND processed_at IS NULL"); n != 2 {
			t.Fatalf("%d rows requeued, want 2", n)
		}
		late := f.publish(tb, "emails-dead", "{}")
		host := strings.TrimSuffix(u, "/ops")
		for range 2 {
			status, res := get(t, c, host+loc)
			if status != http.StatusOK || !strings.Contains(resultOf(res), "Moved 2 dead letter") {
				t.Errorf("the result page: %d\n%s", status, res)
			}
		}
		if n := f.count("SELECT count(*) FROM "+tq+" WHERE id = ? AND queue = 'emails-dead'", late); n != 1 {
			t.Error("loading the result page again requeued the late dead letter")
		}
	})
}

// "Requeue every dead letter" and "cancel" ask first: a POST without the confirmation
// changes nothing and answers a page that says what the action would do (how many dead
// letters; that a list's filter does not narrow it), whose button runs it.
func TestDestructiveActionsAskFirst(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_confirm_")
		tq := f.q(tb.Name)
		for i := range 3 {
			id := f.publish(tb, "emails-dead", "{}")
			errText := "smtp: 550 gone"
			if i == 0 {
				errText = "template missing"
			}
			f.exec("UPDATE "+tq+" SET error = ?, dead_at = ? WHERE id = ?", errText, time.Now(), id)
		}
		queued := f.publish(tb, "emails", "{}")
		d, err := New(f.b, []Table{{Table: tb, DeadLetters: map[string]string{"emails": "emails-dead"}}})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "")
		// The filtered list of one error's dead letters: its button requeues all three.
		list := u + "/jobs?table=" + url.QueryEscape(tb.Name) + "&group=emails-dead&error=" + url.QueryEscape("smtp")
		_, body := get(t, c, list)
		if len(listed(t, body)) != 2 {
			t.Fatalf("the filtered list: %v", listed(t, body))
		}
		tok := token(t, body)
		status, ask := post(t, c, u+"/action", url.Values{"op": {"requeue"}, "table": {tb.Name}, "group": {"emails-dead"}, "csrf": {tok}, "back": {"/jobs?table=x"}})
		if status != http.StatusOK || !strings.Contains(ask, `id="confirm"`) || !strings.Contains(ask, "3 dead letter") || !strings.Contains(ask, "filter") {
			t.Errorf("requeue without confirmation: %d, want a page asking to confirm 3 dead letters and saying the filter does not apply\n%s", status, ask)
		}
		if n := f.count("SELECT count(*) FROM " + tq + " WHERE queue = 'emails-dead'"); n != 3 {
			t.Fatalf("requeue without confirmation moved %d dead letters", 3-n)
		}
		status, _ = post(t, c, u+"/action", url.Values{"op": {"cancel"}, "table": {tb.Name}, "id": {strconv.FormatInt(queued, 10)}, "csrf": {tok}})
		if n := f.count("SELECT count(*) FROM "+tq+" WHERE id = ? AND processed_at IS NULL", queued); status != http.StatusOK || n != 1 {
			t.Fatalf("cancel without confirmation: %d, row unfinished %d", status, n)
		}
		// The confirmation page's own form runs it.
		form := confirmForm(t, ask)
		if form.Get("confirm") == "" || form.Get("group") != "emails-dead" {
			t.Fatalf("the confirmation's form: %v", form)
		}
		status, res := post(t, c, u+"/action", form)
		if status != http.StatusOK || !strings.Contains(resultOf(res), "Moved 3 dead letter") {
			t.Errorf("the confirmed requeue: %d\n%s", status, res)
		}
		if n := f.count("SELECT count(*) FROM " + tq + " WHERE queue = 'emails-dead'"); n != 0 {
			t.Errorf("%d dead letters left after the confirmed requeue", n)
		}
	})
}

// confirmForm reads the confirmation page's form fields.
func confirmForm(t *testing.T, body string) url.Values {
	t.Helper()
	i := strings.Index(body, `id="confirm"`)
	if i < 0 {
		t.Fatalf("no confirmation form:\n%s", body)
	}
	form := body[i:]
	form = form[:strings.Index(form, "</form>")]
	v := url.Values{}
	for _, m := range inputRE.FindAllStringSubmatch(form, -1) {
		v.Set(m[1], htmlUnescape(m[2]))
	}
	return v
}

// resultOf is an action page's result line.
func resultOf(body string) string {
	if i := strings.Index(body, `id="result"`); i >= 0 {
		body = body[i:]
		if j := strings.Index(body, "</p>"); j >= 0 {
			body = body[:j]
		}
	}
	return body
}
