package deadline

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ended waits up to within for ctx to end and returns how long it took.
func ended(t *testing.T, ctx context.Context, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-ctx.Done():
		return time.Since(start)
	case <-time.After(within):
		t.Fatalf("the context did not end within %v", within)
		return 0
	}
}

func running(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
		t.Fatalf("the context ended: %v", ctx.Err())
	default:
	}
	if ctx.Err() != nil {
		t.Fatalf("Err %v on a running context", ctx.Err())
	}
}

func TestNoDeadline(t *testing.T) {
	c := New(context.Background())
	if _, ok := c.Deadline(); ok {
		t.Fatal("a context without a timeout reports a deadline")
	}
	time.Sleep(20 * time.Millisecond)
	running(t, c)
	c.Finish()
	if !errors.Is(c.Err(), context.Canceled) || c.Expired() {
		t.Fatalf("after Finish: Err %v, Expired %v", c.Err(), c.Expired())
	}
}

func TestDeadlineEndsTheContext(t *testing.T) {
	c := New(context.Background())
	before := time.Now()
	c.SetTimeout(50 * time.Millisecond)
	dl, ok := c.Deadline()
	if !ok || dl.Sub(before) < 50*time.Millisecond || dl.Sub(before) > 80*time.Millisecond {
		t.Fatalf("Deadline %v %v, want about 50 ms from now", dl.Sub(before), ok)
	}
	running(t, c)
	if c.Expired() {
		t.Fatal("Expired before the deadline")
	}
	ended(t, c, time.Second)
	if !errors.Is(c.Err(), context.DeadlineExceeded) || !c.Expired() {
		t.Fatalf("Err %v, Expired %v; want DeadlineExceeded", c.Err(), c.Expired())
	}
	if !errors.Is(context.Cause(c), context.DeadlineExceeded) {
		t.Fatalf("Cause %v, want DeadlineExceeded", context.Cause(c))
	}
	c.SetTimeout(time.Hour) // an ended context never runs again
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err %v after a late SetTimeout", c.Err())
	}
	c.Finish()
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("Finish changed Err to %v", c.Err())
	}
}

func TestMoveLater(t *testing.T) {
	c := New(context.Background())
	c.SetTimeout(30 * time.Millisecond)
	moved := time.Now()
	c.SetTimeout(500 * time.Millisecond)
	time.Sleep(60 * time.Millisecond)
	running(t, c) // the first timer was stopped, or does nothing
	ended(t, c, 2*time.Second)
	// A timer never fires early, however loaded the machine: the bound below holds
	// (a bound on how late it fires would not).
	if took := time.Since(moved); took < 500*time.Millisecond {
		t.Fatalf("ended %v after the deadline moved to 500 ms; the first deadline (30 ms) still ran", took)
	}
	if !errors.Is(c.Err(), context.DeadlineExceeded) || c.Timeout() != 500*time.Millisecond {
		t.Fatalf("Err %v, Timeout %v", c.Err(), c.Timeout())
	}
}

func TestMoveSooner(t *testing.T) {
	c := New(context.Background())
	c.SetTimeout(time.Hour)
	c.SetTimeout(20 * time.Millisecond)
	if took := ended(t, c, time.Second); took > 500*time.Millisecond {
		t.Fatalf("ended after %v", took)
	}
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err %v", c.Err())
	}
}

func TestRemoveDeadline(t *testing.T) {
	c := New(context.Background())
	c.SetTimeout(20 * time.Millisecond)
	c.SetTimeout(0)
	if _, ok := c.Deadline(); ok {
		t.Fatal("SetTimeout(0) left a deadline")
	}
	time.Sleep(50 * time.Millisecond)
	running(t, c)
	c.Finish()
}

func TestParentCancel(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	c := New(parent)
	c.SetTimeout(time.Hour)
	cancel()
	ended(t, c, time.Second)
	if !errors.Is(c.Err(), context.Canceled) || c.Expired() {
		t.Fatalf("Err %v, Expired %v; want the parent's Canceled", c.Err(), c.Expired())
	}
	c.Finish()
}

func TestParentEndedAlready(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	cancel()
	c := New(parent)
	ended(t, c, time.Second)
	if !errors.Is(c.Err(), context.Canceled) {
		t.Fatalf("Err %v", c.Err())
	}
}

func TestParentDeadlineIsEarlier(t *testing.T) {
	parent, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	pd, _ := parent.Deadline()
	c := New(parent)
	c.SetTimeout(time.Hour)
	if dl, ok := c.Deadline(); !ok || !dl.Equal(pd) {
		t.Fatalf("Deadline %v, want the parent's %v", dl, pd)
	}
	ended(t, c, time.Second)
	if !errors.Is(c.Err(), context.DeadlineExceeded) || c.Expired() {
		t.Fatalf("Err %v, Expired %v: the parent's deadline is not the context's own", c.Err(), c.Expired())
	}
}

type valueKey struct{}

func TestValuesAndFrom(t *testing.T) {
	parent := context.WithValue(context.Background(), valueKey{}, "v")
	c := New(parent)
	defer c.Finish()
	if c.Value(valueKey{}) != "v" {
		t.Fatal("the parent's value is not seen")
	}
	derived := context.WithValue(c, valueKey{}, "w")
	if From(derived) != c || From(parent) != nil {
		t.Fatal("From does not find the context")
	}
}

// A context derived from it ends with its error: DeadlineExceeded, not Canceled.
func TestDerivedContexts(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.Background())
	defer cancelParent()
	c := New(parent)
	derived, cancel := context.WithCancel(c)
	defer cancel()
	timed, cancelTimed := context.WithTimeout(c, time.Hour)
	defer cancelTimed()
	var ran atomic.Bool
	stop := context.AfterFunc(c, func() { ran.Store(true) })
	defer stop()
	c.SetTimeout(20 * time.Millisecond)
	ended(t, derived, time.Second)
	ended(t, timed, time.Second)
	for _, d := range []context.Context{derived, timed} {
		if !errors.Is(d.Err(), context.DeadlineExceeded) {
			t.Fatalf("a derived context ended with %v, want DeadlineExceeded", d.Err())
		}
	}
	deadline := time.Now().Add(time.Second)
	for !ran.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !ran.Load() {
		t.Fatal("context.AfterFunc did not run")
	}
	c.Finish()
}

func TestAfterFuncStop(t *testing.T) {
	c := New(context.Background())
	var ran atomic.Bool
	stop := c.AfterFunc(func() { ran.Store(true) })
	if !stop() || stop() {
		t.Fatal("stop did not report unregistering once")
	}
	c.Finish()
	time.Sleep(10 * time.Millisecond)
	if ran.Load() {
		t.Fatal("a stopped AfterFunc ran")
	}
	done := make(chan struct{})
	if c.AfterFunc(func() { close(done) })() {
		t.Fatal("stop on an ended context reported true")
	}
	<-done
}

func TestWatch(t *testing.T) {
	c := New(context.Background())
	fired := make(chan time.Time, 1)
	c.Watch(func(d time.Duration) time.Duration { return d / 2 }, overrunFunc(func() { fired <- time.Now() }))
	start := time.Now()
	c.SetTimeout(40 * time.Millisecond)
	select {
	case at := <-fired:
		if took := at.Sub(start); took < 60*time.Millisecond {
			t.Fatalf("the watch fired after %v, want the deadline and its grace (60 ms)", took)
		}
	case <-time.After(time.Second):
		t.Fatal("the watch did not fire")
	}
	c.Finish()
}

func TestWatchMovesAndStops(t *testing.T) {
	c := New(context.Background())
	var fired atomic.Int32
	c.Watch(func(time.Duration) time.Duration { return 10 * time.Millisecond }, overrunFunc(func() { fired.Add(1) }))
	c.SetTimeout(10 * time.Millisecond)
	c.SetTimeout(200 * time.Millisecond) // the watch moves with the deadline
	time.Sleep(60 * time.Millisecond)
	if fired.Load() != 0 {
		t.Fatal("the watch of a moved deadline fired")
	}
	c.Finish() // the handler returned: the watch never fires
	time.Sleep(250 * time.Millisecond)
	if fired.Load() != 0 {
		t.Fatal("the watch fired after Finish")
	}
}

// Moves, reads and Finish from many goroutines at once: run with -race.
func TestConcurrentUse(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 50 {
		c := New(parent)
		c.Watch(func(time.Duration) time.Duration { return time.Millisecond }, overrunFunc(func() {}))
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 20 {
					c.SetTimeout(time.Duration(i+j%3) * time.Millisecond)
					_, _ = c.Deadline()
					_ = c.Err()
					_ = c.Expired()
					stop := c.AfterFunc(func() {})
					stop()
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-c.Done()
		}()
		time.Sleep(time.Millisecond)
		c.Finish()
		wg.Wait()
	}
}

func TestCancelCarriesItsCause(t *testing.T) {
	parent, stop := context.WithCancel(context.Background())
	defer stop()
	c := New(parent)
	var watched atomic.Bool
	c.Watch(func(time.Duration) time.Duration { return 10 * time.Millisecond }, overrunFunc(func() { watched.Store(true) }))
	c.SetTimeout(30 * time.Millisecond)
	before, stopBefore := context.WithCancel(context.WithValue(c, key{}, nil)) // derived before the cancel, through a value
	defer stopBefore()
	cause := errors.New("not wanted any more")
	if !c.Cancel(cause) {
		t.Fatal("Cancel of a running context reported it ended already")
	}
	ended(t, c, time.Second)
	if !errors.Is(c.Err(), context.Canceled) || c.Expired() {
		t.Fatalf("Err %v, Expired %v; want Canceled, not expired", c.Err(), c.Expired())
	}
	if got := context.Cause(c); got != cause {
		t.Fatalf("Cause %v, want the cancel's cause", got)
	}
	ended(t, before, time.Second)
	if got := context.Cause(before); got != cause || !errors.Is(before.Err(), context.Canceled) {
		t.Fatalf("a context derived before the cancel: Err %v, Cause %v", before.Err(), got)
	}
	after, stopAfter := context.WithTimeout(c, time.Hour) // derived after it
	defer stopAfter()
	ended(t, after, time.Second)
	if got := context.Cause(after); got != cause {
		t.Fatalf("a context derived after the cancel: Cause %v", got)
	}
	// The watch stays: a handler that ignores its cancelled context is given up on all
	// the same.
	waitWatched := time.Now().Add(time.Second)
	for !watched.Load() && time.Now().Before(waitWatched) {
		time.Sleep(5 * time.Millisecond)
	}
	if !watched.Load() || !errors.Is(c.Err(), context.Canceled) {
		t.Fatalf("after the cancel: watch fired %v, Err %v; want the watch, and Canceled", watched.Load(), c.Err())
	}
	if c.Cancel(errors.New("again")) || context.Cause(c) != cause {
		t.Fatal("a second Cancel changed the cause")
	}
	c.Finish()
	if !errors.Is(c.Err(), context.Canceled) || context.Cause(c) != cause {
		t.Fatalf("Finish after Cancel: Err %v, Cause %v", c.Err(), context.Cause(c))
	}
	f := New(context.Background())
	f.Finish()
	if f.Cancel(cause) || context.Cause(f) == cause {
		t.Fatal("Cancel of a finished context took effect")
	}
}

func TestOutliveEndsGraceAfterItsParent(t *testing.T) {
	parent, stop := context.WithCancel(context.Background())
	octx, release := Outlive(parent, 50*time.Millisecond)
	defer release()
	stop()
	select {
	case <-octx.Done():
		t.Fatal("the outliving context ended with its parent; want it to run on for its grace")
	case <-time.After(20 * time.Millisecond):
	}
	select {
	case <-octx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the outliving context did not end after its grace")
	}
}

func TestOutliveEndsAtItsRelease(t *testing.T) {
	octx, release := Outlive(context.Background(), time.Hour)
	release()
	if octx.Err() == nil {
		t.Fatal("the outliving context runs on after its release")
	}
}

// overrunFunc is an Overrunner that calls itself.
type overrunFunc func()

func (f overrunFunc) Overran() { f() }

func TestGroupEndsItsRunningContextsWithTheParent(t *testing.T) {
	parent, stop := context.WithCancel(context.Background())
	g := NewGroup(parent)
	var running, finished Context
	g.Init(&running)
	g.Init(&finished)
	finished.Finish()
	if got := groupSize(g); got != 1 {
		t.Fatalf("the group lists %d contexts; want the one still running", got)
	}
	stop()
	select {
	case <-running.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a running context of the group did not end with the parent")
	}
	if running.Err() != context.Canceled {
		t.Fatalf("Err %v; want the parent's", running.Err())
	}
	if got := groupSize(g); got != 0 {
		t.Fatalf("the group lists %d contexts after the parent ended; want none", got)
	}
	var late Context
	g.Init(&late)
	if late.Err() != context.Canceled {
		t.Fatalf("a context made after the parent ended runs (Err %v); want it ended", late.Err())
	}
}

func groupSize(g *Group) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for c := g.head; c != nil; c = c.next {
		n++
	}
	return n
}

// A context of a group ending on its own leaves the group's list: a long-lived group
// keeps none of its finished contexts.
func TestGroupForgetsContextsThatEnded(t *testing.T) {
	g := NewGroup(context.Background())
	if groupSize(g) != 0 {
		t.Fatal("a new group lists contexts")
	}
	cs := make([]Context, 5)
	for i := range cs {
		g.Init(&cs[i])
	}
	cs[2].Finish()
	cs[0].Cancel(errors.New("x"))
	cs[4].SetTimeout(time.Millisecond)
	<-cs[4].Done()
	// A context leaves the list just after its Done closes (end: the group's lock is not
	// taken under the context's), so the timer's goroutine may still be on its way.
	for deadline := time.Now().Add(5 * time.Second); groupSize(g) != 2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if got := groupSize(g); got != 2 {
		t.Fatalf("the group lists %d contexts; want the 2 still running", got)
	}
	cs[1].Finish()
	cs[3].Finish()
	if got := groupSize(g); got != 0 {
		t.Fatalf("the group lists %d contexts; want none", got)
	}
}

// A SetTimeout that races the deadline's fire (the handler extends its deadline as it
// passes) must not lose the watch: once the context ended by its deadline and the handler
// never finished, the watch fires, once, a grace after the last deadline.
//
// Goroutines reading the context (Expired, as the runtime and handlers do) contend for
// its lock, which puts sync.Mutex in starvation mode: fire's Unlock then hands the lock
// straight to a waiting SetTimeout, before fire's own end() gets it.
func TestWatchSurvivesASetTimeoutRacingTheDeadline(t *testing.T) {
	const grace = 2 * time.Millisecond
	const readers = 6
	lost, twice, tried := 0, 0, 0
	for tried < 100 {
		tried++
		c := New(context.Background())
		o := &countOverruns{}
		c.Watch(func(time.Duration) time.Duration { return grace }, o)
		c.SetTimeout(time.Millisecond)
		var wg sync.WaitGroup
		for r := 0; r <= readers; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-c.Done():
						return
					default:
					}
					if r == 0 {
						c.SetTimeout(time.Millisecond)
					} else {
						c.Expired()
					}
				}
			}()
		}
		wg.Wait()
		time.Sleep(20 * time.Millisecond) // a deadline at most 1ms ago, a grace of 2ms
		if c.Err() != context.DeadlineExceeded {
			t.Fatalf("Err %v", c.Err())
		}
		switch got := o.n.Load(); got {
		case 1:
		case 0:
			time.Sleep(time.Second)
			if o.n.Load() == 0 {
				lost++
			}
		default:
			twice++
		}
		c.Finish()
	}
	t.Logf("%d contexts tried", tried)
	if lost > 0 || twice > 0 {
		t.Fatalf("of %d contexts ended by their deadline, their handler unfinished: %d never had their watch fire, %d had it fire more than once", tried, lost, twice)
	}
}

// endAll racing Init and Finish: every context ends, with the parent's error or with
// Canceled (Finish), none stays in the list, and -race sees nothing.
func TestGroupEndingRacesInitAndFinish(t *testing.T) {
	for round := 0; round < 100; round++ {
		parent, stop := context.WithCancelCause(context.Background())
		g := NewGroup(parent)
		const n = 16
		cs := make([]Context, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g.Init(&cs[i])
				cs[i].Watch(func(time.Duration) time.Duration { return time.Millisecond }, &countOverruns{})
				cs[i].SetTimeout(time.Duration(i%3) * time.Millisecond)
				if i%2 == 0 {
					cs[i].Finish()
				}
			}()
		}
		wg.Add(1)
		go func() { defer wg.Done(); stop(context.DeadlineExceeded) }()
		wg.Wait()
		for i := range cs {
			select {
			case <-cs[i].Done():
			case <-time.After(2 * time.Second):
				t.Fatalf("round %d: context %d never ended (Err %v)", round, i, cs[i].Err())
			}
			if e := cs[i].Err(); e != context.Canceled && e != context.DeadlineExceeded {
				t.Fatalf("context %d: Err %v", i, e)
			}
		}
		// end unlinks a context just after closing Done, on the goroutine that ended it.
		for w := time.Now(); groupSize(g) != 0 && time.Since(w) < time.Second; {
			time.Sleep(time.Millisecond)
		}
		if groupSize(g) != 0 {
			t.Fatalf("round %d: the group lists %d contexts after all ended", round, groupSize(g))
		}
		for i := range cs {
			cs[i].Finish()
		}
	}
}

// The watch fires once after a Cancel, and after the parent ended, for a handler that
// ignores its context; moving the deadline before that moves the watch.
func TestAdvWatchAfterCancelAndParentEnd(t *testing.T) {
	for _, how := range []string{"cancel", "parent"} {
		parent, stop := context.WithCancel(context.Background())
		g := NewGroup(parent)
		var c Context
		g.Init(&c)
		o := &countOverruns{}
		c.Watch(func(time.Duration) time.Duration { return 20 * time.Millisecond }, o)
		c.SetTimeout(10 * time.Millisecond)
		c.SetTimeout(40 * time.Millisecond)
		start := time.Now()
		if how == "cancel" {
			c.Cancel(context.Canceled)
		} else {
			stop()
		}
		<-c.Done()
		for o.n.Load() == 0 && time.Since(start) < 2*time.Second {
			time.Sleep(time.Millisecond)
		}
		took := time.Since(start)
		time.Sleep(100 * time.Millisecond)
		if o.n.Load() != 1 || took < 55*time.Millisecond {
			t.Errorf("%s: watch fired %d times, after %v; want once, after ~60ms", how, o.n.Load(), took)
		}
		c.Finish()
		stop()
	}
}

// countOverruns counts its Overran calls.
type countOverruns struct{ n atomic.Int32 }

func (o *countOverruns) Overran() { o.n.Add(1) }

// A handler whose context was cancelled before its deadline was set (a Cancel as it
// starts) and that ignores it is still given up on: SetTimeout arms the watch.
func TestWatchArmedAfterAnEarlyCancel(t *testing.T) {
	c := New(context.Background())
	o := &countOverruns{}
	c.Watch(func(time.Duration) time.Duration { return time.Millisecond }, o)
	c.Cancel(errors.New("cancelled as it started"))
	c.SetTimeout(time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for o.n.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if o.n.Load() != 1 {
		t.Fatalf("the watch fired %d times; want once", o.n.Load())
	}
	if !errors.Is(c.Err(), context.Canceled) {
		t.Fatalf("Err %v; want the cancel's", c.Err())
	}
	c.Finish()
}

// Done's channel is made by the first Done: one asked for after the end is closed
// already, and one asked for before closes at the end, as every caller's is the same.
func TestDoneAskedBeforeOrAfterTheEndCloses(t *testing.T) {
	c := New(context.Background())
	before := c.Done()
	if c.Done() != before {
		t.Fatal("two Done calls returned different channels")
	}
	c.Finish()
	ended(t, c, time.Second)
	later := New(context.Background())
	later.Finish()
	ended(t, later, time.Second) // its first Done came after the end
	if first := later.Done(); later.Done() != first {
		t.Fatal("two Done calls after the end returned different channels")
	}
}
