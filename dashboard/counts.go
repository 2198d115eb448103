package dashboard

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// countCache keeps each table's last count of its queue, so that a page refreshed every
// few seconds does not count a big queue every time. Counting reads every unfinished row
// (through the claim index): a few milliseconds for a queue of thousands, 300–450 ms for
// a queue of a million on this project's machine, which no index makes cheaper. So:
//
//   - A count quicker than countSlow (100 ms) is read again at every render: small
//     queues show live numbers, as they always did.
//   - A slower count is kept for countKeepFactor times what it took (at least
//     countKeepMin, at most countKeepMax) and shown with its age; when it is due again,
//     the render starts a new count in the background and shows the kept one meanwhile,
//     never waiting for it. An open dashboard thus spends about 1/countKeepFactor of one
//     database connection's time counting, however big the queue.
//   - Without a slow count kept (the first render, a quick queue, after a failure), the
//     render waits for the count up to countWait (2 s); a count that takes longer ends in
//     the background, and the page shows the last numbers, marked as kept, or says they
//     come at its next refresh.
//   - An action that changes the table (retry, cancel, requeue) makes its kept count due,
//     so the page after the action counts again.
//
// River UI went the same way for the same reason (a count of a big table is what its
// users' databases spent the most time on).
type countCache struct {
	mu sync.Mutex
	m  map[string]*tableCount // by table
}

// tableCount is one table's last count, and the one running now.
type tableCount struct {
	stats tableCounts
	err   error
	done  bool          // a count ended (stats or err hold its result)
	at    time.Time     // when the count that ended started (the wall clock: the dashboard's may be stubbed)
	took  time.Duration // how long it ran
	// changes counts the actions that changed the table; counted is changes as the count
	// that ended started: they differ when an action came after it.
	changes, counted int
	// running is closed when the running count ends; nil when none runs. runningChanges
	// is changes as it started.
	running        chan struct{}
	runningChanges int
}

// tableCounts is one count of a table: its queue's rows per group, and the rows of its
// dead-letter table, when it has one (Table.DeadLetterTable).
type tableCounts struct {
	groups []dialects.GroupStats
	// finished are the groups of the table's finished rows, in a read of
	// dialects.GroupLister (the groupNames cache) rather than a count.
	finished []dialects.GroupName
	dead     int64
	// deadErr is why the dead-letter table could not be counted: shown in its cell, the
	// queue's own numbers beside it.
	deadErr error
}

// countPolicy is how the cache weighs a count's cost (config: tests change it).
type countPolicy struct {
	slow       time.Duration // a count that takes this long is kept
	wait       time.Duration // how long a render without a slow count kept waits for one
	keepFactor int           // a slow count is kept this many times as long as it took
	keepMin    time.Duration
	keepMax    time.Duration
	timeout    time.Duration // a background count's end, whatever happens
}

const (
	countSlow       = 100 * time.Millisecond
	countWait       = 2 * time.Second
	countKeepFactor = 100
	countKeepMin    = 10 * time.Second
	countKeepMax    = 15 * time.Minute
	countTimeout    = 5 * time.Minute
)

// defaultCount is the policy New gives a dashboard (a variable: the package's tests keep
// every count live, but for the tests of the cache itself).
var defaultCount = countPolicy{slow: countSlow, wait: countWait, keepFactor: countKeepFactor,
	keepMin: countKeepMin, keepMax: countKeepMax, timeout: countTimeout}

// groupsKeepMin is the least time a read of a table's finished groups is kept: it reads
// every finished row on PostgreSQL and SQLite, however quick it is on a small table.
const groupsKeepMin = time.Minute

// groups is the policy of the reads of finished groups: each kept at least groupsKeepMin,
// and keepFactor times what it took when that is longer (up to keepMax).
func (p countPolicy) groups() countPolicy {
	p.slow, p.keepMin = 0, max(p.keepMin, groupsKeepMin)
	p.keepMax = max(p.keepMax, p.keepMin)
	return p
}

// keep is how long a count that took took is shown before it is read again: 0 for a count
// quicker than slow.
func (p countPolicy) keep(took time.Duration) time.Duration {
	if took < p.slow {
		return 0
	}
	return min(max(took*time.Duration(p.keepFactor), p.keepMin), p.keepMax)
}

// countView is what a render shows of a table's count.
type countView struct {
	stats tableCounts
	err   error
	// pending says no count is kept and the running one took longer than the wait.
	pending bool
	// kept is set when the numbers are a kept count (not read by this render): its age,
	// how long it took, and whether a new one is running.
	kept       bool
	age, took  time.Duration
	recounting bool
}

// get returns t's count for a render: read now, or kept, as countCache says. count reads
// it; it runs in its own goroutine, bound to ctx's values but not to its end (a render
// that stops waiting leaves it to finish and be kept), and ended by stop (the broker's
// Shutdown: its pool waits for the connection a count holds) or p.timeout.
func (c *countCache) get(ctx context.Context, p countPolicy, stop <-chan struct{}, table string, count func(context.Context) (tableCounts, error)) countView {
	deadline := time.Now().Add(p.wait)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*tableCount{}
	}
	e := c.m[table]
	if e == nil {
		e = &tableCount{}
		c.m[table] = e
	}
	for {
		keep := p.keep(e.took)
		// A slow result, numbers or error, counted after the last action and not yet
		// due: shown as it is.
		if e.done && e.counted == e.changes && keep > 0 && time.Since(e.at) < keep {
			return e.view(true)
		}
		if e.running == nil {
			e.running, e.runningChanges = make(chan struct{}), e.changes
			go c.count(ctx, p, stop, table, e, count)
		}
		// A slow result from before: shown at once while the new count runs.
		if e.done && keep > 0 {
			return e.view(true)
		}
		running := e.running
		c.mu.Unlock()
		wait := time.NewTimer(time.Until(deadline))
		select {
		case <-running:
		case <-wait.C:
		case <-ctx.Done():
		}
		wait.Stop()
		c.mu.Lock()
		switch {
		case e.running == running && e.done:
			return e.view(true) // a quick count turned slow: the last result, marked as kept
		case e.running == running:
			return countView{pending: true}
		case e.counted == e.changes:
			return e.view(false)
		case !time.Now().Before(deadline) || ctx.Err() != nil:
			// The count that ended began before an action: not this render's numbers.
			return e.view(true)
		}
		// The count that ended began before an action: count again, within the wait.
	}
}

// view is e as a render shows it; kept marks numbers this render did not read.
func (e *tableCount) view(kept bool) countView {
	v := countView{stats: e.stats, err: e.err}
	if kept {
		v.kept, v.age, v.took, v.recounting = true, time.Since(e.at), e.took, e.running != nil
	}
	return v
}

// count runs one count of table and files its result in e. A panic in count is filed as
// its error: it runs outside the request, where net/http would not recover it.
func (c *countCache) count(ctx context.Context, p countPolicy, stop <-chan struct{}, table string, e *tableCount, count func(context.Context) (tableCounts, error)) {
	ctx, cancel := detached(ctx, p.timeout, stop)
	defer cancel()
	c.mu.Lock()
	changes := e.runningChanges
	c.mu.Unlock()
	start := time.Now()
	stats, err := func() (stats tableCounts, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("dashboard: counting table %s panicked: %v", table, r)
			}
		}()
		return count(ctx)
	}()
	took := time.Since(start)
	c.mu.Lock()
	defer c.mu.Unlock()
	e.stats, e.err, e.done, e.at, e.took, e.counted = stats, err, true, start, took, changes
	close(e.running)
	e.running = nil
}

// detached is ctx's values without its end, ended instead by timeout or by stop closing.
func detached(ctx context.Context, timeout time.Duration, stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// changed makes table's kept count due: an action changed its rows.
func (c *countCache) changed(table string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.m[table]; e != nil {
		e.changes++
	}
}
