package dashboard

import (
	"context"
	"io"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// A table whose count takes longer than a render waits: the first render says its numbers
// are coming and does not wait for them; once counted they are kept (shown with their age,
// not read again at each render) until they are due or an action changes the table. The
// slow count is real: another session holds the table in ACCESS EXCLUSIVE mode, so the
// count waits for it, as it would wait on a million rows.
func TestSlowCountIsKept(t *testing.T) {
	f := newFixture(t, databases[1]) // postgres: LOCK TABLE makes its count slow
	tb := f.jobsTable("dash_slow_")
	tq := f.q(tb.Name)
	for range 3 {
		f.publish(tb, "emails", "{}")
	}
	d, err := New(f.b, []Table{{Table: tb}}, func(c *config) {
		c.count = defaultCount
		c.count.slow, c.count.wait = 50*time.Millisecond, 50*time.Millisecond
		c.count.keepMin = time.Hour // kept until an action makes it due
	})
	if err != nil {
		t.Fatal(err)
	}
	c, u := serve(t, d, "")
	overview := func() string { t.Helper(); _, body := get(t, c, u+"/"); return body }

	lock, err := f.sql.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.ExecContext(ctx, "LOCK TABLE "+tq+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	body := overview()
	if !strings.Contains(body, `data-counting="`+tb.Name+`"`) || strings.Contains(body, `data-count="queued"`) {
		t.Fatalf("a render while the count waits on a lock: want the note that the numbers are coming, and no numbers:\n%s", body)
	}
	time.Sleep(100 * time.Millisecond) // the count, still waiting, takes longer than slow
	if err := lock.Commit(); err != nil {
		t.Fatal(err)
	}

	// The count ends in the background; a later render shows it, kept.
	deadline := time.Now().Add(10 * time.Second)
	for body = overview(); strings.Contains(body, "data-counting"); body = overview() {
		if time.Now().After(deadline) {
			t.Fatal("the count never showed after the lock was released")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := counts(t, body, tb.Name, "emails")["queued"]; got != "3" {
		t.Fatalf("queued %s after the slow count, want 3", got)
	}
	// The render that waited for the count read it; the next one shows it kept.
	if body = overview(); !strings.Contains(body, `data-kept="`+tb.Name+`"`) {
		t.Fatalf("a count slower than slow is not marked as kept:\n%s", body)
	}

	// Rows published since: the kept count shows until it is due.
	id := f.publish(tb, "emails", "{}")
	f.publish(tb, "emails", "{}")
	if n := f.count("SELECT count(*) FROM " + tq + " WHERE processed_at IS NULL"); n != 5 {
		t.Fatalf("%d unfinished rows, want 5", n)
	}
	if got := counts(t, overview(), tb.Name, "emails")["queued"]; got != "3" {
		t.Fatalf("queued %s: the slow count was read again at the next render; want the kept 3", got)
	}

	_, jobPage := get(t, c, u+"/job?table="+url.QueryEscape(tb.Name)+"&id="+strconv.FormatInt(id, 10))
	// An action makes it due: the pages after it count again (quick now, so live again).
	status, res := post(t, c, u+"/action", url.Values{"op": {"cancel"}, "table": {tb.Name}, "id": {strconv.FormatInt(id, 10)}, "csrf": {token(t, jobPage)}, "confirm": {"1"}})
	if status != 200 {
		t.Fatalf("cancel: %d\n%s", status, res)
	}
	// 4 is a new count (the kept one says 3); it reads live when the recount is quick, and
	// kept again when a loaded machine made it slow: either way the action made it due.
	deadline = time.Now().Add(20 * time.Second)
	for {
		body = overview()
		if counts(t, body, tb.Name, "emails")["queued"] == "4" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a cancel the overview still shows the kept count, want 4 queued, counted live:\n%s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCountPolicyKeep(t *testing.T) {
	p := countPolicy{slow: countSlow, keepFactor: countKeepFactor, keepMin: countKeepMin, keepMax: countKeepMax}
	for _, c := range []struct {
		took, want time.Duration
	}{
		{5 * time.Millisecond, 0},                  // cheap: read at every render
		{p.slow - time.Millisecond, 0},             // still quick
		{p.slow, p.keepMin},                        // 100 × 100 ms = 10 s
		{450 * time.Millisecond, 45 * time.Second}, // a million queued rows
		{30 * time.Second, p.keepMax},              // bounded
		{2 * time.Second, time.Duration(200) * time.Second},
	} {
		if got := p.keep(c.took); got != c.want {
			t.Errorf("keep(%v) = %v, want %v", c.took, got, c.want)
		}
	}
}

// The chart's read of its hour: a render waits for it at most wait, a second render
// while it runs joins it rather than starting another, and the one after it ended gets
// its result.
func TestChartReadsWaitAtMost(t *testing.T) {
	var c chartReads
	release := make(chan struct{})
	var started atomic.Int32
	read := func(context.Context) (map[string][]rowactor.ThroughputMinute, error) {
		started.Add(1)
		<-release
		return map[string][]rowactor.ThroughputMinute{"g": emptyHour(time.Now())}, nil
	}
	if _, ok, _ := c.read(ctx, "t", 20*time.Millisecond, time.Minute, nil, read); ok {
		t.Fatal("a read still running was reported done")
	}
	if _, ok, _ := c.read(ctx, "t", 20*time.Millisecond, time.Minute, nil, read); ok || started.Load() != 1 {
		t.Fatalf("a second render: done %v, reads started %d; want it to join the running read", ok, started.Load())
	}
	close(release)
	m, ok, err := c.read(ctx, "t", time.Minute, time.Minute, nil, read)
	if !ok || err != nil || len(m["g"]) != rowactor.ThroughputMinutes {
		t.Fatalf("the read after release: %v %v %d minutes", ok, err, len(m["g"]))
	}
}

// testPolicy is the production policy with slow and wait both d (the tests' TestMain
// makes every other count live).
func testPolicy(d time.Duration) countPolicy {
	return countPolicy{slow: d, wait: d, keepFactor: countKeepFactor, keepMin: countKeepMin, keepMax: countKeepMax, timeout: countTimeout}
}

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

// A count that fails after the render stopped waiting for it (here: statement_timeout, as
// a DBA sets on the dashboard's role) has its error shown by a later render, not the
// "Counting" note forever.
func TestSlowCountErrorIsShown(t *testing.T) {
	// 1.5 s: the fixture's own statements (CREATE TABLE) run under it too, and one took
	// more than 300 ms on a loaded CI machine.
	f := newFixture(t, pgWithParams("statement_timeout=1500"))
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
	deadline := time.Now().Add(8 * time.Second) // four counts fail meanwhile
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
	t.Fatalf("every count failed (statement timeout) for 8 s, and no render showed the error; the last one says:\n%s", section(body, tb.Name))
}

// When the recount of a kept slow count fails after the budget, a later render shows the
// error, not the "Counting" note.
func TestRecountErrorAfterKeptCountIsShown(t *testing.T) {
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

// The broker's Shutdown returns within its context while a background count the
// dashboard started (for a render whose request has gone) still waits on a lock.
func TestShutdownDoesNotWaitForBackgroundCount(t *testing.T) {
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

// A count that started before an action is not shown as fresh after it: the render
// right after a cancel, finding that count still running, shows the cancel's effect or
// marks the numbers kept. The count is slow for real: a queue of a million rows, under a
// budget that lets a render wait for it.
func TestCountStartedBeforeActionIsNotFresh(t *testing.T) {
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
	status, res := post(t, c, u+"/action", url.Values{"op": {"cancel"}, "table": {tb.Name}, "id": {strconv.FormatInt(id, 10)}, "csrf": {csrf}, "confirm": {"1"}})
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

// With one slow table among three, concurrent renders each wait about the budget once,
// start one count of the slow table between them, show the quick tables live and the
// slow one's last numbers kept and recounting.
func TestConcurrentRendersShareOneSlowCount(t *testing.T) {
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
	// A second for "slow": under the suite's load a three-row table's count took 345 ms
	// once, was kept as slow before the lock, and no render recounted it.
	d, err := New(f.b, tables, func(c *config) { c.count = testPolicy(time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	c, u := serve(t, d, "")
	overview := func() string { t.Helper(); _, body := get(t, c, u+"/"); return body }
	// Every table cheap: live numbers. A loaded machine may take more than the policy's
	// second for a count: the table then reads as slow, its numbers kept for a hundred
	// times the count (at least 10 s), and a later render shows it live again.
	live := func(body string) bool {
		return !strings.Contains(body, "data-kept") && !strings.Contains(body, "data-counting") &&
			counts(t, body, slow, "emails")["queued"] == "2"
	}
	body := overview()
	for deadline := time.Now().Add(45 * time.Second); !live(body) && time.Now().Before(deadline); body = overview() {
		time.Sleep(100 * time.Millisecond)
	}
	if !live(body) {
		t.Fatalf("cheap tables: want 2 queued, live:\n%s", body)
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
	// The slow table's one count waits on the lock until release, whenever a loaded
	// machine gets it there: look until it does, and once more after the renders.
	var waiting int64
	lockWaits := func() {
		t.Helper()
		if err := f.sql.QueryRowContext(ctx, "SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND NOT granted", slow).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	lockWaits()
	for deadline := time.Now().Add(10 * time.Second); waiting == 0 && time.Now().Before(deadline); lockWaits() {
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	if waiting == 1 {
		lockWaits()
	}
	release()
	if waiting != 1 {
		t.Errorf("%d sessions wait on the slow table's lock during ten concurrent renders, want 1 count", waiting)
	}
	for i, b := range bodies {
		if took[i] > 4*time.Second { // the lock holds until every render returned
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

// A stubbed dashboard clock (WithClock, far in the past) does not make the count cache
// keep or drop counts: it keeps time by the wall clock.
func TestCountCacheKeepsWallClockTime(t *testing.T) {
	f := newFixture(t, databases[1])
	tb := f.jobsTable("dash_rv_clock_")
	f.publish(tb, "emails", "{}")
	stub := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	d, err := New(f.b, []Table{{Table: tb}}, WithClock(func() time.Time { return stub }), func(c *config) {
		c.count = testPolicy(50 * time.Millisecond)
		c.count.keepFactor = 1
		c.count.keepMin = 2 * time.Second // the kept count outlives a loaded request or two
	})
	if err != nil {
		t.Fatal(err)
	}
	c, u := serve(t, d, "")
	overview := func() string { t.Helper(); _, body := get(t, c, u+"/"); return body }
	// A cheap count reads live. Under the suite's load one may take longer than the
	// policy's 50 ms: it is then kept for two seconds (keepMin), and counted again.
	live := func(want string) {
		t.Helper()
		body := overview()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); body = overview() {
			if !strings.Contains(body, "data-counting") && counts(t, body, tb.Name, "emails")["queued"] == want {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("a cheap count under a stubbed clock: want %s queued, live:\n%s", want, section(body, tb.Name))
	}
	live("1")
	f.publish(tb, "emails", "{}")
	live("2")
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
	// Counted by the wall clock: a second or so ago (a loaded run may take one between the
	// count and this page), not the stubbed clock's years.
	if body := overview(); counts(t, body, tb.Name, "emails")["queued"] != "2" || !countedJustNow.MatchString(body) {
		t.Fatalf("kept count under a stubbed clock: want 2 queued, counted 0s or 1s ago:\n%s", section(body, tb.Name))
	}
	time.Sleep(2100 * time.Millisecond) // due by the wall clock
	deadline = time.Now().Add(5 * time.Second)
	for counts(t, overview(), tb.Name, "emails")["queued"] != "3" {
		if time.Now().After(deadline) {
			t.Fatal("the kept count never became due under a stubbed clock")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// countedJustNow matches a kept count's age of under two seconds.
var countedJustNow = regexp.MustCompile(`Counted [01]s ago`)
