package supervision

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/rowactor/rowactor/dialects"
)

// Policy is the restart delay rule: Initial doubles per consecutive failure up to Max; a
// quiet Window resets the count. The delay is drawn uniformly from [d/2, d].
type Policy struct {
	Initial time.Duration
	Max     time.Duration
	Window  time.Duration
}

// DefaultPolicy restarts after 100 ms, doubling to at most 30 s; a minute without failure
// starts over.
var DefaultPolicy = Policy{Initial: 100 * time.Millisecond, Max: 30 * time.Second, Window: time.Minute}

// delay returns the restart delay after the n-th consecutive failure (n >= 1), before
// jitter.
func (p Policy) delay(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	d := p.Initial
	for i := 1; i < n && d < p.Max; i++ {
		d *= 2
	}
	if d <= 0 || d > p.Max {
		d = p.Max
	}
	return d
}

// ForFault derives the policy for one kind of failure from p. A lost connection backs off
// as p says, growing while the server stays away. Contention (a deadlock, a lock wait, a
// busy file) clears by itself: every restart waits p.Initial, without growing. A schema
// fault (a missing table or column, a missing privilege) waits for an operator: the first
// restart already waits ten times p.Initial (a second by default), growing to p.Max.
func (p Policy) ForFault(f dialects.Fault) Policy {
	switch f {
	case dialects.FaultContention:
		p.Max = p.Initial
	case dialects.FaultSchema:
		p.Initial = min(10*p.Initial, p.Max)
	}
	return p
}

// jittered returns a delay drawn uniformly from [d/2, d].
func jittered(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// Decision is what to do with a failed child.
type Decision uint8

const (
	// Restart the child after the policy's delay.
	Restart Decision = iota + 1
	// Stop the child; its parent sees Terminated.
	Stop
)

// Backoff is a Proto.Actor supervisor strategy that restarts or stops a failed child as
// Decide says, restarting after a capped, jittered, exponentially growing delay.
type Backoff struct {
	Policy Policy
	// Decide picks the decision for a child's failure; nil restarts every child.
	Decide func(child *actor.PID, reason any) Decision
	// PolicyFor, if set, picks the policy for a failure's reason (the error a child
	// panicked with); nil uses Policy for every failure.
	PolicyFor func(reason any) Policy
	// OnRestart, if set, is told of every scheduled restart (for logs and metrics).
	OnRestart func(child *actor.PID, reason any, failures int, delay time.Duration)
	// after schedules the restart; tests replace it.
	after func(time.Duration, func()) *time.Timer

	mu     sync.Mutex
	counts map[string]map[Policy]*kindCount // per child, per policy (kind of failure)
	now    func() time.Time                 // tests replace it
}

// kindCount is one kind of failure's consecutive count for one child.
type kindCount struct {
	n    int
	last time.Time
}

// failure counts child's failure under p and returns its number among the child's
// failures of that kind: each kind counts apart, so a burst of deadlocks does not make the
// first lost connection wait the cap, and kinds that alternate do not reset each other
// (a connection lost after every deadlock still backs off as lost connections do). A
// kind's count starts over after Policy.Window without a failure of that kind.
func (b *Backoff) failure(child *actor.PID, p Policy) int {
	now := time.Now
	if b.now != nil {
		now = b.now
	}
	t := now()
	key := childKey(child)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.counts == nil {
		b.counts = map[string]map[Policy]*kindCount{}
	}
	kinds := b.counts[key]
	if kinds == nil {
		kinds = map[Policy]*kindCount{}
		b.counts[key] = kinds
	}
	c := kinds[p]
	if c == nil {
		c = &kindCount{}
		kinds[p] = c
	}
	if b.Policy.Window > 0 && c.n > 0 && t.Sub(c.last) > b.Policy.Window {
		c.n = 0
	}
	c.n++
	c.last = t
	return c.n
}

func childKey(child *actor.PID) string {
	if child == nil {
		return ""
	}
	return child.Address + "/" + child.Id
}

func (b *Backoff) forget(child *actor.PID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.counts, childKey(child))
}

// HandleFailure implements actor.SupervisorStrategy.
func (b *Backoff) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason, _ any) {
	if b.Decide != nil && b.Decide(child, reason) == Stop {
		b.forget(child)
		sup.StopChildren(child)
		return
	}
	p := b.Policy
	if b.PolicyFor != nil {
		p = b.PolicyFor(reason)
	}
	// rs is kept as Proto.Actor keeps it; the delay follows the count of this kind.
	if b.Policy.Window > 0 && rs.NumberOfFailures(b.Policy.Window) == 0 {
		rs.Reset()
	}
	rs.Fail()
	n := b.failure(child, p)
	d := jittered(p.delay(n))
	if b.OnRestart != nil {
		b.OnRestart(child, reason, n, d)
	}
	after := b.after
	if after == nil {
		after = time.AfterFunc
	}
	// The child's mailbox stays suspended until the restart, so messages sent to it
	// meanwhile wait: the delay is the backoff.
	after(d, func() { sup.RestartChildren(child) })
}
