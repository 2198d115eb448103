package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/headers"
	"github.com/rowactor/rowactor/internal/telemetry"
)

// overview is the overview page's data: one section per table.
type overview struct {
	Tables []tableView
}

type tableView struct {
	Name   string
	Form   string
	Groups []groupView
	Error  string // the table could not be read
	// NoChart says why a group without a subscription here has no chart, and how to get
	// one; nil when every group has its chart, or the table has no processed_at.
	NoChart *noChart
	// Counting says the table's count takes longer than a render waits, and none is kept
	// yet: the numbers come at a later refresh (countCache).
	Counting bool
	// Kept is set when the numbers are a count kept from an earlier render.
	Kept *keptCount
}

// keptCount is a count an earlier render read, shown because counting the table is slow.
type keptCount struct {
	Age, Took  time.Duration
	Recounting bool
}

// noChart is why the chart by processed_at is not drawn: the table has no index leading
// with processed_at (Statement creates one), checking for one failed (Err), or the first
// read of the hour's finished rows takes longer than a render waits (Reading).
type noChart struct {
	Statement string
	Err       string
	Reading   bool
}

// groupView is one group's line: counts as Admin.Stats reads them.
type groupView struct {
	Table string
	Group string
	// Grouped says the table has groups (Group is a value, maybe ""); NullGroup the rows
	// whose group is NULL.
	Grouped, NullGroup     bool
	Queued, Due, Scheduled int64
	InWork                 int64
	InWorkCounted          bool
	Processed              int64
	HasProcessed           bool
	// DeadLetterGroup is where this queue's dead letters go, DeadLetters how many rows
	// it holds; DeadLetterOf names the queue when this group is itself a dead-letter group.
	DeadLetterGroup string
	DeadLetters     int64
	// DeadLetterTable is where the dead letters of a table without groups go;
	// DeadLetterError why it could not be counted.
	DeadLetterTable, DeadLetterError string
	DeadLetterOf                     string
	OldestID                         int64
	OldestAge                        time.Duration
	OldestKnown                      bool
	Errors                           []dialects.ErrorCount
	// Subscribed says a subscription of this process reads the queue; Paused its state.
	Subscribed, Paused bool
	Chart              *chart
}

func (d *Dashboard) serveOverview(w http.ResponseWriter, r *http.Request) {
	p := d.newPage(w, r, "Queues")
	p.Refresh = int(d.cfg.refresh / time.Second)
	// The tables are read side by side: slow ones cost a render their wait (countWait)
	// once, not once per table.
	ov := overview{Tables: make([]tableView, len(d.tables))}
	var wg sync.WaitGroup
	for i, t := range d.tables {
		wg.Go(func() {
			defer func() {
				// Outside the request's goroutine net/http would not recover a panic:
				// the table shows it, the process lives on.
				if v := recover(); v != nil {
					d.cfg.log.Error("dashboard: rendering a table panicked", "table", t.Name, "panic", v)
					ov.Tables[i] = tableView{Name: t.Name, Form: t.Form().String(), Error: fmt.Sprintf("rendering this table failed: %v", v)}
				}
			}()
			ov.Tables[i] = d.tableOverview(r.Context(), t, p.Now)
		})
	}
	wg.Wait()
	p.Data = ov
	d.render(w, http.StatusOK, "overview", p)
}

// tableOverview reads one table: Admin.Stats (one statement, and one for the errors),
// then one chart per group.
func (d *Dashboard) tableOverview(ctx context.Context, t Table, now time.Time) tableView {
	tv := tableView{Name: t.Name, Form: t.Form().String()}
	cv := d.queueCounts.get(ctx, d.cfg.count, d.b.Done(), t.Name, func(ctx context.Context) (tableCounts, error) { return d.counts(ctx, t, now) })
	if cv.pending {
		tv.Counting = true
		return tv
	}
	if cv.kept {
		tv.Kept = &keptCount{Age: cv.age, Took: cv.took, Recounting: cv.recounting}
	}
	stats, err := cv.stats.groups, cv.err
	if err != nil {
		d.cfg.log.Warn("dashboard: reading a table's counts failed", "table", t.Name, "err", err)
		tv.Error = err.Error()
		return tv
	}
	var (
		finished   map[string][]rowactor.ThroughputMinute
		finishedOK bool
	)
	if slices.ContainsFunc(stats, func(g dialects.GroupStats) bool { return !g.NullGroup && d.subscription(t, g.Group) == nil }) {
		finished, finishedOK, tv.NoChart = d.finishedOf(ctx, t, now)
	}
	byGroup := map[string]dialects.GroupStats{}
	for _, g := range stats {
		if !g.NullGroup {
			byGroup[g.Group] = g
		}
	}
	for _, g := range stats {
		gv := groupView{Table: t.Name, Group: g.Group, Grouped: t.Group != "", NullGroup: g.NullGroup,
			Queued: g.Due + g.Delayed + g.InWork, Due: g.Due, Scheduled: g.Delayed,
			InWork: g.InWork, InWorkCounted: g.InWorkCounted, Processed: g.Processed, HasProcessed: t.ProcessedAt != "",
			OldestID: g.Oldest.ID, Errors: g.Errors}
		if g.Oldest.ID != 0 {
			if since := dueSince(g.Oldest); !since.IsZero() {
				gv.OldestAge, gv.OldestKnown = max(now.Sub(since), 0), true
			}
		}
		if !g.NullGroup {
			if dl, ok := t.DeadLetters[g.Group]; ok {
				gv.DeadLetterGroup = dl
				dg := byGroup[dl]
				gv.DeadLetters = dg.Due + dg.Delayed + dg.InWork
			}
			if t.DeadLetterTable != "" {
				gv.DeadLetterTable, gv.DeadLetters = t.DeadLetterTable, cv.stats.dead
				if cv.stats.deadErr != nil {
					gv.DeadLetterError = cv.stats.deadErr.Error()
				}
			}
			gv.DeadLetterOf = t.deadLetterOf(g.Group)
			if s := d.subscription(t, g.Group); s != nil {
				gv.Subscribed, gv.Paused = true, s.Paused()
			}
			gv.Chart = d.chartOf(t, g.Group, finished, finishedOK, now)
		}
		tv.Groups = append(tv.Groups, gv)
	}
	return tv
}

// counts reads a table's counts per group: only its unfinished rows where the dialect can
// (dialects.QueueCounter, through the claim index, so a table keeping millions of finished
// rows costs what its queue costs), all of them otherwise (Admin.Stats). A queue named in
// DeadLetters gets a line even when it has no unfinished row, to show its dead letters, as
// does a table without groups; its dead-letter table's rows are counted (Admin.Requeue's
// dry run: one count(*)).
func (d *Dashboard) counts(ctx context.Context, t Table, now time.Time) (tableCounts, error) {
	var (
		stats []dialects.GroupStats
		err   error
	)
	if qc, ok := d.b.Dialect().(dialects.QueueCounter); ok {
		stats, err = qc.QueueStats(ctx, t.Table, now)
	} else {
		stats, err = d.admin.Stats(ctx, t.Table, now)
	}
	if err != nil {
		return tableCounts{}, err
	}
	counted := t.Form() == rowactor.FormLease
	if len(stats) > 0 {
		counted = stats[0].InWorkCounted
	}
	for q := range t.DeadLetters {
		if !slices.ContainsFunc(stats, func(g dialects.GroupStats) bool { return !g.NullGroup && g.Group == q }) {
			stats = append(stats, dialects.GroupStats{Group: q, InWorkCounted: counted})
		}
	}
	if t.Group == "" && !slices.ContainsFunc(stats, func(g dialects.GroupStats) bool { return !g.NullGroup }) {
		stats = append(stats, dialects.GroupStats{InWorkCounted: counted})
	}
	slices.SortStableFunc(stats, func(a, b dialects.GroupStats) int {
		switch {
		case a.NullGroup != b.NullGroup:
			if a.NullGroup {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Group, b.Group)
	})
	out := tableCounts{groups: stats}
	if t.DeadLetterTable != "" {
		n, err := d.admin.Requeue(ctx, dialects.RequeueSpec{Table: t.Table, FromTable: t.DeadLetterTable, DryRun: true}, nil)
		if err != nil {
			d.cfg.log.Warn("dashboard: counting a dead-letter table failed", "table", t.Name, "dead_letter_table", t.DeadLetterTable, "err", err)
			out.deadErr = fmt.Errorf("dead-letter table %s: %w", t.DeadLetterTable, err)
		}
		out.dead = int64(n)
	}
	return out, nil
}

// finishedOf reads the table's finished rows per group and minute over the last hour
// (its chart's cache reads only the last two minutes after the first time), when some
// group may need them: the table has processed_at, the dialect can count by it, and an
// index leads with processed_at (checked at most once per indexRecheck), so that the
// count reads the finished rows of the last minutes, not the whole table. ok is false
// when they are not read; no says why, when the index is missing or the check failed.
func (d *Dashboard) finishedOf(ctx context.Context, t Table, now time.Time) (minutes map[string][]rowactor.ThroughputMinute, ok bool, no *noChart) {
	fc, ok := d.b.Dialect().(dialects.FinishedCounter)
	if !ok || t.ProcessedAt == "" {
		return nil, false, nil
	}
	indexed, err := d.indexes.has(ctx, fc, t, d.cfg.indexRecheck)
	if err != nil {
		d.cfg.log.Warn("dashboard: checking for an index on processed_at failed", "table", t.Name, "err", err)
		return nil, false, &noChart{Err: err.Error()}
	}
	if !indexed {
		return nil, false, &noChart{Statement: fc.FinishedIndexStatement(t.Table)}
	}
	minutes, read, err := d.charts.read(ctx, t.Name, d.cfg.count.wait, d.cfg.count.timeout, d.b.Done(), func(ctx context.Context) (map[string][]rowactor.ThroughputMinute, error) {
		return d.finished.minutes(ctx, fc, t, now)
	})
	if !read {
		return nil, false, &noChart{Reading: true}
	}
	if err != nil {
		d.cfg.log.Warn("dashboard: counting finished rows failed", "table", t.Name, "err", err)
		return nil, false, nil
	}
	return minutes, true, nil
}

// chartOf is the group's throughput over the last hour: this process's settlements when
// a subscription of its broker reads the queue, else the finished rows by processed_at
// where the table keeps them and an index serves their count (finished, ok), else nil.
func (d *Dashboard) chartOf(t Table, group string, finished map[string][]rowactor.ThroughputMinute, ok bool, now time.Time) *chart {
	if d.subscription(t, group) != nil {
		return newChart("settled by this process", d.b.Throughput(t.Table, group))
	}
	if !ok {
		return nil
	}
	minutes := finished[group]
	if minutes == nil {
		minutes = emptyHour(now)
	}
	return newChart("finished rows (processed_at)", minutes)
}

// dueSince is when a due row became due as far as it tells: the latest of its
// retry_after, its expired lease and its publish time; zero when it keeps none. It is
// `rowactor stats`'s OLDEST DUE rule.
func dueSince(r dialects.DueRow) time.Time {
	since := r.RetryAfter
	if r.LockedUntil.After(since) {
		since = r.LockedUntil
	}
	h, _ := headers.Decode(r.Headers) // a malformed column: what can be read of it
	if p, err := time.Parse(time.RFC3339Nano, h[telemetry.PublishedAtHeader]); err == nil && p.After(since) {
		since = p
	}
	return since
}
