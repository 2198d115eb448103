package actors

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// deliveryMailbox is a delivery actor's mailbox, lived in the delivery itself.
//
// A delivery actor gets a handful of messages in its life (Started, its handler's
// result, Stop, perhaps an overrun or a cancel), so its queues are small arrays inside
// the delivery, and posting a message allocates nothing. Proto.Actor's default mailbox
// allocates a ring, a lock-free queue with a node per system message and a closure per
// schedule: about ten allocations per row.
//
// It keeps that mailbox's rules: system messages go first, a suspended mailbox runs
// only system messages, and a panic in a message goes to the supervisor
// (EscalateFailure). Two things are its own, both to save the hand-off of a message
// from one goroutine to another:
//   - handler: the delivery's handler runs on the goroutine that processed Started, once
//     the mailbox is idle, so the handler never runs inside the mailbox: a message that
//     comes meanwhile (an overrun, a Stop) is processed on another goroutine.
//   - postHere: the handler's result is processed on the handler's goroutine when the
//     mailbox is idle, instead of being scheduled onto another one.
type deliveryMailbox struct {
	mu        sync.Mutex
	sys, user []any
	sysBuf    [3]any
	userBuf   [2]any
	// scheduled says a goroutine runs the mailbox, or is about to.
	scheduled bool
	suspended bool
	// handler says the delivery's handler runs once the mailbox is idle.
	handler bool

	// owner runs the handler (the delivery).
	owner      interface{ run() }
	invoker    actor.MessageInvoker
	dispatcher actor.Dispatcher
	process    func() // processMessages, bound once
}

var _ actor.Mailbox = (*deliveryMailbox)(nil)

func (m *deliveryMailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	m.invoker, m.dispatcher = invoker, dispatcher
	m.process = m.processMessages
	m.sys, m.user = m.sysBuf[:0], m.userBuf[:0]
}

func (m *deliveryMailbox) Start() {}

func (m *deliveryMailbox) UserMessageCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.user)
}

func (m *deliveryMailbox) PostSystemMessage(msg any) {
	m.mu.Lock()
	m.sys = append(m.sys, msg)
	m.post()
}

func (m *deliveryMailbox) PostUserMessage(msg any) {
	m.mu.Lock()
	m.user = append(m.user, msg)
	m.post()
}

// post schedules the mailbox unless a goroutine runs it; m.mu is held, and released.
func (m *deliveryMailbox) post() {
	if m.scheduled {
		m.mu.Unlock()
		return
	}
	m.scheduled = true
	m.mu.Unlock()
	m.dispatcher.Schedule(m.process)
}

// postHere posts a user message and, if no goroutine runs the mailbox, runs it on the
// calling goroutine, which must be one of the dispatcher's with nothing else to do: the
// handler's, as it ends.
func (m *deliveryMailbox) postHere(msg any) {
	m.mu.Lock()
	m.user = append(m.user, msg)
	if m.scheduled {
		m.mu.Unlock()
		return
	}
	m.scheduled = true
	m.mu.Unlock()
	m.processMessages()
}

// runHandler asks for the delivery's handler to run on this goroutine once the mailbox
// is idle. It is called while the mailbox processes a message (Started).
func (m *deliveryMailbox) runHandler() {
	m.mu.Lock()
	m.handler = true
	m.mu.Unlock()
}

func (m *deliveryMailbox) processMessages() {
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
		m.mu.Unlock()
		if handler {
			m.owner.run()
		}
		return
	}
}

// run processes messages until none is left to process, or one panics.
func (m *deliveryMailbox) run() {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			m.invoker.EscalateFailure(r, msg)
		}
	}()
	for {
		var sys bool
		msg, sys = m.next()
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

// next takes the next message to process: a system message first; a user message
// unless the mailbox is suspended. Suspend and resume are the mailbox's own.
func (m *deliveryMailbox) next() (msg any, sys bool) {
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
