package actors

import (
	"runtime"
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

func (f runFunc) run(*worker) { f() }

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

// TestSpawnedDeliveryStartsOnTheSpawningGoroutine: a delivery spawned while its parent's
// mailbox runs starts on the parent's goroutine once the parent's message is done, not
// inside it and not on another goroutine.
func TestSpawnedDeliveryStartsOnTheSpawningGoroutine(t *testing.T) {
	disp := NewDispatcher(time.Second)
	defer disp.Close()
	var parent, child mailbox
	var childLog invokerLog
	child.RegisterHandlers(&childLog, disp)
	parentDone := make(chan uint64, 1)
	childRan := make(chan [2]uint64, 1)
	var inParent bool
	var mu sync.Mutex
	childLog.onMessage = func(any) {
		mu.Lock()
		during := inParent
		mu.Unlock()
		var d uint64
		if during {
			d = 1
		}
		childRan <- [2]uint64{goroutineID(), d}
	}
	parentLog := &invokerLog{onMessage: func(any) {
		mu.Lock()
		inParent = true
		mu.Unlock()
		parent.deferStart(&child)
		child.PostSystemMessage("started") // as Spawn does
		mu.Lock()
		inParent = false
		mu.Unlock()
		parentDone <- goroutineID()
	}}
	parent.RegisterHandlers(parentLog, disp)
	parent.PostUserMessage("spawn")
	g := <-parentDone
	select {
	case got := <-childRan:
		if got[1] == 1 {
			t.Fatal("the child ran inside its parent's message")
		}
		if got[0] != g {
			t.Fatalf("the child ran on goroutine %d; its parent on %d", got[0], g)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the child never ran")
	}
}

// TestSpawnedDeliveryDoesNotWaitBehindTheParentsNextMessage: when another message waits
// in the parent's mailbox, the child is handed to another goroutine at once. The
// parent's next message here waits for the child: were the child held back for the
// parent's goroutine, neither would ever run.
func TestSpawnedDeliveryDoesNotWaitBehindTheParentsNextMessage(t *testing.T) {
	disp := NewDispatcher(time.Second)
	defer disp.Close()
	var parent, child mailbox
	childRan := make(chan struct{})
	child.RegisterHandlers(&invokerLog{onMessage: func(any) { close(childRan) }}, disp)
	released := make(chan struct{})
	parent.RegisterHandlers(&invokerLog{onMessage: func(msg any) {
		switch msg {
		case "spawn":
			parent.PostUserMessage("wait for the child")
			parent.deferStart(&child)
			child.PostSystemMessage("started")
		case "wait for the child":
			select {
			case <-childRan:
				close(released)
			case <-time.After(5 * time.Second):
			}
		}
	}}, disp)
	parent.PostUserMessage("spawn")
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("the child waited behind its parent's next message")
	}
}

// TestDispatcherRunsChainedWorkWithoutNesting: work a task leaves for its goroutine
// (worker.next) runs after the task returns, so a chain of any length keeps the stack
// flat: a subscription and its deliveries pass one goroutine back and forth for as many
// rows as the queue holds.
func TestDispatcherRunsChainedWorkWithoutNesting(t *testing.T) {
	disp := NewDispatcher(time.Second)
	defer disp.Close()
	const n = 10000
	var frames [64]uintptr
	first, deepest, ran := 0, 0, 0
	done := make(chan struct{})
	var step chainTask
	step = func(w *worker) {
		depth := runtime.Callers(1, frames[:])
		if ran == 0 {
			first = depth
		}
		deepest = max(deepest, depth)
		ran++
		if ran < n {
			w.next = step
		} else {
			close(done)
		}
	}
	disp.schedule(step)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("ran %d of %d chained tasks", ran, n)
	}
	if deepest != first {
		t.Fatalf("the stack grew from %d to %d frames over the chain; want it flat", first, deepest)
	}
}

type chainTask func(w *worker)

func (f chainTask) runTask(w *worker) { f(w) }

// TestPostNextRunsAnIdleMailboxOnTheCallersGoroutineNext: a worker's return posted from
// the handler's goroutine runs the idle subscription there, after the caller's task; a
// busy one only gets the message.
func TestPostNextRunsAnIdleMailboxOnTheCallersGoroutineNext(t *testing.T) {
	disp := &manualDispatcher{}
	var m mailbox
	var log invokerLog
	m.RegisterHandlers(&log, disp)
	w := new(worker)
	if !m.postNext("free", w) || w.next != &m {
		t.Fatalf("an idle mailbox was not left to the caller (next %v)", w.next)
	}
	if m.postNext("free again", w) || len(disp.queued) != 0 {
		t.Fatal("a second post to a mailbox already left to the caller scheduled it")
	}
	w.run(nil)
	if len(log.messages()) != 0 {
		t.Fatal("worker.run(nil) ran something")
	}
	next := w.next
	w.next = nil
	w.run(next)
	if got := log.messages(); len(got) != 2 || got[0] != "free" || got[1] != "free again" {
		t.Fatalf("processed %v; want [free, free again]", got)
	}
	// A busy caller's goroutine (next taken) hands the mailbox to the dispatcher.
	w.next = chainTask(func(*worker) {})
	if m.postNext("busy", w) {
		t.Fatal("the mailbox was left to a goroutine with other work next")
	}
	if len(disp.queued) != 1 {
		t.Fatalf("%d schedules; want 1", len(disp.queued))
	}
}
