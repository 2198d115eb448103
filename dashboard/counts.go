package dashboard

import (
	"context"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// countCache keeps each table's last count of its queue, so that a page refreshed every
// few seconds does not count a big queue every time. Counting reads every unfinished row
// (through the claim index): a few milliseconds for a queue of thousands, 300–450 ms for
// a queue of a million on this project's machine, which no index makes cheaper. So:
//
//   - A count quicker than countBudget is read again at every render: small queues show
//     live numbers, as they always did.
//   - A slower count is kept for countKeepFactor times what it took (at least
//     countKeepMin, at most countKeepMax) and shown with its age; when it is due again,
//     the render starts a new count in the background and shows the kept one meanwhile,
//     never waiting for it. An open dashboard thus spends at most about 1/countKeepFactor
//     of one database connection's time counting, however big the queue.
//   - With no count kept (the first render, or after a failure), the render waits up to
//     countBudget; a count that takes longer finishes in the background and the page
//     says the numbers come at its next refresh.
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
	// running is closed when the running count ends; nil when none runs.
	running chan struct{}
}

// tableCounts is one count of a table: its queue's rows per group, and the rows of its
// dead-letter table, when it has one (Table.DeadLetterTable).
type tableCounts struct {
	groups []dialects.GroupStats
	dead   int64
}

// countPolicy is how the cache weighs a count's cost (config: tests shorten it).
type countPolicy struct {
	budget     time.Duration // how long a render waits for a count
	keepFactor int           // a slow count is kept this many times as long as it took
	keepMin    time.Duration
	keepMax    time.Duration
	timeout    time.Duration // a background count's end, whatever happens
}

const (
	countBudget     = 100 * time.Millisecond
	countKeepFactor = 100
	countKeepMin    = 10 * time.Second
	countKeepMax    = 15 * time.Minute
	countTimeout    = 5 * time.Minute
)

func defaultCountPolicy() countPolicy {
	return countPolicy{budget: countBudget, keepFactor: countKeepFactor, keepMin: countKeepMin, keepMax: countKeepMax, timeout: countTimeout}
}

// keep is how long a count that took took is shown before it is read again: 0 for a count
// quicker than the budget.
func (p countPolicy) keep(took time.Duration) time.Duration {
	if took < p.budget {
		return 0
	}
	return min(max(took*time.Duration(p.keepFactor), p.keepMin), p.keepMax)
}

// countView is what a render shows of a table's count.
type countView struct {
	stats tableCounts
	err   error
	// pending says no count is kept and the running one took longer than the budget.
	pending bool
	// kept is set when the numbers are a kept count (not read by this render): its age,
	// how long it took, and whether a new one is running.
	kept       bool
	age, took  time.Duration
	recounting bool
}

// get returns t's count for a render: read now, or kept, as countCache says. count reads
// it; it runs in its own goroutine, bound to ctx's values but not to its end (a render
// that stops waiting leaves it to finish and be kept).
func (c *countCache) get(ctx context.Context, p countPolicy, table string, count func(context.Context) (tableCounts, error)) countView {
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]*tableCount{}
	}
	e := c.m[table]
	if e == nil {
		e = &tableCount{}
		c.m[table] = e
	}
	keep := p.keep(e.took)
	fresh := e.done && e.err == nil && e.counted == e.changes && keep > 0 && time.Since(e.at) < keep
	if fresh {
		v := e.view(true)
		c.mu.Unlock()
		return v
	}
	if e.running == nil {
		e.running = make(chan struct{})
		go c.count(ctx, p, table, e, count)
	}
	running := e.running
	// A slow count kept from before is shown at once while the new one runs.
	if e.done && e.err == nil && keep > 0 {
		v := e.view(true)
		c.mu.Unlock()
		return v
	}
	c.mu.Unlock()

	wait := time.NewTimer(p.budget)
	defer wait.Stop()
	select {
	case <-running:
	case <-wait.C:
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.running == running {
		if e.done && e.err == nil {
			return e.view(true) // a cheap count turned slow: the last one, marked as kept
		}
		return countView{pending: true}
	}
	return e.view(false)
}

// view is e as a render shows it; kept marks numbers this render did not read.
func (e *tableCount) view(kept bool) countView {
	v := countView{stats: e.stats, err: e.err}
	if kept {
		v.kept, v.age, v.took, v.recounting = true, time.Since(e.at), e.took, e.running != nil
	}
	return v
}

// count runs one count of table and files its result in e.
func (c *countCache) count(ctx context.Context, p countPolicy, table string, e *tableCount, count func(context.Context) (tableCounts, error)) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeout)
	defer cancel()
	c.mu.Lock()
	changes := e.changes
	c.mu.Unlock()
	start := time.Now()
	stats, err := count(ctx)
	took := time.Since(start)
	c.mu.Lock()
	defer c.mu.Unlock()
	e.stats, e.err, e.done, e.at, e.took, e.counted = stats, err, true, start, took, changes
	close(e.running)
	e.running = nil
}

// changed makes table's kept count due: an action changed its rows.
func (c *countCache) changed(table string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.m[table]; e != nil {
		e.changes++
	}
}
