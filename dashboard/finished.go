package dashboard

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// finishedCache keeps the per-minute counts of finished rows the chart read, per table
// (every group in one statement), so that a page refreshed every few seconds reads again
// only the last two minutes of processed_at (the current one, still filling, and the one
// before, where a settlement whose processed_at was taken just before the minute turned
// may have committed just after the last read), not the whole hour: on a busy table that
// is hundreds of thousands of rows per read. A minute older than that is final once read,
// unless rows are written with an old processed_at afterwards, or deleted by retention
// within the hour, which the chart then misses until the minute leaves it.
type finishedCache struct {
	mu sync.Mutex
	m  map[string]*finishedMinutes // by table
}

type finishedMinutes struct {
	readUpTo time.Time                                 // minutes before this one, less one, are final
	counts   map[string]map[int64]dialects.MinuteCount // by group, then the minute's Unix time
}

// perMinuteCounter is the part of dialects.FinishedCounter the cache reads through.
type perMinuteCounter interface {
	FinishedPerMinute(ctx context.Context, t dialects.Table, since time.Time) ([]dialects.MinuteCount, error)
}

// minutes returns the hour of finished rows of t up to the minute of now, per group
// (rows of a NULL group left out), oldest first, reading only what it does not hold.
func (c *finishedCache) minutes(ctx context.Context, fc perMinuteCounter, t Table, now time.Time) (map[string][]rowactor.ThroughputMinute, error) {
	last := now.Truncate(time.Minute)
	first := last.Add(-(rowactor.ThroughputMinutes - 1) * time.Minute)
	c.mu.Lock()
	held := c.m[t.Name]
	since := first
	if held != nil && !held.readUpTo.Before(first) {
		since = held.readUpTo.Add(-time.Minute)
	}
	c.mu.Unlock()

	counts, err := fc.FinishedPerMinute(ctx, t.Table, since)
	if err != nil {
		return nil, err
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*finishedMinutes{}
	}
	if held = c.m[t.Name]; held == nil || since.Equal(first) {
		held = &finishedMinutes{counts: map[string]map[int64]dialects.MinuteCount{}}
		c.m[t.Name] = held
	}
	for g, byMinute := range held.counts {
		for m := range byMinute {
			if m < first.Unix() || m >= since.Unix() {
				delete(byMinute, m) // out of the hour, or read again just now
			}
		}
		if len(byMinute) == 0 {
			delete(held.counts, g)
		}
	}
	for _, m := range counts {
		if m.NullGroup {
			continue // no subscription reads them, and the overview has no chart for them
		}
		if held.counts[m.Group] == nil {
			held.counts[m.Group] = map[int64]dialects.MinuteCount{}
		}
		held.counts[m.Group][m.Minute.Unix()] = m
	}
	held.readUpTo = last
	out := make(map[string][]rowactor.ThroughputMinute, len(held.counts))
	for g, byMinute := range held.counts {
		ms := make([]rowactor.ThroughputMinute, rowactor.ThroughputMinutes)
		for i := range ms {
			m := first.Add(time.Duration(i) * time.Minute)
			mc := byMinute[m.Unix()]
			ms[i] = rowactor.ThroughputMinute{Minute: m, Handled: mc.Handled, Failed: mc.Failed}
		}
		out[g] = ms
	}
	return out, nil
}

// chartReads runs the chart's reads (finishedCache.minutes) in the background, one per
// table at a time, so that a render waits for one at most as long as for a count
// (countWait): the first read of a very busy table's hour (half a million finished rows
// took 260 ms on PostgreSQL) may end after the render, which then shows a note instead of
// the chart, and fills the cache the next render reads from (then only the last two
// minutes).
type chartReads struct {
	mu      sync.Mutex
	running map[string]*chartRead // by table
}

type chartRead struct {
	done    chan struct{}
	minutes map[string][]rowactor.ThroughputMinute
	err     error
}

// read returns read's result if it ends within wait (or one already running for table
// does); ok is false when it did not, and it goes on in the background (bounded by
// timeout).
func (c *chartReads) read(ctx context.Context, table string, wait, timeout time.Duration, stop <-chan struct{},
	read func(context.Context) (map[string][]rowactor.ThroughputMinute, error)) (minutes map[string][]rowactor.ThroughputMinute, ok bool, err error) {
	c.mu.Lock()
	r := c.running[table]
	if r == nil {
		r = &chartRead{done: make(chan struct{})}
		if c.running == nil {
			c.running = map[string]*chartRead{}
		}
		c.running[table] = r
		go func() {
			rctx, cancel := detached(ctx, timeout, stop)
			defer cancel()
			m, err := func() (m map[string][]rowactor.ThroughputMinute, err error) {
				defer func() {
					if r := recover(); r != nil {
						err = fmt.Errorf("dashboard: reading the chart of table %s panicked: %v", table, r)
					}
				}()
				return read(rctx)
			}()
			c.mu.Lock()
			r.minutes, r.err = m, err
			delete(c.running, table)
			c.mu.Unlock()
			close(r.done)
		}()
	}
	c.mu.Unlock()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-r.done:
		return r.minutes, true, r.err
	case <-timer.C:
	case <-ctx.Done():
	}
	return nil, false, nil
}

// emptyHour is an hour without a finished row, up to the minute of now.
func emptyHour(now time.Time) []rowactor.ThroughputMinute {
	first := now.Truncate(time.Minute).Add(-(rowactor.ThroughputMinutes - 1) * time.Minute)
	ms := make([]rowactor.ThroughputMinute, rowactor.ThroughputMinutes)
	for i := range ms {
		ms[i].Minute = first.Add(time.Duration(i) * time.Minute)
	}
	return ms
}

// indexCache remembers, per table, whether an index leads with processed_at
// (FinishedCounter.HasFinishedIndex), so that the catalog is read at most once per
// recheck period (a minute) and table, not on every refresh: an index an operator
// creates shows the chart within that period. A failed check is not remembered.
type indexCache struct {
	mu sync.Mutex
	m  map[string]indexCheck // by table
}

type indexCheck struct {
	at time.Time // when the catalog was read (the wall clock: the dashboard's clock may be stubbed)
	ok bool
}

// has reports whether t has an index leading with processed_at, the catalog read at most
// once per every. The lock is held while the catalog is read, so that concurrent pages read it once.
func (c *indexCache) has(ctx context.Context, fc dialects.FinishedCounter, t Table, every time.Duration) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if held, ok := c.m[t.Name]; ok && time.Since(held.at) < every {
		return held.ok, nil
	}
	ok, err := fc.HasFinishedIndex(ctx, t.Table)
	if err != nil {
		return false, err
	}
	if c.m == nil {
		c.m = map[string]indexCheck{}
	}
	c.m[t.Name] = indexCheck{at: time.Now(), ok: ok}
	return ok, nil
}
