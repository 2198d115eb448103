package actors

import (
	"runtime"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// mailbox is the mailbox of rowactor's busiest actors: each delivery actor's, which
// lives in the delivery itself, and each subscription actor's.
//
// A delivery actor gets a handful of messages in its life (Started, its handler's
// result, Stop, perhaps an overrun or a cancel), so the queues start as small arrays
// inside the mailbox, and posting a message allocates nothing until they outgrow them.
// Proto.Actor's default mailbox allocates a ring, a lock-free queue with a node per
// system message and a closure per schedule: about ten allocations per row.
//
// It keeps that mailbox's rules: system messages go first, a suspended mailbox runs
// only system messages, a panic in a message goes to the supervisor (EscalateFailure),
// and a goroutine yields after the dispatcher's throughput of messages. Two things are
// a delivery's own, both to save the hand-off of a message from one goroutine to
// another:
//   - runHandler: the delivery's handler runs on the goroutine that processed Started,
//     once the mailbox is idle, so the handler never runs inside the mailbox: a message
//     that comes meanwhile (an overrun, a Stop) is processed on another goroutine. A
//     Stop processed before the handler began takes the delivery first, and the handler
//     is not called (delivery.taken).
//   - postHere: the handler's result is processed on the handler's goroutine when the
//     mailbox is idle, instead of being scheduled onto another one.
type mailbox struct {
	mu        sync.Mutex
	sys, user []any
	sysBuf    [3]any
	userBuf   [2]any
	// scheduled says a goroutine runs the mailbox, or is about to.
	scheduled bool
	suspended bool
	// handler says the delivery's handler runs once the mailbox is idle.
	handler bool

	// owner runs the handler (the delivery), on the goroutine w (nil: not one of a
	// Dispatcher's).
	owner interface{ run(w *worker) }
	// startOn, set on a delivery's mailbox as its parent spawns it, is the parent's
	// mailbox, running on the spawning goroutine: the delivery's first run (Started, then
	// its handler) waits there in next, and runs on that goroutine as soon as the parent's
	// mailbox is idle, instead of being handed to another goroutine (deferStart).
	startOn *mailbox
	// next is a spawned delivery's mailbox waiting for this (parent's) mailbox to be idle
	// on this goroutine; only the goroutine running this mailbox touches it.
	next       *mailbox
	invoker    actor.MessageInvoker
	dispatcher actor.Dispatcher
}

var _ actor.Mailbox = (*mailbox)(nil)

func (m *mailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	m.invoker, m.dispatcher = invoker, dispatcher
	m.sys, m.user = m.sysBuf[:0], m.userBuf[:0]
}

func (m *mailbox) Start() {}

func (m *mailbox) UserMessageCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.user)
}

func (m *mailbox) PostSystemMessage(msg any) {
	m.mu.Lock()
	m.sys = append(m.sys, msg)
	m.post()
}

func (m *mailbox) PostUserMessage(msg any) {
	m.mu.Lock()
	m.user = append(m.user, msg)
	m.post()
}

// post schedules the mailbox unless a goroutine runs it; m.mu is held, and released.
func (m *mailbox) post() {
	if m.scheduled {
		m.mu.Unlock()
		return
	}
	m.scheduled = true
	parent := m.startOn
	m.startOn = nil
	m.mu.Unlock()
	if parent != nil && parent.next == nil {
		parent.next = m // the parent's goroutine: see deferStart
		return
	}
	m.schedule()
}

// schedule hands the mailbox, marked scheduled, to a goroutine of the dispatcher.
func (m *mailbox) schedule() {
	if d, ok := m.dispatcher.(*Dispatcher); ok {
		d.schedule(m) // no closure
		return
	}
	m.dispatcher.Schedule(m.processMessages)
}

func (m *mailbox) runTask(w *worker) { m.process(w) }

// postNext posts a user message from w, a dispatcher goroutine that is about to be done
// with its task, and reports whether w runs the mailbox next (it was idle). When it
// was not idle a goroutine runs it already; when w has other work next, another
// goroutine is handed it.
func (m *mailbox) postNext(msg any, w *worker) bool {
	m.mu.Lock()
	m.user = append(m.user, msg)
	if m.scheduled {
		m.mu.Unlock()
		return false
	}
	m.scheduled = true
	m.mu.Unlock()
	if w == nil || w.next != nil {
		m.schedule()
		return false
	}
	w.next = m
	return true
}

// postHere posts a user message and, if no goroutine runs the mailbox, runs it on the
// calling goroutine, which must be one of the dispatcher's with nothing else to do: the
// handler's, as it ends.
func (m *mailbox) postHere(msg any) {
	m.mu.Lock()
	m.user = append(m.user, msg)
	if m.scheduled {
		m.mu.Unlock()
		return
	}
	m.scheduled = true
	m.mu.Unlock()
	m.process(nil)
}

// runHandler asks for the delivery's handler to run on this goroutine once the mailbox
// is idle. It is called while the mailbox processes a message (Started).
func (m *mailbox) runHandler() {
	m.mu.Lock()
	m.handler = true
	m.mu.Unlock()
}

// deferStart makes the first run of child, a delivery actor's mailbox about to be
// spawned by this mailbox's actor, wait until this mailbox is idle and then run on this
// goroutine: handing it to another goroutine costs a wake-up (about 5 µs measured),
// which with one worker lies between one handler and the next. It waits no longer than
// the message being processed: should another message be waiting after it, the child is
// scheduled as any other (run). Called while this mailbox runs, before the spawn.
func (m *mailbox) deferStart(child *mailbox) {
	if m.next == nil {
		child.startOn = m
	}
}

func (m *mailbox) processMessages() { m.process(nil) }

// process runs the mailbox on the goroutine w (nil: not one of a Dispatcher's) until it
// is idle; then the handler waiting for that (runHandler), and a child's first run
// waiting for it (deferStart), are run, the latter by w once this returns.
func (m *mailbox) process(w *worker) {
	for {
		m.run()
		m.mu.Lock()
		if len(m.sys) > 0 || !m.suspended && len(m.user) > 0 {
			m.mu.Unlock()
			continue
		}
		m.scheduled = false
		handler := m.handler
		m.handler = false
		next := m.next
		m.next = nil
		m.mu.Unlock()
		if handler {
			m.owner.run(w)
		}
		if next != nil {
			if w != nil && w.next == nil {
				w.next = next
			} else {
				next.schedule()
			}
		}
		return
	}
}

// scheduleNext hands a deferred child (deferStart) to another goroutine: a message waits
// behind the one that spawned it.
func (m *mailbox) scheduleNext() {
	if next := m.next; next != nil {
		m.next = nil
		next.schedule()
	}
}

// run processes messages until none is left to process, or one panics.
func (m *mailbox) run() {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			m.invoker.EscalateFailure(r, msg)
		}
	}()
	ahead := m.dispatcher.Throughput()
	for i := 0; ; i++ {
		if i > ahead {
			i = 0
			runtime.Gosched()
		}
		var sys bool
		msg, sys = m.take()
		if msg != nil && m.next != nil {
			m.scheduleNext()
		}
		switch {
		case msg == nil:
			return
		case sys:
			m.invoker.InvokeSystemMessage(msg)
		default:
			m.invoker.InvokeUserMessage(msg)
		}
	}
}

// take takes the next message to process: a system message first; a user message
// unless the mailbox is suspended. Suspend and resume are the mailbox's own.
func (m *mailbox) take() (msg any, sys bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for len(m.sys) > 0 {
		msg = m.sys[0]
		m.sys[0] = nil
		m.sys = m.sys[1:]
		if len(m.sys) == 0 {
			m.sys = m.sysBuf[:0]
		}
		switch msg.(type) {
		case *actor.SuspendMailbox:
			m.suspended = true
		case *actor.ResumeMailbox:
			m.suspended = false
		default:
			return msg, true
		}
	}
	if m.suspended || len(m.user) == 0 {
		return nil, false
	}
	msg = m.user[0]
	m.user[0] = nil
	m.user = m.user[1:]
	if len(m.user) == 0 {
		m.user = m.userBuf[:0]
	}
	return msg, false
}

// latch is a one-shot signal whose channel is made only when somebody waits: most
// deliveries end with nobody waiting for their handler or their stop.
type latch struct {
	mu     sync.Mutex
	opened bool
	ch     chan struct{}
}

// open opens the latch, once.
func (l *latch) open() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.opened {
		return
	}
	l.opened = true
	if l.ch != nil {
		close(l.ch)
	}
}

// wait returns a channel closed once the latch is open.
func (l *latch) wait() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ch == nil {
		l.ch = make(chan struct{})
		if l.opened {
			close(l.ch)
		}
	}
	return l.ch
}
