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
	"time"
)

// Context is a context with a movable deadline. Its methods are safe for concurrent use.
type Context struct {
	parent context.Context
	done   chan struct{}

	mu sync.Mutex
	// err is why the context ended (nil while it runs).
	err error
	// at is the deadline (zero: none of its own); timeout is the duration last set.
	at      time.Time
	timeout time.Duration
	// expired says the deadline passed (Err may still be the parent's, if it ended first).
	expired bool
	// gen counts the moves of the deadline: a timer armed for an earlier move does nothing.
	gen    uint64
	timer  *time.Timer
	unhook func() bool
	funcs  map[*afterFunc]struct{}
	// The watch (Watch): overrun is called grace(timeout) after the deadline, unless the
	// handler finished first.
	grace    func(time.Duration) time.Duration
	overrun  func()
	watch    *time.Timer
	finished bool
	// caused, set by Cancel, carries the cause context.Cause reads (nil otherwise).
	caused context.Context
}

type afterFunc struct{ f func() }

type key struct{}

// New returns a running Context with no deadline of its own, ending with parent.
func New(parent context.Context) *Context {
	c := &Context{parent: parent, done: make(chan struct{})}
	if parent.Done() != nil {
		// Under mu: a parent that ended already runs the function at once, on a goroutine
		// of its own.
		c.mu.Lock()
		c.unhook = context.AfterFunc(parent, func() { c.end(parent.Err()) })
		c.mu.Unlock()
	}
	return c
}

// From returns the Context ctx was derived from, nil when none.
func From(ctx context.Context) *Context {
	c, _ := ctx.Value(key{}).(*Context)
	return c
}

// Watch makes the Context call overrun grace(timeout) after its deadline, if Finish was not
// called by then; each SetTimeout moves the watch with the deadline. overrun runs on a
// timer's goroutine and must not block. Call it before SetTimeout.
func (c *Context) Watch(grace func(timeout time.Duration) time.Duration, overrun func()) {
	c.mu.Lock()
	c.grace, c.overrun = grace, overrun
	c.mu.Unlock()
}

// SetTimeout sets the deadline to d from now, the watch to the grace after it; d <= 0
// removes the deadline (and the watch). Once the Context ended (its deadline passed, its
// parent ended) or finished, it changes nothing: an ended context never runs again.
func (c *Context) SetTimeout(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.finished {
		return
	}
	c.stopTimers()
	c.gen++
	c.timeout = d
	if d <= 0 {
		c.at = time.Time{}
		return
	}
	c.at = time.Now().Add(d)
	gen := c.gen
	c.timer = time.AfterFunc(d, func() { c.expire(gen) })
	if c.overrun != nil {
		c.watch = time.AfterFunc(d+c.grace(d), func() { c.overran(gen) })
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
	c.stopTimers()
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

func (c *Context) stopTimers() {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if c.watch != nil {
		c.watch.Stop()
		c.watch = nil
	}
}

// expire ends the Context at the deadline of move gen, unless it moved since.
func (c *Context) expire(gen uint64) {
	c.mu.Lock()
	if gen != c.gen || c.finished {
		c.mu.Unlock()
		return
	}
	c.expired = true
	c.mu.Unlock()
	c.end(context.DeadlineExceeded)
}

// overran calls the watch's function for move gen, unless the deadline moved since or the
// handler finished.
func (c *Context) overran(gen uint64) {
	c.mu.Lock()
	fn := c.overrun
	if gen != c.gen || c.finished {
		fn = nil
	}
	c.mu.Unlock()
	if fn != nil {
		fn()
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
	close(c.done)
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	funcs := c.funcs
	c.funcs = nil
	unhook := c.unhook
	c.unhook = nil
	c.mu.Unlock()
	if unhook != nil {
		unhook()
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
func (c *Context) Done() <-chan struct{} { return c.done }

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
