package actors

import (
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// invokerLog records what the mailbox hands its actor, in order.
type invokerLog struct {
	mu        sync.Mutex
	got       []any
	failures  []any
	onMessage func(msg any)
}

func (l *invokerLog) record(msg any) {
	l.mu.Lock()
	l.got = append(l.got, msg)
	f := l.onMessage
	l.mu.Unlock()
	if f != nil {
		f(msg)
	}
}

func (l *invokerLog) InvokeSystemMessage(msg any) { l.record(msg) }
func (l *invokerLog) InvokeUserMessage(msg any)   { l.record(msg) }
func (l *invokerLog) EscalateFailure(reason any, msg any) {
	l.mu.Lock()
	l.failures = append(l.failures, reason)
	l.mu.Unlock()
}

func (l *invokerLog) messages() []any {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]any(nil), l.got...)
}

// manualDispatcher runs what is scheduled only when told to.
type manualDispatcher struct{ queued []func() }

func (d *manualDispatcher) Schedule(fn func()) { d.queued = append(d.queued, fn) }
func (d *manualDispatcher) Throughput() int    { return 300 }
func (d *manualDispatcher) runAll() {
	for len(d.queued) > 0 {
		fn := d.queued[0]
		d.queued = d.queued[1:]
		fn()
	}
}

type runFunc func()

func (f runFunc) run() { f() }

func TestDeliveryMailboxRunsSystemMessagesFirstAndSchedulesOnce(t *testing.T) {
	var log invokerLog
	disp := &manualDispatcher{}
	var m mailbox
	m.RegisterHandlers(&log, disp)
	m.PostUserMessage("u1")
	m.PostUserMessage("u2")
	m.PostUserMessage("u3") // past the inline room
	m.PostSystemMessage("s1")
	if len(disp.queued) != 1 {
		t.Fatalf("%d schedules for four posts to an idle mailbox; want 1", len(disp.queued))
	}
	if n := m.UserMessageCount(); n != 3 {
		t.Fatalf("UserMessageCount %d; want 3", n)
	}
	disp.runAll()
	want := []any{"s1", "u1", "u2", "u3"}
	got := log.messages()
	if len(got) != len(want) {
		t.Fatalf("processed %v; want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("processed %v; want %v", got, want)
		}
	}
	m.PostUserMessage("u4")
	if len(disp.queued) != 1 {
		t.Fatalf("an idle mailbox was not scheduled again for a new message")
	}
}

func TestDeliveryMailboxSuspendedRunsOnlySystemMessages(t *testing.T) {
	var log invokerLog
	disp := &manualDispatcher{}
	var m mailbox
	m.RegisterHandlers(&log, disp)
	m.PostSystemMessage(&actor.SuspendMailbox{})
	m.PostUserMessage("u1")
	m.PostSystemMessage("s1")
	disp.runAll()
	if got := log.messages(); len(got) != 1 || got[0] != "s1" {
		t.Fatalf("a suspended mailbox processed %v; want only s1", got)
	}
	m.PostSystemMessage(&actor.ResumeMailbox{})
	disp.runAll()
	if got := log.messages(); len(got) != 2 || got[1] != "u1" {
		t.Fatalf("after resume the mailbox processed %v; want s1, u1", got)
	}
}

func TestDeliveryMailboxEscalatesAPanicAndGoesOn(t *testing.T) {
	var log invokerLog
	log.onMessage = func(msg any) {
		if msg == "boom" {
			panic("boom")
		}
	}
	disp := &manualDispatcher{}
	var m mailbox
	m.RegisterHandlers(&log, disp)
	m.PostUserMessage("boom")
	m.PostUserMessage("after")
	disp.runAll()
	if len(log.failures) != 1 || log.failures[0] != "boom" {
		t.Fatalf("failures %v; want the panic escalated once", log.failures)
	}
	if got := log.messages(); len(got) != 2 || got[1] != "after" {
		t.Fatalf("processed %v; want the message after the panic too", got)
	}
}

// The handler runs on the goroutine that processed Started, after the mailbox went idle:
// a message posted while it runs is processed on another goroutine, at once.
func TestDeliveryMailboxRunsTheHandlerOutsideTheMailbox(t *testing.T) {
	d := NewDispatcher(time.Second)
	defer d.Close()
	var log invokerLog
	var m mailbox
	release := make(chan struct{})
	overrunSeen := make(chan struct{})
	handlerDone := make(chan struct{})
	m.owner = runFunc(func() {
		defer close(handlerDone)
		m.PostUserMessage("overrun") // as the deadline watch does
		select {
		case <-overrunSeen:
		case <-time.After(5 * time.Second):
			t.Error("a message posted while the handler ran waited for the handler")
		}
		<-release
		m.postHere("handled")
	})
	log.onMessage = func(msg any) {
		switch msg {
		case "started":
			m.runHandler()
		case "overrun":
			close(overrunSeen)
		}
	}
	m.RegisterHandlers(&log, d)
	m.PostSystemMessage("started")
	close(release)
	<-handlerDone
	got := log.messages()
	if len(got) != 3 || got[0] != "started" || got[1] != "overrun" || got[2] != "handled" {
		t.Fatalf("processed %v; want started, overrun, handled", got)
	}
}

func TestLatchOpensForWaitersBeforeAndAfter(t *testing.T) {
	var l latch
	before := l.wait()
	select {
	case <-before:
		t.Fatal("a closed latch's channel is closed")
	default:
	}
	l.open()
	l.open() // once
	for i, ch := range []<-chan struct{}{before, l.wait()} {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter %d: the open latch's channel stays open", i)
		}
	}
	var late latch
	late.open()
	select {
	case <-late.wait():
	default:
		t.Fatal("a latch opened before anyone waited does not read open")
	}
}
