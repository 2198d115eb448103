package dashboard

import (
	"cmp"
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
	// Hidden sums up the groups past overviewGroups, which the section does not show.
	Hidden *hiddenGroups
}

// hiddenGroups are the groups a section leaves out: how many, and their rows queued.
// More says there may be more groups of finished rows than the overview read
// (maxFinishedGroups).
type hiddenGroups struct {
	Groups int
	Queued int64
	More   bool
}

// shownGroups keeps at most overviewGroups of stats (in their order), and sums up the
// others: the queues named in DeadLetters, their dead-letter groups and the queues
// subscribed here (subscribed) first, then the rows whose group is NULL, then the groups
// with the most rows queued.
func shownGroups(t Table, stats []dialects.GroupStats, subscribed func(group string) bool) ([]dialects.GroupStats, *hiddenGroups) {
	if len(stats) <= overviewGroups {
		return stats, nil
	}
	queued := func(g dialects.GroupStats) int64 { return g.Due + g.Delayed + g.InWork }
	named := func(g dialects.GroupStats) bool {
		if g.NullGroup {
			return false
		}
		_, queue := t.DeadLetters[g.Group]
		return queue || t.deadLetterOf(g.Group) != "" || subscribed(g.Group)
	}
	order := make([]int, len(stats))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ga, gb := stats[a], stats[b]
		switch {
		case named(ga) != named(gb):
			if named(ga) {
				return -1
			}
			return 1
		case ga.NullGroup != gb.NullGroup:
			if ga.NullGroup {
				return -1
			}
			return 1
		}
		return cmp.Compare(queued(gb), queued(ga))
	})
	keep := make([]bool, len(stats))
	for _, i := range order[:overviewGroups] {
		keep[i] = true
	}
	shown := make([]dialects.GroupStats, 0, overviewGroups)
	hidden := &hiddenGroups{}
	for i, g := range stats {
		if keep[i] {
			shown = append(shown, g)
			continue
		}
		hidden.Groups++
		hidden.Queued += queued(g)
	}
	return shown, hidden
}

// keptCount is a count an earlier render read, shown because counting the table is slow.
type keptCount struct {
	Age, Took  time.Duration
	Recounting bool
}

// noChart is why the chart by processed_at is not drawn: the table has no index leading
// with processed_at (Statement creates one), checking for one failed (Err), or the first
// read of the hour's finished rows takes longer than a render waits (Reading).
//
// Only groups no subscription of this process reads need that chart: Groups names them
// (a few, then "…"). SubscribedHere says this process subscribes to some queue of the
// table, which has its chart already: mounting the dashboard in the service that runs
// the subscriptions is then no fix, for the groups named are read elsewhere, or by none
// (a dead-letter group).
type noChart struct {
	Statement      string
	Err            string
	Reading        bool
	Groups         []string
	SubscribedHere bool
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
	// Dead counts the group's own dead letters: its rows whose DeadAt is set, and, in a
	// dead-letter group the dashboard was told of, its rows neither in work nor finished.
	// They are not queued: they wait for a requeue.
	Dead          int64
	InWorkCounted bool
	Processed     int64
	HasProcessed  bool
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
// the groups of its finished rows (kept a while: finishedGroups), then one chart per
// group.
func (d *Dashboard) tableOverview(ctx context.Context, t Table, now time.Time) tableView {
	tv := tableView{Name: t.Name, Form: t.Form().String()}
	finished := d.finishedGroups(ctx, t)
	cv := d.queueCounts.get(ctx, d.cfg.count, d.b.Done(), t.Name, func(ctx context.Context) (tableCounts, error) { return d.counts(ctx, t, now) })
	if cv.pending {
		tv.Counting = true
		return tv
	}
	if cv.kept {
		tv.Kept = &keptCount{Age: cv.age, Took: cv.took, Recounting: cv.recounting}
	}
	if cv.err != nil {
		d.cfg.log.Warn("dashboard: reading a table's counts failed", "table", t.Name, "err", cv.err)
		tv.Error = cv.err.Error()
		return tv
	}
	names, more := finished()
	stats := d.withIdleGroups(t, asDeadLetters(t, cv.stats.groups), names)
	var (
		minutes   map[string][]rowactor.ThroughputMinute
		minutesOK bool
	)
	if slices.ContainsFunc(stats, func(g dialects.GroupStats) bool { return !g.NullGroup && d.subscription(t, g.Group) == nil }) {
		minutes, minutesOK, tv.NoChart = d.finishedOf(ctx, t, now)
		if tv.NoChart != nil {
			tv.NoChart.Groups, tv.NoChart.SubscribedHere = d.unchartedGroups(t, stats)
		}
	}
	byGroup := map[string]dialects.GroupStats{}
	for _, g := range stats {
		if !g.NullGroup {
			byGroup[g.Group] = g
		}
	}
	stats, tv.Hidden = shownGroups(t, stats, func(g string) bool { return d.subscription(t, g) != nil })
	if tv.Hidden != nil {
		tv.Hidden.More = more
	}
	for _, g := range stats {
		tv.Groups = append(tv.Groups, d.groupLine(t, g, byGroup, cv.stats, minutes, minutesOK, now))
	}
	return tv
}

// groupLine is group g's line of t's section; byGroup holds every group's counts (a
// queue's line counts its dead-letter group's rows).
func (d *Dashboard) groupLine(t Table, g dialects.GroupStats, byGroup map[string]dialects.GroupStats, counts tableCounts,
	minutes map[string][]rowactor.ThroughputMinute, minutesOK bool, now time.Time) groupView {
	gv := groupView{Table: t.Name, Group: g.Group, Grouped: t.Group != "", NullGroup: g.NullGroup,
		Queued: g.Due + g.Delayed + g.InWork, Due: g.Due, Scheduled: g.Delayed,
		InWork: g.InWork, InWorkCounted: g.InWorkCounted, Dead: g.Dead, Processed: g.Processed, HasProcessed: t.ProcessedAt != "",
		OldestID: g.Oldest.ID, Errors: g.Errors}
	if g.Oldest.ID != 0 {
		if since := dueSince(g.Oldest); !since.IsZero() {
			gv.OldestAge, gv.OldestKnown = max(now.Sub(since), 0), true
		}
	}
	if g.NullGroup {
		return gv
	}
	if dl, ok := t.DeadLetters[g.Group]; ok {
		gv.DeadLetterGroup = dl
		dg := byGroup[dl]
		gv.DeadLetters = dg.Dead + dg.Due + dg.Delayed + dg.InWork
	}
	if t.DeadLetterTable != "" {
		gv.DeadLetterTable, gv.DeadLetters = t.DeadLetterTable, counts.dead
		if counts.deadErr != nil {
			gv.DeadLetterError = counts.deadErr.Error()
		}
	}
	gv.DeadLetterOf = t.deadLetterOf(g.Group)
	if s := d.subscription(t, g.Group); s != nil {
		gv.Subscribed, gv.Paused = true, s.Paused()
	}
	gv.Chart = d.chartOf(t, g.Group, minutes, minutesOK, now)
	return gv
}

// asDeadLetters reads the rows of t's dead-letter groups (Table.DeadLetters) that are
// neither in work nor finished as dead, as the job list shows them. The database reads a
// row moved there before the table described DeadAt as due or delayed, but nothing claims
// it until a requeue. It returns a copy: stats may be a kept count.
func asDeadLetters(t Table, stats []dialects.GroupStats) []dialects.GroupStats {
	out := slices.Clone(stats)
	for i, g := range out {
		if g.NullGroup || t.deadLetterOf(g.Group) == "" {
			continue
		}
		g.Dead += g.Due + g.Delayed
		g.Due, g.Delayed, g.Oldest = 0, 0, dialects.DueRow{}
		out[i] = g
	}
	return out
}

// withIdleGroups adds a line of zeros for each group of t that stats (the unfinished
// rows' counts) leaves out: each queue a subscription of this process reads, and each
// group of finished rows (finished). It returns a new slice, sorted as counts sorts.
func (d *Dashboard) withIdleGroups(t Table, stats []dialects.GroupStats, finished []dialects.GroupName) []dialects.GroupStats {
	if t.Group == "" {
		return stats // one line, always there
	}
	out := slices.Clone(stats)
	counted := inWorkCounted(t, stats)
	have := make(map[dialects.GroupName]bool, len(stats))
	for _, g := range stats {
		have[dialects.GroupName{Group: g.Group, NullGroup: g.NullGroup}] = true
	}
	add := func(name dialects.GroupName) {
		if !have[name] {
			have[name] = true
			out = append(out, dialects.GroupStats{Group: name.Group, NullGroup: name.NullGroup, InWorkCounted: counted})
		}
	}
	for _, s := range d.b.Subscriptions() {
		if s.Table().Name == t.Name {
			add(dialects.GroupName{Group: s.Queue()})
		}
	}
	for _, name := range finished {
		add(name)
	}
	sortGroups(out)
	return out
}

// finishedGroups starts the read of the groups of t's finished rows, where the overview
// needs it (t has groups and keeps finished rows, and the dialect lists them), and
// returns what waits for it: the groups, and whether there may be more than it read.
// The read is kept in d.groupNames (countPolicy.groups), so it runs at most once a
// minute, in the background, and a render waits for it only as long as for a count.
func (d *Dashboard) finishedGroups(ctx context.Context, t Table) func() ([]dialects.GroupName, bool) {
	gl, ok := d.b.Dialect().(dialects.GroupLister)
	if !ok || t.Group == "" || t.ProcessedAt == "" {
		return func() ([]dialects.GroupName, bool) { return nil, false }
	}
	done := make(chan countView, 1)
	go func() {
		done <- d.groupNames.get(ctx, d.cfg.count.groups(), d.b.Done(), t.Name, func(ctx context.Context) (tableCounts, error) {
			names, err := gl.FinishedGroups(ctx, t.Table, maxFinishedGroups)
			return tableCounts{finished: names}, err
		})
	}()
	return func() ([]dialects.GroupName, bool) {
		cv := <-done
		if cv.err != nil {
			// The lines of the queued rows show without them.
			d.cfg.log.Warn("dashboard: listing the groups of finished rows failed", "table", t.Name, "err", cv.err)
		}
		return cv.stats.finished, len(cv.stats.finished) >= maxFinishedGroups
	}
}

// maxFinishedGroups bounds the groups of finished rows an overview reads: it shows at
// most overviewGroups lines, and sums up the others.
const maxFinishedGroups = 1000

// unchartedGroups are the groups of stats that no subscription of this process reads,
// which only the chart by processed_at can chart (at most a few of them, by name), and
// whether a subscription of this process reads some queue of t.
func (d *Dashboard) unchartedGroups(t Table, stats []dialects.GroupStats) (names []string, subscribed bool) {
	for _, g := range stats {
		switch {
		case g.NullGroup:
		case d.subscription(t, g.Group) != nil:
			subscribed = true
		case len(names) < unchartedNamed:
			names = append(names, g.Group)
		case len(names) == unchartedNamed:
			names = append(names, "…")
		}
	}
	return names, subscribed
}

// unchartedNamed is how many groups without a chart the note names.
const unchartedNamed = 5

// inWorkCounted says whether t's database tells rows in work, as its counts say (the
// form's rule without a count).
func inWorkCounted(t Table, stats []dialects.GroupStats) bool {
	if len(stats) > 0 {
		return stats[0].InWorkCounted
	}
	return t.Form() == rowactor.FormLease
}

// sortGroups orders lines as the overview shows them: the rows whose group is NULL
// first, then by group.
func sortGroups(stats []dialects.GroupStats) {
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
	counted := inWorkCounted(t, stats)
	for q := range t.DeadLetters {
		if !slices.ContainsFunc(stats, func(g dialects.GroupStats) bool { return !g.NullGroup && g.Group == q }) {
			stats = append(stats, dialects.GroupStats{Group: q, InWorkCounted: counted})
		}
	}
	if t.Group == "" && !slices.ContainsFunc(stats, func(g dialects.GroupStats) bool { return !g.NullGroup }) {
		stats = append(stats, dialects.GroupStats{InWorkCounted: counted})
	}
	sortGroups(stats)
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

// overviewGroups is the most group lines a table's section of the overview shows: a
// table of 5,000 groups made an overview of 21 MB. Past it the section shows the groups
// with the most rows queued, the queues named in DeadLetters and their dead-letter
// groups, and sums up the others on one line.
const overviewGroups = 50
