package dashboard

import (
	"context"
	"net/url"
	"strconv"
	"strings"
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
	status, res := post(t, c, u+"/action", url.Values{"op": {"cancel"}, "table": {tb.Name}, "id": {strconv.FormatInt(id, 10)}, "csrf": {token(t, jobPage)}})
	if status != 200 {
		t.Fatalf("cancel: %d\n%s", status, res)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		body = overview()
		if counts(t, body, tb.Name, "emails")["queued"] == "4" && !strings.Contains(body, "data-kept") {
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
