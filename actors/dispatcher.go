package actors

import (
	"sync"
	"time"
)

// Dispatcher runs mailboxes (and handlers) on goroutines that outlive one burst of work.
// Proto.Actor's default dispatcher starts a new goroutine each time an idle mailbox gets a
// message, and a new goroutine starts on a small stack: a SQL driver's deep calls then grow
// and copy it on nearly every statement (measured on SQLite: 11–13% of the CPU with one
// worker). Here a goroutine that finished its work waits a while for more, keeping its
// grown stack. Work never queues behind a busy goroutine: a new one starts when none is
// idle.
type Dispatcher struct {
	work  chan func()
	done  chan struct{}
	once  sync.Once
	idle  time.Duration
	ahead int
}

// NewDispatcher returns a dispatcher whose goroutines wait idle for up to idle.
func NewDispatcher(idle time.Duration) *Dispatcher {
	return &Dispatcher{work: make(chan func()), done: make(chan struct{}), idle: idle, ahead: 300}
}

// Schedule runs fn on an idle goroutine, or on a new one.
func (d *Dispatcher) Schedule(fn func()) {
	select {
	case d.work <- fn:
	default:
		go d.loop(fn)
	}
}

// Throughput is how many messages a mailbox processes before it yields.
func (d *Dispatcher) Throughput() int { return d.ahead }

func (d *Dispatcher) loop(fn func()) {
	fn()
	t := time.NewTimer(d.idle)
	defer t.Stop()
	for {
		select {
		case fn := <-d.work:
			fn()
			t.Reset(d.idle)
		case <-t.C:
			return
		case <-d.done:
			return
		}
	}
}

// Close lets idle goroutines end at once, and busy ones as soon as their work is done.
// Work scheduled afterwards still runs, each on a goroutine that then ends.
func (d *Dispatcher) Close() { d.once.Do(func() { close(d.done) }) }
