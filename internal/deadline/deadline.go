// Package deadline is a handler's context whose deadline can move while the handler runs.
//
// A context.WithDeadline cannot be moved once it is handed out, and a handler keeps the
// context it was given: so a delivery's context is a Context of this package, whose
// deadline the delivery's Timeout sets when its handler starts and Delivery.SetTimeout
// moves later (or sooner). It behaves as a context.WithDeadline would: Done closes when the
// deadline passes or the parent ends, whichever comes first; Err is then
// context.DeadlineExceeded or the parent's error; Deadline reports the earlier of its own
// deadline and the parent's; Value is the parent's. Contexts derived from it end with it,
// with its error, through its AfterFunc (no goroutine per derived context).
//
// Beside the deadline it keeps a watch (Watch): a function called a grace after the
// deadline, if the handler has not finished by then (Finish), which the runtime uses to give
// up on a handler that ignores its context.
package deadline

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
)

// Context is a context with a movable deadline. Its methods are safe for concurrent use.
type Context struct {
	parent context.Context
	// done is Done's channel (a chan struct{}), made by the first Done: a handler that
	// never reads it costs no channel (one allocation per delivery).
	done atomic.Value

	mu sync.Mutex
	// err is why the context ended (nil while it runs).
	err error
	// at is the deadline (zero: none of its own); timeout is the duration last set.
	at      time.Time
	timeout time.Duration
	// expired says the deadline passed (Err may still be the parent's, if it ended first).
	expired bool
	// timer fires at the deadline, then at the watch's time (fire); made once, moved
	// with the deadline.
	timer  *time.Timer
	unhook func() bool
	funcs  map[*afterFunc]struct{}
	// The watch (Watch): overrun is called grace(timeout) after the deadline, at watchAt,
	// unless the handler finished first.
	grace    func(time.Duration) time.Duration
	overrun  Overrunner
	watchAt  time.Time
	finished bool
	// caused, set by Cancel, carries the cause context.Cause reads (nil otherwise).
	caused context.Context
	// group ends the Context when the parent does (Group.Init); prev and next link it
	// in the group's list while it runs.
	group      *Group
	prev, next *Context
	linked     bool
}

type afterFunc struct{ f func() }

type key struct{}

// New returns a running Context with no deadline of its own, ending with parent.
func New(parent context.Context) *Context {
	c := &Context{parent: parent}
	if parent.Done() != nil {
		// Under mu: a parent that ended already runs the function at once, on a goroutine
		// of its own.
		c.mu.Lock()
		c.unhook = context.AfterFunc(parent, func() { c.end(parent.Err()) })
		c.mu.Unlock()
	}
	return c
}

// Group ends the Contexts it made when their common parent ends, through one hook on the
// parent: a Context of New hooks the parent on its own, which costs a handful of
// allocations a delivery.
type Group struct {
	parent context.Context
	mu     sync.Mutex
	// head lists the Contexts that run; err is the parent's error once it ended.
	head *Context
	err  error
}

// NewGroup returns a Group whose Contexts end with parent. It hooks parent for as long
// as parent runs.
func NewGroup(parent context.Context) *Group {
	g := &Group{parent: parent}
	if parent.Done() != nil {
		context.AfterFunc(parent, g.endAll)
	}
	return g
}

// Init makes c, a zero Context (a field of its owner, so that it costs no allocation of
// its own), a running Context with no deadline of its own, ending with the group's
// parent. c must not be copied afterwards.
func (g *Group) Init(c *Context) {
	c.parent, c.group = g.parent, g
	g.mu.Lock()
	err := g.err
	if err == nil {
		c.linked = true
		c.next = g.head
		if g.head != nil {
			g.head.prev = c
		}
		g.head = c
	}
	g.mu.Unlock()
	if err != nil {
		c.end(err)
	}
}

// remove unlinks c, which ended.
func (g *Group) remove(c *Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !c.linked {
		return
	}
	c.linked = false
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		g.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	}
	c.prev, c.next = nil, nil
}

// endAll ends every running Context of the group with the parent's error.
func (g *Group) endAll() {
	err := g.parent.Err()
	g.mu.Lock()
	g.err = err
	var live []*Context
	for c := g.head; c != nil; c = c.next {
		live = append(live, c)
	}
	g.mu.Unlock()
	for _, c := range live {
		c.end(err)
	}
}

// From returns the Context ctx was derived from, nil when none.
func From(ctx context.Context) *Context {
	c, _ := ctx.Value(key{}).(*Context)
	return c
}

// Overrunner is told that a watched Context's handler overran (Watch).
type Overrunner interface {
	// Overran runs on a timer's goroutine and must not block.
	Overran()
}

// Watch makes the Context call overrun grace(timeout) after its deadline, if Finish was not
// called by then; each SetTimeout moves the watch with the deadline. Call it before
// SetTimeout.
func (c *Context) Watch(grace func(timeout time.Duration) time.Duration, overrun Overrunner) {
	c.mu.Lock()
	c.grace, c.overrun = grace, overrun
	c.mu.Unlock()
}

// SetTimeout sets the deadline to d from now, the watch to the grace after it; d <= 0
// removes the deadline (and the watch). Once the deadline passed or the handler finished,
// it changes nothing. A Context that ended otherwise (Cancel, its parent) keeps its error
// and never runs again, but its deadline and watch still move: a handler that ignores a
// context cancelled before its deadline was set is still given up on.
func (c *Context) SetTimeout(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// expired, not only err: fire marks the deadline passed and arms the watch before it
	// ends the Context, and a move in between would drop the watch.
	if c.expired || c.finished {
		return
	}
	c.timeout = d
	c.watchAt = time.Time{}
	if d <= 0 {
		c.at = time.Time{}
		c.stopTimer()
		return
	}
	c.at = time.Now().Add(d)
	if c.timer == nil {
		c.timer = time.AfterFunc(d, c.fire)
	} else {
		c.timer.Reset(d)
	}
}

// Timeout is the duration last given to SetTimeout (0: none).
func (c *Context) Timeout() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.timeout
}

// Expired reports whether the deadline has passed, by the clock or by its timer, even if
// the parent ended first.
func (c *Context) Expired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.expired || !c.at.IsZero() && !time.Now().Before(c.at)
}

// Finish ends the Context (context.Canceled, unless it ended already) as its handler
// returns, and stops its timers and its watch: a derived context or a goroutine the handler
// left behind ends too, and nothing of the Context outlives the handler.
func (c *Context) Finish() {
	c.mu.Lock()
	c.finished = true
	c.stopTimer()
	c.mu.Unlock()
	c.end(context.Canceled)
}

// Cancel ends the Context with context.Canceled and cause, unless it ended already: then
// it changes nothing and reports false. context.Cause of the Context, and of contexts
// derived from it, returns cause; Err stays context.Canceled, as the context contract
// wants. The watch stays: a handler that ignores its cancelled context is still given up
// on a grace after its deadline, unless it finishes first. It costs nothing until called:
// the cause lives in a cancelled context made here.
func (c *Context) Cancel(cause error) bool {
	caused, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	c.mu.Lock()
	if c.err != nil || c.finished {
		c.mu.Unlock()
		return false
	}
	c.caused = caused
	c.mu.Unlock()
	c.end(context.Canceled)
	return true
}

func (c *Context) stopTimer() {
	if c.timer != nil {
		c.timer.Stop()
	}
}

// fire is the timer's: at the deadline it ends the Context (unless it ended already) and
// moves the timer to the watch's time; there it tells the watch, once. The clock decides
// which: a fire of a timer since moved (it may run as the move happens) finds its time
// not come and does nothing.
func (c *Context) fire() {
	c.mu.Lock()
	if c.finished || c.at.IsZero() {
		c.mu.Unlock()
		return
	}
	now := time.Now()
	var end bool
	var overrun Overrunner
	switch {
	case now.Before(c.at):
	case !c.expired:
		c.expired = true
		end = true
		if c.overrun != nil {
			c.watchAt = c.at.Add(c.grace(c.timeout))
			c.timer.Reset(c.watchAt.Sub(now))
		}
	case !c.watchAt.IsZero() && !now.Before(c.watchAt):
		overrun = c.overrun
		c.watchAt = time.Time{}
	}
	c.mu.Unlock()
	if end {
		c.end(context.DeadlineExceeded)
	}
	if overrun != nil {
		overrun.Overran()
	}
}

// end ends the Context with err, once: Done closes and the AfterFunc functions run.
func (c *Context) end(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	if d := c.done.Load(); d != nil {
		close(d.(chan struct{}))
	}
	// The timer stays for the watch: a handler that ignores its ended context is still
	// given up on a grace after its deadline.
	funcs := c.funcs
	c.funcs = nil
	unhook := c.unhook
	c.unhook = nil
	c.mu.Unlock()
	if unhook != nil {
		unhook()
	}
	if c.group != nil {
		c.group.remove(c)
	}
	for f := range funcs {
		go f.f()
	}
}

// Deadline is the earlier of the Context's deadline and its parent's.
func (c *Context) Deadline() (time.Time, bool) {
	c.mu.Lock()
	at := c.at
	c.mu.Unlock()
	pd, ok := c.parent.Deadline()
	switch {
	case at.IsZero():
		return pd, ok
	case ok && pd.Before(at):
		return pd, true
	}
	return at, true
}

// Done closes when the Context ends.
func (c *Context) Done() <-chan struct{} {
	if d := c.done.Load(); d != nil {
		return d.(chan struct{})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d := c.done.Load(); d != nil {
		return d.(chan struct{})
	}
	d := make(chan struct{})
	if c.err != nil {
		close(d) // ended before anyone asked
	}
	c.done.Store(d)
	return d
}

// Err is nil while the Context runs, then context.DeadlineExceeded when its deadline
// ended it, the parent's error when the parent did, context.Canceled when Finish did.
func (c *Context) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Value is the parent's value for key; the Context itself for From's key.
//
// The parent's cancellation record (the standard library's *context.cancelCtx, which
// context.Cause and derived contexts look up by a key of type *int) is hidden: this
// Context ends on its own terms, so Cause must read its Err (or Cancel's cause, whose
// record it returns instead), and derived contexts must end
// through its AfterFunc with its error, not with the parent's.
func (c *Context) Value(k any) any {
	if _, ok := k.(key); ok {
		return c
	}
	_, probe := k.(*int)
	if probe {
		c.mu.Lock()
		caused := c.caused
		c.mu.Unlock()
		if caused != nil {
			// Cancel's cause: context.Cause reads it from this cancelled context's record.
			return caused.Value(k)
		}
	}
	v := c.parent.Value(k)
	if probe && v != nil && reflect.TypeOf(v).String() == "*context.cancelCtx" {
		return nil
	}
	return v
}

// AfterFunc runs f on a goroutine of its own once the Context ended (at once if it has);
// stop unregisters f and reports whether it did so before f was started. The standard
// library uses it to end contexts derived from this one without a goroutine each.
func (c *Context) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	a := &afterFunc{f: f}
	if c.funcs == nil {
		c.funcs = map[*afterFunc]struct{}{}
	}
	c.funcs[a] = struct{}{}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, ok := c.funcs[a]; !ok {
			return false
		}
		delete(c.funcs, a)
		return true
	}
}

// String names the Context, as the standard library's contexts do.
func (c *Context) String() string { return "deadline.Context" }

// Outlive returns a context that ends grace after ctx does, carrying ctx's values, and a
// func that releases it. Work that must finish its current statement when its caller
// stops (the statement's end frees a session lock cleanly, where cutting it would close
// the connection) runs on it and checks ctx between statements.
func Outlive(ctx context.Context, grace time.Duration) (context.Context, func()) {
	octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var mu sync.Mutex
	var timer *time.Timer
	released := false
	unhook := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !released {
			timer = time.AfterFunc(grace, cancel)
		}
	})
	return octx, func() {
		unhook()
		mu.Lock()
		released = true
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}
