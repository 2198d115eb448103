package dialecttest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
)

// jobListScenarios are ListJobs' and FinishedPerMinute's (dialects.JobLister,
// dialects.FinishedCounter): the dashboard's job list and its chart of finished rows.
var jobListScenarios = []scenario{
	{name: "FiltersAndPages", run: testListJobsFiltersAndPages},
	{name: "FinishedPerMinute", run: testFinishedPerMinute},
	{name: "HasFinishedIndex", run: testHasFinishedIndex},
	{name: "QueueStatsLeavesFinishedOut", run: testQueueStats},
	{name: "FinishedGroups", run: testFinishedGroups},
	{name: "CancelledRowsReadAsCancelled", run: testCancelledState},
}

// A row a cancellation ended and kept reads as cancelled, in Inspect, ListJobs and Stats,
// and its reason is left out of Stats' most frequent errors; a row dropped with an error
// that only looks alike (another case, no prefix) stays processed, and its error counts.
func testCancelledState(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_cancelstate", func(name string) dialects.Table {
		tb := leaseTable(name)
		tb.ProcessedAt, tb.Error = "processed_at", "error"
		return tb
	})
	tq := e.q(tbl.Name)
	cancelled := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("c")})
	if err := controller(t, e.d).Cancel(ctx, tbl, cancelled, t0, "not wanted"); err != nil {
		t.Fatal(err)
	}
	// As the outcome Cancel leaves a row: the ack step with the prefixed reason.
	e.exec("UPDATE "+tq+" SET processed_at = ? , error = ? WHERE id = ?", h.TimeArg(t0), dialects.CancelledError("not wanted"),
		e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("c2")}))
	processed := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	e.exec("UPDATE "+tq+" SET processed_at = ?, error = ? WHERE id = ?", h.TimeArg(t0), "Cancelled: boom", processed)
	failing := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("f")})
	e.exec("UPDATE "+tq+" SET error = ? WHERE id = ?", "boom", failing)

	in := inspector(t, e.d)
	if j := inspectRow(t, in, tbl, cancelled); j.State != dialects.JobCancelled || j.Error != "cancelled: not wanted" {
		t.Errorf("the cancelled row reads %v, error %q; want cancelled, %q", j.State, j.Error, "cancelled: not wanted")
	}
	if j := inspectRow(t, in, tbl, processed); j.State != dialects.JobProcessed {
		t.Errorf("a dropped row whose error only looks alike reads %v, want processed", j.State)
	}
	jobs, err := e.d.(dialects.JobLister).ListJobs(ctx, tbl, dialects.JobFilter{States: []dialects.JobState{dialects.JobCancelled}}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 2 || jobs[0].ID != cancelled || jobs[0].State != dialects.JobCancelled {
		t.Errorf("ListJobs of the cancelled state: %+v, want the two cancelled rows", jobs)
	}
	all, err := e.d.(dialects.Admin).Stats(ctx, tbl, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].Cancelled != 2 || all[0].Processed != 1 || all[0].Due != 1 {
		t.Fatalf("Stats %+v, want 2 cancelled, 1 processed, 1 due", all)
	}
	var texts []string
	for _, c := range all[0].Errors {
		texts = append(texts, c.Error)
	}
	if slices.Sort(texts); !slices.Equal(texts, []string{"Cancelled: boom", "boom"}) {
		t.Errorf("Stats' most frequent errors %q, want the failures only, no cancellation's reason", texts)
	}
}

// FinishedGroups lists each group that holds a finished row once, in group order, up to
// its limit, whatever else the group holds; a group without one is left out. It refuses a
// description without groups or processed_at, and a limit that is not positive.
func testFinishedGroups(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_fgroups", leaseTableWithProcessed)
	for _, g := range []string{"b", "a", "b", "c", "queued only"} {
		e.publish(tbl, dialects.Message{Group: g, Payload: []byte("p")})
	}
	e.exec("UPDATE "+e.q(tbl.Name)+" SET processed_at = ? WHERE grp <> 'queued only'", h.TimeArg(t0))
	e.publish(tbl, dialects.Message{Group: "a", Payload: []byte("unfinished")})
	gl, ok := e.d.(dialects.GroupLister)
	if !ok {
		t.Fatalf("%T is not a dialects.GroupLister", e.d)
	}
	names := func(limit int) []string {
		t.Helper()
		got, err := gl.FinishedGroups(ctx, tbl, limit)
		if err != nil {
			t.Fatalf("FinishedGroups(%d): %v", limit, err)
		}
		var out []string
		for _, g := range got {
			if g.NullGroup {
				t.Fatalf("FinishedGroups(%d): a NULL group in %+v", limit, got)
			}
			out = append(out, g.Group)
		}
		return out
	}
	if got := names(10); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("FinishedGroups: %q, want a, b and c", got)
	}
	if got := names(2); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("FinishedGroups at limit 2: %q, want a and b", got)
	}
	noGroup, noProcessed := tbl, tbl
	noGroup.Group, noProcessed.ProcessedAt = "", ""
	for what, c := range map[string]struct {
		tbl   dialects.Table
		limit int
	}{"no group": {noGroup, 10}, "no processed_at": {noProcessed, 10}, "limit 0": {tbl, 0}} {
		var ce *dialects.ConfigError
		if _, err := gl.FinishedGroups(ctx, c.tbl, c.limit); !errors.As(err, &ce) {
			t.Errorf("FinishedGroups with %s: %v, want a *ConfigError", what, err)
		}
	}
}

// QueueStats counts what Stats counts of the unfinished rows, and nothing of the finished:
// no processed count, no group whose rows are all finished, no finished row's error.
func testQueueStats(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_qstats", func(name string) dialects.Table {
		tb := leaseTable(name)
		tb.ProcessedAt, tb.Error = "processed_at", "error"
		return tb
	})
	tq := e.q(tbl.Name)
	for range 3 {
		e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("due")})
	}
	delayed := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("delayed")})
	e.exec("UPDATE "+tq+" SET retry_after = ?, error = ? WHERE id = ?", h.TimeArg(t0.Add(time.Hour)), "retrying: boom", delayed)
	leased := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("in work")})
	e.exec("UPDATE "+tq+" SET locked_until = ? WHERE id = ?", h.TimeArg(t0.Add(time.Minute)), leased)
	for _, g := range []string{"g", "g", "done"} {
		id := e.publish(tbl, dialects.Message{Group: g, Payload: []byte("finished")})
		e.exec("UPDATE "+tq+" SET processed_at = ?, error = ? WHERE id = ?", h.TimeArg(t0.Add(-time.Minute)), "dropped: finished", id)
	}
	qc, ok := e.d.(dialects.QueueCounter)
	if !ok {
		t.Fatalf("%T is not a dialects.QueueCounter", e.d)
	}
	got, err := qc.QueueStats(ctx, tbl, t0)
	if err != nil {
		t.Fatal(err)
	}
	all, err := e.d.(dialects.Admin).Stats(ctx, tbl, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Group != "g" || len(all) != 2 {
		t.Fatalf("QueueStats %+v (Stats %+v), want group g alone", got, all)
	}
	g, a := got[0], all[1]
	if a.Group != "g" {
		a = all[0]
	}
	if g.Due != 3 || g.Delayed != 1 || g.InWork != 1 || g.Processed != 0 || a.Processed != 2 ||
		g.Due != a.Due || g.Delayed != a.Delayed || g.InWork != a.InWork || g.Oldest.ID != a.Oldest.ID {
		t.Errorf("QueueStats %+v, Stats %+v", g, a)
	}
	if len(g.Errors) != 1 || g.Errors[0].Error != "retrying: boom" {
		t.Errorf("QueueStats' errors %+v, want the unfinished row's only", g.Errors)
	}
}

// Each filter keeps exactly its rows, in id order, and keyset pages cover the list once,
// forwards and backwards, each row in the state Inspect reads.
func testListJobsFiltersAndPages(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_list", func(name string) dialects.Table {
		tb := leaseTable(name)
		tb.ProcessedAt, tb.Error = "processed_at", "error"
		return tb
	})
	var all, other []int64
	for i := range 9 {
		all = append(all, e.publish(tbl, dialects.Message{Group: "g", Payload: fmt.Appendf(nil, "p%d", i)}))
	}
	other = append(other, e.publish(tbl, dialects.Message{Group: "other", Payload: []byte("o")}))
	later := t0.Add(time.Hour)
	tq := e.q(tbl.Name)
	// all[1], all[4]: delayed; all[2]: in work; all[3]: processed; all[4], all[5]: three
	// calls made (the lease form's column runs one ahead: 4) with an error; all[6]: two
	// calls made with another error.
	e.exec("UPDATE "+tq+" SET retry_after = ? WHERE id IN (?, ?)", h.TimeArg(later), all[1], all[4])
	e.exec("UPDATE "+tq+" SET locked_until = ? WHERE id = ?", h.TimeArg(later), all[2])
	e.exec("UPDATE "+tq+" SET processed_at = ? WHERE id = ?", h.TimeArg(t0.Add(-time.Minute)), all[3])
	e.exec("UPDATE "+tq+" SET attempt = 4, error = ? WHERE id IN (?, ?)", "smtp: Connection refused", all[4], all[5])
	e.exec("UPDATE "+tq+" SET attempt = 3, error = ? WHERE id = ?", "template missing", all[6])

	l, ok := e.d.(dialects.JobLister)
	if !ok {
		t.Fatalf("%T is not a dialects.JobLister", e.d)
	}
	list := func(f dialects.JobFilter) []dialects.Job {
		t.Helper()
		jobs, err := l.ListJobs(ctx, tbl, f, t0)
		if err != nil {
			t.Fatalf("ListJobs(%+v): %v", f, err)
		}
		return jobs
	}
	idsOf := func(jobs []dialects.Job) []int64 {
		out := make([]int64, len(jobs))
		for i, j := range jobs {
			out[i] = j.ID
		}
		return out
	}
	g := dialects.JobFilter{Group: "g", HasGroup: true}
	for _, c := range []struct {
		name string
		f    func(f dialects.JobFilter) dialects.JobFilter
		want []int64
	}{
		{"every group", func(dialects.JobFilter) dialects.JobFilter { return dialects.JobFilter{} }, append(slices.Clone(all), other...)},
		{"group g", func(f dialects.JobFilter) dialects.JobFilter { return f }, all},
		{"delayed", func(f dialects.JobFilter) dialects.JobFilter {
			f.States = []dialects.JobState{dialects.JobDelayed}
			return f
		}, []int64{all[1], all[4]}},
		{"in work or processed", func(f dialects.JobFilter) dialects.JobFilter {
			f.States = []dialects.JobState{dialects.JobInWork, dialects.JobProcessed}
			return f
		}, []int64{all[2], all[3]}},
		{"attempt >= 2", func(f dialects.JobFilter) dialects.JobFilter { f.MinAttempt = 2; return f }, []int64{all[4], all[5], all[6]}},
		{"error contains", func(f dialects.JobFilter) dialects.JobFilter { f.ErrorContains = "Connection refused"; return f }, []int64{all[4], all[5]}},
		{"due, attempt >= 3, error", func(f dialects.JobFilter) dialects.JobFilter {
			f.States, f.MinAttempt, f.ErrorContains = []dialects.JobState{dialects.JobDue}, 3, "smtp"
			return f
		}, []int64{all[5]}},
		{"after", func(f dialects.JobFilter) dialects.JobFilter { f.AfterID = all[6]; return f }, all[7:]},
		{"before", func(f dialects.JobFilter) dialects.JobFilter { f.BeforeID, f.Limit = all[6], 2; return f }, all[4:6]},
	} {
		if got := idsOf(list(c.f(g))); !slices.Equal(got, c.want) {
			t.Errorf("%s: ids %v, want %v", c.name, got, c.want)
		}
	}
	// Pages of 4 forwards, then back from the last page's edge.
	var pages [][]int64
	f := g
	f.Limit = 4
	for {
		p := idsOf(list(f))
		if len(p) == 0 {
			break
		}
		pages = append(pages, p)
		f.AfterID = p[len(p)-1]
	}
	if !slices.Equal(slices.Concat(pages...), all) || len(pages) != 3 {
		t.Errorf("forward pages %v, want %v in pages of 4", pages, all)
	}
	f = g
	f.Limit, f.BeforeID = 4, pages[2][0]
	if got := idsOf(list(f)); !slices.Equal(got, pages[1]) {
		t.Errorf("the page before %d: %v, want %v", pages[2][0], got, pages[1])
	}
	// Each listed row reads as Inspect reads it, but for its payload and headers, which
	// a list does not read (dialects.JobLister).
	in := inspector(t, e.d)
	for _, j := range list(g) {
		want, err := in.Inspect(ctx, tbl, j.ID, t0)
		if err != nil {
			t.Fatal(err)
		}
		if j.Payload != nil || j.Headers != nil {
			t.Errorf("listed row %d holds its payload %q and headers %q: a list reads neither", j.ID, j.Payload, j.Headers)
		}
		want.Payload, want.Headers = nil, nil
		if fmt.Sprint(j) != fmt.Sprint(want) {
			t.Errorf("listed row %d: %+v, Inspect reads %+v", j.ID, j, want)
		}
	}
	// A long error is read cut to ListErrorChars characters (not bytes).
	long := strings.Repeat("é", adminsql.ListErrorChars+50)
	e.exec("UPDATE "+tq+" SET error = ? WHERE id = ?", long, all[6])
	lf := g
	lf.MinAttempt, lf.ErrorContains = 2, "éé"
	if got := list(lf); len(got) != 1 || got[0].Error != strings.Repeat("é", adminsql.ListErrorChars) {
		t.Errorf("a listed row's long error: %+v, want its first %d characters", got, adminsql.ListErrorChars)
	}
}

// Finished rows are counted per group in the minute of their processed_at, those holding
// an error as failed, from since on; a table without processed_at is refused.
func testFinishedPerMinute(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_fin", func(name string) dialects.Table {
		tb := leaseTable(name)
		tb.ProcessedAt, tb.Error = "processed_at", "error"
		return tb
	})
	minute := t0.Truncate(time.Minute)
	tq := e.q(tbl.Name)
	at := func(group string, processed time.Time, errText any) {
		id := e.publish(tbl, dialects.Message{Group: group, Payload: []byte("p")})
		e.exec("UPDATE "+tq+" SET processed_at = ?, error = ? WHERE id = ?", h.TimeArg(processed), errText, id)
	}
	at("g", minute.Add(-3*time.Minute+time.Second), nil) // before since: not counted
	at("g", minute.Add(-2*time.Minute), nil)
	at("g", minute.Add(-2*time.Minute+59*time.Second), "dropped")
	at("g", minute.Add(5*time.Second), nil)
	at("g", minute.Add(6*time.Second), nil)
	at("other", minute.Add(7*time.Second), nil)
	e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("unfinished")})

	fc, ok := e.d.(dialects.FinishedCounter)
	if !ok {
		t.Fatalf("%T is not a dialects.FinishedCounter", e.d)
	}
	got, err := fc.FinishedPerMinute(ctx, tbl, minute.Add(-2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	want := []dialects.MinuteCount{
		{Group: "g", Minute: minute.Add(-2 * time.Minute), Handled: 1, Failed: 1},
		{Group: "g", Minute: minute, Handled: 2},
		{Group: "other", Minute: minute, Handled: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("per minute %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Group != want[i].Group || got[i].NullGroup || !got[i].Minute.Equal(want[i].Minute) ||
			got[i].Handled != want[i].Handled || got[i].Failed != want[i].Failed {
			t.Errorf("line %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	var ce *dialects.ConfigError
	if _, err := fc.FinishedPerMinute(ctx, leaseTable(tbl.Name), minute); !errors.As(err, &ce) {
		t.Errorf("a table without processed_at: %v, want a *ConfigError", err)
	}
}

// HasFinishedIndex is false for the table Schema renders and for an index where
// processed_at comes second, true once FinishedIndexStatement has run; a table without
// processed_at is refused.
func testHasFinishedIndex(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_finidx", func(name string) dialects.Table {
		tb := leaseTable(name)
		tb.ProcessedAt, tb.Error = "processed_at", "error"
		return tb
	})
	fc, ok := e.d.(dialects.FinishedCounter)
	if !ok {
		t.Fatalf("%T is not a dialects.FinishedCounter", e.d)
	}
	has := func(when string, want bool) {
		t.Helper()
		got, err := fc.HasFinishedIndex(ctx, tbl)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if got != want {
			t.Errorf("%s: HasFinishedIndex %v, want %v", when, got, want)
		}
	}
	has("Schema's indexes", false)
	e.exec("CREATE INDEX " + e.q(tbl.Name+"_second") + " ON " + e.q(tbl.Name) + " (" + e.q(tbl.Group) + ", " + e.q(tbl.ProcessedAt) + ")")
	has("an index where processed_at is the second column", false)
	stmt := fc.FinishedIndexStatement(tbl)
	if !strings.Contains(stmt, "CREATE INDEX") || !strings.Contains(stmt, e.q(tbl.ProcessedAt)) {
		t.Errorf("FinishedIndexStatement: %s", stmt)
	}
	e.exec(stmt)
	has("after "+stmt, true)
	var ce *dialects.ConfigError
	if _, err := fc.HasFinishedIndex(ctx, leaseTable(tbl.Name)); !errors.As(err, &ce) {
		t.Errorf("a table without processed_at: %v, want a *ConfigError", err)
	}
}
