package dashboard

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rowactor/rowactor"
)

// The browser tests drive headless Chromium (Debian's package chromium; scripts/test.sh
// installs it when missing) through chromedp. Without a browser they fail, as the tests
// fail without a database server: a dashboard never seen in a browser is not tested.
// ROWACTOR_SKIP_BROWSER=1 skips them instead, for a machine that cannot have one; CI
// never sets it. ROWACTOR_CHROMIUM names the browser's binary when it is not on PATH.
//
// -screenshots writes docs/dashboard-overview.png and docs/dashboard-job.png from the
// SQLite run (the README shows them):
//
//	go test ./dashboard -run TestBrowser/sqlite -screenshots
var screenshots = flag.Bool("screenshots", false, "write docs/dashboard-overview.png and docs/dashboard-job.png (TestBrowser, SQLite)")

// browser starts one headless Chromium for the test and its subtests.
func browser(t *testing.T) context.Context {
	t.Helper()
	if os.Getenv("ROWACTOR_SKIP_BROWSER") == "1" {
		t.Skip("ROWACTOR_SKIP_BROWSER=1: the browser tests are skipped")
	}
	path := os.Getenv("ROWACTOR_CHROMIUM")
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path != "" {
			break
		}
		path, _ = exec.LookPath(name)
	}
	if path == "" {
		t.Fatal("no Chromium: install it (apt-get install chromium; scripts/test.sh does), name it in ROWACTOR_CHROMIUM, " +
			"or set ROWACTOR_SKIP_BROWSER=1 to skip the browser tests")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // CI runs as root, where Chromium's sandbox cannot start
		chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true), // containers' /dev/shm is small
		chromedp.WindowSize(1280, 800),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	// Start the browser now, so that a broken install fails here and says so.
	if err := chromedp.Do(bctx); err != nil {
		cancelBrowser()
		cancelAlloc()
		t.Fatalf("starting %s: %v", path, err)
	}
	t.Cleanup(func() {
		if err := chromedp.Cancel(bctx); err != nil {
			t.Logf("closing the browser: %v", err)
		}
		cancelBrowser()
		cancelAlloc()
	})
	return bctx
}

// tab opens a tab of the browser for one subtest, closed when it ends.
func tab(t *testing.T, bctx context.Context) context.Context {
	t.Helper()
	tctx, cancel := chromedp.NewContext(bctx)
	tctx, cancelTimeout := context.WithTimeout(tctx, 2*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancel()
	})
	return tctx
}

// run runs a chromedp action returning a value.
func run[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// click clicks sel and waits for the page it loads.
func click(t *testing.T, ctx context.Context, sel chromedp.CSS) int64 {
	t.Helper()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(sel))
	if err != nil {
		t.Fatalf("click %s: %v", sel, err)
	}
	return resp.Status
}

// listedIDs reads the job list's ids from the page.
func listedIDs(t *testing.T, ctx context.Context) []int64 {
	t.Helper()
	return run(t, ctx, "read the job list", chromedp.Evaluate[[]int64](
		`Array.from(document.querySelectorAll("#jobs tr[data-id]")).map(r => Number(r.dataset.id))`))
}

// A browser loads the dashboard of a table filled on each database: the overview's
// numbers are the SQL counts, the chart renders, the job list filters and pages, the job
// page shows the row, a POST without the CSRF token is refused, and "requeue dead
// letters", once confirmed, moves the rows.
func TestBrowser(t *testing.T) {
	bctx := browser(t)
	eachDB(t, func(t *testing.T, f *fixture) {
		var tb rowactor.Table
		if f.db.name == "sqlite" {
			tb = f.jobsTableNamed("email_jobs") // a file of the test's own: the screenshots' name
		} else {
			tb = f.jobsTable("dash_browser_")
		}
		tq := f.q(tb.Name)
		now := time.Now()
		fill := func(group string, n int, payload func(i int) string, opts ...rowactor.PublishOption) []int64 {
			var ids []int64
			for i := range n {
				ids = append(ids, f.publish(tb, group, payload(i), opts...))
			}
			return ids
		}
		in := func(ids []int64) string {
			s := make([]string, len(ids))
			for i, id := range ids {
				s[i] = strconv.FormatInt(id, 10)
			}
			return "(" + strings.Join(s, ", ") + ")"
		}
		email := func(i int) string {
			return fmt.Sprintf(`{"to":"user%d@example.com","template":"welcome","locale":"en"}`, i)
		}
		// An hour of finished rows, some dropped with an error, for the chart (which needs
		// an index on processed_at).
		f.finishedIndex(tb)
		finished := fill("emails", 90, email)
		for i, id := range finished {
			errText := any(nil)
			if i%9 == 4 {
				errText = "dropped: invalid address"
			}
			ago := time.Duration((i*37)%58+1) * time.Minute
			f.exec("UPDATE "+tq+" SET processed_at = ?, error = ? WHERE id = ?", now.Add(-ago), errText, id)
		}
		fill("emails", 9, email)
		failing := fill("emails", 2, email, rowactor.WithHeaders(map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme"}))
		// Calls made, as the pages show them, are one below a lease table's column.
		f.exec("UPDATE "+tq+" SET attempt = 4, error = ? WHERE id IN "+in(failing), "smtp: 421 4.7.0 try again later")
		scheduled := fill("emails", 3, email)
		f.exec("UPDATE "+tq+" SET retry_after = ? WHERE id IN "+in(scheduled), now.Add(20*time.Minute))
		inWork := fill("emails", 2, email)
		f.exec("UPDATE "+tq+" SET locked_until = ?, attempt = 3 WHERE id IN "+in(inWork), now.Add(time.Minute))
		dead := fill("emails-dead", 4, email)
		f.exec("UPDATE "+tq+" SET attempt = 6, error = ?, dead_at = ? WHERE id IN "+in(dead), "smtp: 550 5.1.1 mailbox unavailable", now.Add(-3*time.Minute))
		fill("sms", 5, func(i int) string { return fmt.Sprintf("\x0a\x0c+1555010%04d", i) })

		d, err := New(f.b, []Table{{Table: tb, DeadLetters: map[string]string{"emails": "emails-dead"}}},
			PageSize(5), Refresh(0), TraceURL("http://localhost:16686/trace/{trace_id}"))
		if err != nil {
			t.Fatal(err)
		}
		_, u := serve(t, d, "/admin/queues")

		// The tab's two minutes start here, not before the fill: a loaded suite's fill took
		// part of them.
		ctx := tab(t, bctx)

		// The overview's numbers are the SQL counts.
		do(t, ctx, "open the overview", chromedp.Navigate(u+"/"))
		sqlNow := time.Now()
		unfinished := "SELECT count(*) FROM " + tq + " WHERE queue = ? AND processed_at IS NULL"
		notLive := " AND (locked_until IS NULL OR locked_until <= ?)"
		want := map[string]string{
			"queued":    strconv.FormatInt(f.count(unfinished, "emails"), 10),
			"due":       strconv.FormatInt(f.count(unfinished+notLive+" AND (retry_after IS NULL OR retry_after <= ?)", "emails", sqlNow, sqlNow), 10),
			"scheduled": strconv.FormatInt(f.count(unfinished+notLive+" AND retry_after > ?", "emails", sqlNow, sqlNow), 10),
			"in-work":   strconv.FormatInt(f.count(unfinished+" AND locked_until > ?", "emails", sqlNow), 10),
			"dead":      strconv.FormatInt(f.count(unfinished, "emails-dead"), 10),
			"handled":   strconv.FormatInt(f.count("SELECT count(*) FROM "+tq+" WHERE queue = ? AND processed_at IS NOT NULL AND error IS NULL", "emails"), 10),
			"failed":    strconv.FormatInt(f.count("SELECT count(*) FROM "+tq+" WHERE queue = ? AND processed_at IS NOT NULL AND error IS NOT NULL", "emails"), 10),
		}
		line := fmt.Sprintf(`document.querySelector('section[data-table="%s"] tr[data-group="emails"]')`, tb.Name)
		got := run(t, ctx, "read the overview", chromedp.Evaluate[map[string]string](
			`Object.fromEntries(Array.from(`+line+`.querySelectorAll("[data-count]")).map(e => [e.dataset.count, e.textContent.trim()]))`))
		for k, v := range want {
			if got[k] != v {
				t.Errorf("overview: %s reads %q in the browser, SQL counts %s", k, got[k], v)
			}
		}
		// The chart is drawn: its box has the chart's size, with bars of both kinds.
		chart := run(t, ctx, "measure the chart", chromedp.Evaluate[[]float64](
			`(() => { const s = `+line+`.querySelector("svg.chart"); const r = s.getBoundingClientRect();
			  return [r.width, r.height, s.querySelectorAll("rect.ok").length, s.querySelectorAll("rect.failed").length]; })()`))
		if chart[0] != chartW || chart[1] != chartH || chart[2] < 10 || chart[3] < 1 {
			t.Errorf("chart: width, height, bars, failed bars = %v", chart)
		}
		if *screenshots && f.db.name == "sqlite" {
			shoot(t, ctx, "dashboard-overview.png")
		}

		// A POST without the token, from the dashboard's own page, is refused.
		status := run(t, ctx, "POST without a token", chromedp.Evaluate[int](fmt.Sprintf(
			`fetch(%q, {method: "POST", body: new URLSearchParams({op: "requeue", table: %q, group: "emails-dead"})}).then(r => r.status)`,
			u+"/action", tb.Name), chromedp.EvalAwaitPromise))
		if status != http.StatusForbidden {
			t.Errorf("POST without a CSRF token: %d, want 403", status)
		}

		// The job list pages by id and filters by state, attempt and error text.
		do(t, ctx, "open the job list", chromedp.Navigate(u+"/jobs?table="+tb.Name+"&group=emails"))
		firstPages := f.ids("SELECT id FROM "+tq+" WHERE queue = ? ORDER BY id", "emails")
		if got := listedIDs(t, ctx); !slices.Equal(got, firstPages[:5]) {
			t.Errorf("first page %v, want %v", got, firstPages[:5])
		}
		click(t, ctx, "#next")
		if got := listedIDs(t, ctx); !slices.Equal(got, firstPages[5:10]) {
			t.Errorf("second page %v, want %v", got, firstPages[5:10])
		}
		click(t, ctx, "#prev")
		if got := listedIDs(t, ctx); !slices.Equal(got, firstPages[:5]) {
			t.Errorf("back to the first page: %v, want %v", got, firstPages[:5])
		}
		do(t, ctx, "filter scheduled", chromedp.SetValue(chromedp.CSS(`select[name="state"]`), "scheduled"))
		click(t, ctx, "#filters button")
		if got := listedIDs(t, ctx); !slices.Equal(got, scheduled) {
			t.Errorf("scheduled: %v, want %v", got, scheduled)
		}
		do(t, ctx, "filter attempt",
			chromedp.SetValue(chromedp.CSS(`select[name="state"]`), ""),
			chromedp.SetValue(chromedp.CSS(`input[name="min_attempt"]`), "2"))
		click(t, ctx, "#filters button")
		if got, want := listedIDs(t, ctx), slices.Concat(failing, inWork); !slices.Equal(got, want) {
			t.Errorf("attempt >= 2: %v, want %v", got, want)
		}
		do(t, ctx, "filter attempt and error",
			chromedp.SetValue(chromedp.CSS(`input[name="min_attempt"]`), "3"),
			chromedp.SetValue(chromedp.CSS(`input[name="error"]`), "421"))
		click(t, ctx, "#filters button")
		if got := listedIDs(t, ctx); !slices.Equal(got, failing) {
			t.Errorf("attempt >= 3 and error 421: %v, want %v", got, failing)
		}

		// The job page shows the row.
		click(t, ctx, chromedp.CSS(fmt.Sprintf(`#jobs tr[data-id="%d"] a`, failing[0])))
		job := run(t, ctx, "read the job page", chromedp.Evaluate[map[string]string](
			`Object.fromEntries(Array.from(document.querySelectorAll("[data-field]")).map(e => [e.dataset.field, e.textContent.trim()]))`))
		if job["attempt"] != "3" || !strings.Contains(job["payload"], `"to": "user`) || job["trace"] != "4bf92f3577b34da6a3ce929d0e0e4736" ||
			!strings.Contains(job["error"], "421") {
			t.Errorf("job page: %v", job)
		}
		if *screenshots && f.db.name == "sqlite" {
			shoot(t, ctx, "dashboard-job.png")
		}

		// "requeue dead letters" moves them back into the queue.
		before := f.count(unfinished, "emails")
		do(t, ctx, "open the overview", chromedp.Navigate(u+"/"))
		click(t, ctx, chromedp.CSS(fmt.Sprintf(`section[data-table="%s"] tr[data-group="emails"] button[data-op="requeue"]`, tb.Name)))
		question := run(t, ctx, "read the confirmation", chromedp.Text(chromedp.ID("question")))
		if !strings.Contains(question, "(4 dead letter(s) now)") || f.count(unfinished, "emails-dead") != 4 {
			t.Errorf("requeue asks %q, and must move nothing before it is confirmed", question)
		}
		click(t, ctx, "#confirm button")
		result := run(t, ctx, "read the result", chromedp.Text(chromedp.ID("result")))
		if !strings.Contains(result, "Moved 4 dead letter(s)") {
			t.Errorf("requeue: %q", result)
		}
		if n := f.count(unfinished, "emails-dead"); n != 0 {
			t.Errorf("%d dead letters left", n)
		}
		if n := f.count(unfinished+" AND attempt = 1 AND id IN "+in(dead), "emails"); n != 4 || f.count(unfinished, "emails") != before+4 {
			t.Errorf("%d of the 4 dead letters are back in emails at attempt 1", n)
		}
		click(t, ctx, "#back")
		if got := run(t, ctx, "read the dead letters", chromedp.Text(chromedp.CSS(fmt.Sprintf(`section[data-table="%s"] tr[data-group="emails"] td[data-count="dead"]`, tb.Name)))); got != "0" {
			t.Errorf("dead letters after the requeue: %q, want 0", got)
		}
	})
}

// shoot writes a full-page screenshot into docs/.
func shoot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png := run(t, ctx, "screenshot "+name, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join("..", "docs", name), png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote docs/%s (%d bytes)", name, len(png))
}
