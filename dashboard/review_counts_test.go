package dashboard

import (
	"context"
	"io"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// Adversarial review of 797208f (countCache). Every test runs on a real server; the slow
// counts are real (a lock another session holds, a statement_timeout, or a big queue).

// lockPG holds tq in ACCESS EXCLUSIVE mode from another session until the returned func
// is called (idempotent; also called at cleanup, before the fixture's Shutdown runs).
func lockPG(t *testing.T, f *fixture, tq string) (release func()) {
	t.Helper()
	tx, err := f.sql.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "LOCK TABLE "+tq+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback() }) }
	t.Cleanup(release)
	return release
}

// pgWithParams is the postgres database whose sessions start with the given settings
// (pgx passes unknown DSN parameters to the server as run-time parameters).
func pgWithParams(params string) database {
	db := databases[1]
	base := db.dsn
	db.dsn = func(t *testing.T) string { return base(t) + "&" + params }
	return db
}

// Rule 6: an error from the count is shown on the page. A count that fails only after
// the render stopped waiting for it (here: statement_timeout, as a DBA sets on the
// dashboard's role so that a count of a huge queue cannot run for minutes) is never
// shown: each render finds the last count failed, starts another, waits the budget and
// says "Counting ... its numbers show at the page's next refresh" — forever.
func TestReviewCountsSlowErrorIsShown(t *testing.T) {
	f := newFixture(t, pgWithParams("statement_timeout=300"))
	tb := f.jobsTable("dash_rv_err_")
	f.publish(tb, "emails", "{}")
	d, err := New(f.b, []Table{{Table: tb}}, func(c *config) { c.count = testPolicy(50 * time.Millisecond) })
	if err != nil {
		t.Fatal(err)
	}
	c, u := serve(t, d, "")
	release := lockPG(t, f, f.q(tb.Name))
	defer release()

	// The page refreshes every few seconds (DefaultRefresh): longer than a count takes to
	// fail, so each render comes after the last count ended.
	var body string
	deadline := time.Now().Add(4 * time.Second) // ten counts fail meanwhile
	for time.Now().Before(deadline) {
		_, body = get(t, c, u+"/")
		if strings.Contains(body, `class="error"`) {
			if !strings.Contains(body, "statement timeout") {
				t.Fatalf("an error shown, but not the count's:\n%s", body)
			}
			return
		}
		time.Sleep(400 * time.Millisecond)
	}
	t.Fatalf("every count failed (statement timeout) for 4 s, and no render showed the error; the last one says:\n%s", section(body, tb.Name))
}

// Rule 6 again, after a kept count: a kept slow count is due, its recount fails after
// the budget. The page then neither shows the error nor the kept numbers: the "Counting"
// note, as if nothing had ever been counted.
func TestReviewCountsSlowErrorAfterKeptIsShown(t *testing.T) {
	f := newFixture(t, pgWithParams("statement_timeout=600"))
	tb := f.jobsTable("dash_rv_err2_")
	tq := f.q(tb.Name)
	f.publish(tb, "emails", "{}")
	d, err := New(f.b, []Table{{Table: tb}}, func(c *config) {
		c.count = testPolicy(50 * time.Millisecond)
		c.count.keepFactor = 1
		c.count.keepMin = 300 * time.Millisecond
	})
	if err != nil {
		t.Fatal(err)
	}
	c, u := serve(t, d, "")
	overview := func() string { t.Helper(); _, body := get(t, c, u+"/"); return body }

	// A slow count (200 ms on a lock) that succeeds: kept.
	release := lockPG(t, f, tq)
	overview()
	time.Sleep(200 * time.Millisecond)
	release()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(overview(), `data-kept="`+tb.Name+`"`) {
		if time.Now().After(deadline) {
			t.Fatal("the slow count was never kept")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Now every count fails after 600 ms.
	release = lockPG(t, f, tq)
	defer release()
	var body string
	deadline = time.Now().Add(5 * time.Second)
	var seen []string
	for time.Now().Before(deadline) {
		body = overview()
		switch {
		case strings.Contains(body, `class="error"`):
			return
		case strings.Contains(body, "data-counting"):
			seen = append(seen, "counting")
		case strings.Contains(body, "data-kept"):
			seen = append(seen, "kept")
		default:
			seen = append(seen, "?")
		}
		time.Sleep(700 * time.Millisecond) // a refresh comes after the last count failed

	}
	t.Fatalf("the recounts of a kept count all failed (statement timeout) for 5 s and no render showed the error; renders showed %v; the last:\n%s", seen, section(body, tb.Name))
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

// Rule 5 / Shutdown: a background count outlives the render that started it, bound to
// nothing but countTimeout (5 min). The broker's Shutdown closes its pool, which waits for
// the connection the count holds: Shutdown hangs until the count ends, whatever its
// context says, though no request is left (before 797208f the count ran in the request's
// context and ended with it).
func TestReviewCountsShutdownDuringBackgroundCount(t *testing.T) {
	f := newFixture(t, databases[1])
	tb := f.jobsTable("dash_rv_shut_")
	f.publish(tb, "emails", "{}")
	b, err := rowactor.Open(ctx, f.db.dsn(t), rowactor.WithPollOnly()) // the dashboard's broker, shut down here
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(b, []Table{{Table: tb}}, func(c *config) { c.count = testPolicy(50 * time.Millisecond) })
	if err != nil {
		t.Fatal(err)
	}
	release := lockPG(t, f, f.q(tb.Name))
	const hold = 8 * time.Second
	time.AfterFunc(hold, release) // the lock ends, whatever happens, so that nothing hangs for good

	reqCtx, cancelReq := context.WithCancel(ctx)
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(reqCtx))
	cancelReq() // the browser went away
	if !strings.Contains(rec.Body.String(), "data-counting") {
		t.Fatalf("want the counting note while the count waits on the lock:\n%s", rec.Body.String())
	}

	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err = b.Shutdown(sctx)
	took := time.Since(start)
	t.Logf("Shutdown: %v after %v", err, took.Round(time.Millisecond))
	if took > 4*time.Second {
		t.Fatalf("Shutdown(ctx of 2 s) took %v: it waited for the dashboard's background count (it returned only when the lock was released, after %v)", took.Round(time.Millisecond), hold)
	}
}

// Rule 4: "a count that started before the action must not be taken as fresh afterwards".
// A render that finds a count running waits for it (when none is kept) and shows its
// numbers as read now, unmarked, even when an action changed the table after that count
// began: the page right after a cancel shows the row still queued. The count is slow for
// real: a queue of a million rows (360 ms on PostgreSQL here), under a budget that lets a
// render wait for it (so it is "quick": keep is 0, read at every render). The same holds
// with the default budget for any count that ends within it, only the window is smaller.
func TestReviewCountsActionDuringCountIsNotFresh(t *testing.T) {
	f := newFixture(t, databases[1])
	tb := f.jobsTable("dash_rv_act_")
	tq := f.q(tb.Name)
	id := f.publish(tb, "emails", "{}")
	f.exec("INSERT INTO " + tq + " (payload, queue) SELECT '{}', 'emails' FROM generate_series(1, 1000000)")
	f.exec("ANALYZE " + tq)
	d, err := New(f.b, []Table{{Table: tb}}, func(c *config) { c.count = testPolicy(10 * time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	c, u := serve(t, d, "")
	overview := func() string { t.Helper(); _, body := get(t, c, u+"/"); return body }
	_, jobPage := get(t, c, u+"/job?table="+url.QueryEscape(tb.Name)+"&id="+strconv.FormatInt(id, 10))
	csrf := token(t, jobPage)
	before := counts(t, overview(), tb.Name, "emails")["queued"] // a first count, read live

	// Render A starts a count; a cancel comes while it runs; render B comes after the
	// cancel and finds A's count still running.
	var aEnded time.Time
	aDone := make(chan struct{})
	go func() {
		defer close(aDone)
		if resp, err := c.Get(u + "/"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		aEnded = time.Now()
	}()
	time.Sleep(50 * time.Millisecond)
	status, res := post(t, c, u+"/action", url.Values{"op": {"cancel"}, "table": {tb.Name}, "id": {strconv.FormatInt(id, 10)}, "csrf": {csrf}})
	if status != 200 {
		t.Fatalf("cancel: %d\n%s", status, res)
	}
	actionDone := time.Now()
	bodyB := overview()
	<-aDone
	if !aEnded.After(actionDone) {
		t.Fatalf("setup: render A's count ended (%v) before the cancel did (%v): the count was not slow enough", aEnded, actionDone)
	}
	after := counts(t, overview(), tb.Name, "emails")["queued"] // a count started after the cancel
	if before == after {
		t.Fatalf("setup: the cancel did not change the count (%s)", after)
	}
	if got := counts(t, bodyB, tb.Name, "emails")["queued"]; got != after && !strings.Contains(bodyB, "data-kept") {
		t.Fatalf("the render after the cancel shows %s queued as live numbers (no kept note): the count that started before the cancel, taken as fresh; a count after it says %s (before: %s)", got, after, before)
	}
}

// Regression (passes): several tables rendered side by side, one of them slow. A render
// waits about the budget once, the quick tables show live numbers, the slow one its note;
// ten concurrent renders start one count of the slow table, not ten (rule 5); a cheap
// table that turns slow shows its last numbers marked kept and recounting.
func TestReviewCountsConcurrentTables(t *testing.T) {
	f := newFixture(t, databases[1])
	var tables []Table
	for i := range 3 {
		tb := f.jobsTable("dash_rv_many_")
		for range i + 1 {
			f.publish(tb, "emails", "{}")
		}
		tables = append(tables, Table{Table: tb})
	}
	slow := tables[1].Name
	d, err := New(f.b, tables, func(c *config) { c.count = testPolicy(200 * time.Millisecond) })
	if err != nil {
		t.Fatal(err)
	}
	c, u := serve(t, d, "")
	overview := func() string { t.Helper(); _, body := get(t, c, u+"/"); return body }
	body := overview() // every table cheap: live numbers
	if got := counts(t, body, slow, "emails")["queued"]; got != "2" || strings.Contains(body, "data-kept") {
		t.Fatalf("cheap tables: queued %s, want 2, live:\n%s", got, body)
	}

	release := lockPG(t, f, f.q(slow))
	f.publish(tables[0].Table, "emails", "{}") // the quick tables stay live
	var wg sync.WaitGroup
	bodies := make([]string, 10)
	took := make([]time.Duration, 10)
	for i := range bodies {
		wg.Go(func() {
			start := time.Now()
			resp, err := c.Get(u + "/")
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var b strings.Builder
			_, _ = io.Copy(&b, resp.Body)
			bodies[i], took[i] = b.String(), time.Since(start)
		})
	}
	time.Sleep(100 * time.Millisecond)
	var waiting int64
	if err := f.sql.QueryRowContext(ctx, "SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND NOT granted", slow).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	release()
	if waiting != 1 {
		t.Errorf("%d sessions wait on the slow table's lock during ten concurrent renders, want 1 count", waiting)
	}
	for i, b := range bodies {
		if took[i] > 2*time.Second {
			t.Errorf("render %d took %v with one slow table among three", i, took[i])
		}
		if got := counts(t, b, tables[0].Name, "emails")["queued"]; got != "2" {
			t.Errorf("render %d: quick table shows %s queued, want 2 (live)", i, got)
		}
		if !strings.Contains(b, `data-kept="`+slow+`"`) || !strings.Contains(b, `data-recounting="1"`) || counts(t, b, slow, "emails")["queued"] != "2" {
			t.Errorf("render %d: a cheap table turned slow should show its last numbers (2), kept, recounting:\n%s", i, section(b, slow))
		}
		if strings.Contains(section(b, tables[2].Name), "data-kept") {
			t.Errorf("render %d: the quick table is marked kept", i)
		}
	}
}

// Regression (passes): a stubbed dashboard clock (WithClock, far in the past) does not
// make the cache keep or drop counts: it keeps time by the wall clock.
func TestReviewCountsStubbedClock(t *testing.T) {
	f := newFixture(t, databases[1])
	tb := f.jobsTable("dash_rv_clock_")
	f.publish(tb, "emails", "{}")
	stub := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	d, err := New(f.b, []Table{{Table: tb}}, WithClock(func() time.Time { return stub }), func(c *config) {
		c.count = testPolicy(50 * time.Millisecond)
		c.count.keepFactor = 1
		c.count.keepMin = 500 * time.Millisecond
	})
	if err != nil {
		t.Fatal(err)
	}
	c, u := serve(t, d, "")
	overview := func() string { t.Helper(); _, body := get(t, c, u+"/"); return body }
	if got := counts(t, overview(), tb.Name, "emails")["queued"]; got != "1" {
		t.Fatalf("queued %s, want 1", got)
	}
	f.publish(tb, "emails", "{}")
	if got := counts(t, overview(), tb.Name, "emails")["queued"]; got != "2" {
		t.Fatalf("a cheap count under a stubbed clock: queued %s, want 2 (live)", got)
	}
	release := lockPG(t, f, f.q(tb.Name))
	overview()
	time.Sleep(150 * time.Millisecond)
	release()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(overview(), `data-kept="`+tb.Name+`"`) {
		if time.Now().After(deadline) {
			t.Fatal("a slow count is not kept under a stubbed clock")
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.publish(tb, "emails", "{}")
	if body := overview(); counts(t, body, tb.Name, "emails")["queued"] != "2" || !strings.Contains(body, "Counted 0s ago") {
		t.Fatalf("kept count under a stubbed clock: want 2 queued, counted 0s ago:\n%s", section(body, tb.Name))
	}
	time.Sleep(600 * time.Millisecond) // due by the wall clock
	deadline = time.Now().Add(5 * time.Second)
	for counts(t, overview(), tb.Name, "emails")["queued"] != "3" {
		if time.Now().After(deadline) {
			t.Fatal("the kept count never became due under a stubbed clock")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
