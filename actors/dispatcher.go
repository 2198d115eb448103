package actors

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Dispatcher runs mailboxes (and handlers) on goroutines that outlive one burst of work.
// Proto.Actor's default dispatcher starts a new goroutine each time an idle mailbox gets a
// message, and a new goroutine starts on a small stack: a SQL driver's deep calls then grow
// and copy it on nearly every statement (measured on SQLite: 11–13% of the CPU with one
// worker). Here a goroutine that finished its work waits a while for more, keeping its
// grown stack. Work never queues behind a busy goroutine: a new one starts when none is
// idle.
//
// A goroutine waits for work on the work channel alone, with no timer and no other
// channel: a timer in that wait was added to and taken off the runtime's timer heap each
// time the goroutine went idle, once per message or more (SQLite lease drain: 7–8% of the
// throughput), and a select over three channels locked and queued on all three (5–6% of
// the CPU). Instead one reaper per dispatcher ends, every idle period, as many idle
// goroutines as stayed idle throughout it, by handing each a retire task through the
// work channel; after Close it hands one to every goroutine that waits (reap).
type Dispatcher struct {
	work  chan task
	done  chan struct{}
	once  sync.Once
	idle  time.Duration
	ahead int
	// waiting counts the goroutines waiting for work; fewest is the least that waited at
	// once since the reaper's last round; live counts the goroutines. reaping says the
	// reaper runs: it starts with a goroutine and ends once none is left, so a dispatcher
	// never closed leaves nothing.
	waiting atomic.Int64
	fewest  atomic.Int64
	live    atomic.Int64
	mu      sync.Mutex
	reaping bool
	// mine holds the ids of the goroutines running the dispatcher's work (read once per
	// goroutine, never per message), so that Running can tell a call from a handler.
	mine sync.Map
}

// NewDispatcher returns a dispatcher whose goroutines wait idle for up to idle.
func NewDispatcher(idle time.Duration) *Dispatcher {
	return &Dispatcher{work: make(chan task), done: make(chan struct{}), idle: idle, ahead: 300}
}

// retireTask ends the goroutine that takes it from the work channel (reap).
type retireTask struct{}

func (retireTask) runTask(*worker) {}

// retire is the one retireTask: a task that is one is compared without an allocation.
var retire task = retireTask{}

// task is work for the dispatcher. A mailbox that is one runs without the closure a
// func costs each time it is scheduled.
type task interface{ runTask(w *worker) }

type funcTask func()

func (f funcTask) runTask(*worker) { f() }

// worker is what one of the dispatcher's goroutines keeps for itself: next is work a
// task left for this goroutine to run once the task returns, instead of handing it to
// another goroutine (which costs a wake-up) or calling it from inside the task (which
// would nest one call in the next without end). See mailbox.deferStart and
// mailbox.postNext.
type worker struct{ next task }

// run runs t, then the work it left, in turn.
func (w *worker) run(t task) {
	for t != nil {
		t.runTask(w)
		t, w.next = w.next, nil
	}
}

// Schedule runs fn on an idle goroutine, or on a new one.
func (d *Dispatcher) Schedule(fn func()) { d.schedule(funcTask(fn)) }

func (d *Dispatcher) schedule(t task) {
	select {
	case d.work <- t:
	default:
		d.live.Add(1)
		if d.idle > 0 {
			d.mu.Lock()
			if !d.reaping {
				d.reaping = true
				d.fewest.Store(0) // its first round ends none: nothing was measured yet
				go d.reap()
			}
			d.mu.Unlock()
		}
		go d.loop(t)
	}
}

// Throughput is how many messages a mailbox processes before it yields.
func (d *Dispatcher) Throughput() int { return d.ahead }

func (d *Dispatcher) loop(first task) {
	id := goroutineID()
	d.mine.Store(id, struct{}{})
	defer d.mine.Delete(id)
	defer d.live.Add(-1)
	w := new(worker)
	w.run(first)
	if d.idle <= 0 {
		return // no idle time: a goroutine ends with its work
	}
	for {
		select {
		case <-d.done:
			return // closed: the reaper retires only the goroutines that wait
		default:
		}
		d.waiting.Add(1)
		next := <-d.work
		d.working()
		if next == retire {
			return
		}
		w.run(next)
	}
}

// working counts a goroutine that stopped waiting, and keeps the least that waited at
// once for the reaper.
func (d *Dispatcher) working() {
	n := d.waiting.Add(-1)
	for {
		f := d.fewest.Load()
		if n >= f || d.fewest.CompareAndSwap(f, n) {
			return
		}
	}
}

// reap ends, every idle period, as many goroutines as waited for work throughout it: at
// no moment of the period did fewer wait, so that many were not needed. Each ends as it
// takes a retire task; one that took work meanwhile is not there to take it. (The
// count is read, then swapped in: a goroutine that takes work in between is counted as
// waiting, which at worst ends a goroutine a period early.) Under a steady load that
// keeps one goroutine waiting, one ends each period and the next burst starts another:
// one new goroutine per idle period (1 s for a broker) at most. The reaper ends once no
// goroutine is left, and the next one starts it again.
//
// Once the dispatcher is closed, it retires every goroutine that waits, and looks again
// every closedRetry until none is left: a goroutine that finished its work as Close came
// may have looked at done just before, and wait for work after the reaper's round.
func (d *Dispatcher) reap() {
	t := time.NewTicker(d.idle)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-d.done:
			d.retireClosed()
			return
		}
		if d.noneLeft() {
			return
		}
		surplus := d.fewest.Swap(d.waiting.Load())
		for ; surplus > 0 && d.retireOne(); surplus-- {
		}
	}
}

// closedRetry is how often the reaper of a closed dispatcher looks for goroutines that
// still wait.
const closedRetry = 5 * time.Millisecond

// retireClosed retires the goroutines of a closed dispatcher as each comes to wait, and
// ends with the last; schedule after Close starts a reaper that ends at once once none is
// left.
func (d *Dispatcher) retireClosed() {
	for {
		for d.retireOne() {
		}
		if d.noneLeft() {
			return
		}
		time.Sleep(closedRetry)
	}
}

// noneLeft reports whether no goroutine is left, and then marks the reaper ended: under
// d.mu, so that schedule, which counts its goroutine in live before it looks at reaping,
// starts a new reaper or is seen here.
func (d *Dispatcher) noneLeft() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.live.Load() != 0 {
		return false
	}
	d.reaping = false
	return true
}

// retireOne hands a retire task to a goroutine that waits, if one does.
func (d *Dispatcher) retireOne() bool {
	select {
	case d.work <- retire:
		return true
	default:
		return false
	}
}

// Close lets idle goroutines end at once, and busy ones as soon as their work is done.
// Work scheduled afterwards still runs, each on a goroutine that then ends.
func (d *Dispatcher) Close() { d.once.Do(func() { close(d.done) }) }

// Running reports whether the calling goroutine is one of the dispatcher's: it runs a
// mailbox, a handler or a hook of rowactor's. A call that waits for rowactor's work to
// end (Shutdown) would wait for itself there.
func (d *Dispatcher) Running() bool {
	_, ok := d.mine.Load(goroutineID())
	return ok
}

// goroutineID is the calling goroutine's id, read from its stack header ("goroutine 18
// [running]:"). Go hides the id on purpose; it is read here only to recognise rowactor's
// own goroutines, once when each starts and once per Shutdown.
func goroutineID() uint64 {
	var buf [32]byte
	n := runtime.Stack(buf[:], false)
	b := bytes.TrimPrefix(buf[:n], []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}
