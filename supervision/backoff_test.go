package supervision

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/rowactor/rowactor/dialects"
)

func TestPolicyDoublesUpToItsCap(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := p.delay(i + 1); got != w*time.Millisecond {
			t.Fatalf("delay(%d) = %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	if got := p.delay(1000); got != time.Second {
		t.Fatalf("delay(1000) = %v, want the cap", got)
	}
}

func TestJitterStaysInTheUpperHalf(t *testing.T) {
	d := 800 * time.Millisecond
	seen := map[time.Duration]bool{}
	for range 1000 {
		j := jittered(d)
		if j < d/2 || j > d {
			t.Fatalf("jittered(%v) = %v, outside [%v, %v]", d, j, d/2, d)
		}
		seen[j] = true
	}
	if len(seen) < 100 {
		t.Fatalf("only %d distinct delays in 1000 draws: no jitter", len(seen))
	}
}

func TestPolicyForFault(t *testing.T) {
	p := DefaultPolicy
	cases := []struct {
		fault dialects.Fault
		want  []time.Duration // delay(1), delay(2), delay(10)
	}{
		{dialects.FaultConnection, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 30 * time.Second}},
		{dialects.FaultUnknown, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 30 * time.Second}},
		{dialects.FaultContention, []time.Duration{100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond}},
		{dialects.FaultSchema, []time.Duration{time.Second, 2 * time.Second, 30 * time.Second}},
	}
	for _, c := range cases {
		fp := p.ForFault(c.fault)
		for i, n := range []int{1, 2, 10} {
			if got := fp.delay(n); got != c.want[i] {
				t.Errorf("%v: delay(%d) = %v, want %v", c.fault, n, got, c.want[i])
			}
		}
	}
}

type restarts struct{ restarted, stopped int }

func (*restarts) Children() []*actor.PID               { return nil }
func (*restarts) EscalateFailure(any, any)             {}
func (r *restarts) RestartChildren(pids ...*actor.PID) { r.restarted += len(pids) }
func (r *restarts) StopChildren(pids ...*actor.PID)    { r.stopped += len(pids) }
func (*restarts) ResumeChildren(...*actor.PID)         {}

// TestBackoffPicksThePolicyByReason: the delay before each restart follows the policy
// PolicyFor picks for the failure's reason, so contention never grows the delay while a
// lost connection doubles it.
func TestBackoffPicksThePolicyByReason(t *testing.T) {
	contention := errors.New("deadlock")
	faultOf := func(reason any) dialects.Fault {
		if reason == contention {
			return dialects.FaultContention
		}
		return dialects.FaultConnection
	}
	for _, c := range []struct {
		reason error
		max    time.Duration // the largest delay five failures in a row may wait
	}{
		{contention, 100 * time.Millisecond},
		{errors.New("connection refused"), 1600 * time.Millisecond},
	} {
		var delays []time.Duration
		sup := &restarts{}
		b := &Backoff{
			Policy:    DefaultPolicy,
			PolicyFor: func(reason any) Policy { return DefaultPolicy.ForFault(faultOf(reason)) },
			after: func(d time.Duration, f func()) *time.Timer {
				delays = append(delays, d)
				f()
				return nil
			},
		}
		rs := actor.NewRestartStatistics()
		for range 5 {
			b.HandleFailure(nil, sup, nil, rs, c.reason, nil)
		}
		if sup.restarted != 5 {
			t.Fatalf("%v: %d restarts, want 5", c.reason, sup.restarted)
		}
		if last := delays[4]; last > c.max || last < c.max/2 {
			t.Errorf("%v: fifth delay %v, want within [%v, %v]; all: %v", c.reason, last, c.max/2, c.max, delays)
		}
	}
}

// A burst of contention (a Galera cluster's certification failures, say) must not make the
// first lost connection after it wait the cap: the count of failures grows per kind.
func TestBackoffCountsEachKindOfFailureApart(t *testing.T) {
	contention, lost := errors.New("deadlock"), errors.New("connection refused")
	b := &Backoff{
		Policy: DefaultPolicy,
		PolicyFor: func(reason any) Policy {
			if reason == contention {
				return DefaultPolicy.ForFault(dialects.FaultContention)
			}
			return DefaultPolicy.ForFault(dialects.FaultConnection)
		},
	}
	var delays []time.Duration
	b.after = func(d time.Duration, f func()) *time.Timer {
		delays = append(delays, d)
		f()
		return nil
	}
	sup := &restarts{}
	rs := actor.NewRestartStatistics()
	for range 40 {
		b.HandleFailure(nil, sup, nil, rs, contention, nil)
	}
	b.HandleFailure(nil, sup, nil, rs, lost, nil)
	b.HandleFailure(nil, sup, nil, rs, lost, nil)
	if d := delays[40]; d > DefaultPolicy.Initial {
		t.Fatalf("the first lost connection after 40 deadlocks waits %v, want at most %v (the first of its kind)", d, DefaultPolicy.Initial)
	}
	if d := delays[41]; d > 2*DefaultPolicy.Initial || d < DefaultPolicy.Initial {
		t.Fatalf("the second lost connection waits %v, want within [%v, %v]", d, DefaultPolicy.Initial, 2*DefaultPolicy.Initial)
	}
}

// Kinds that alternate must not reset each other's count: a node that answers every other
// claim with a certification conflict and loses the connection in between (or a dead
// server behind a check that fails as a schema fault) must still see the reconnect delay
// grow toward the cap. Resetting the count at each change of kind kept it at Initial for
// ever: a dead database polled ten times a second.
func TestBackoffAlternatingKindsStillGrow(t *testing.T) {
	contention, lost := errors.New("deadlock"), errors.New("connection refused")
	b := &Backoff{
		Policy: DefaultPolicy,
		PolicyFor: func(reason any) Policy {
			if reason == contention {
				return DefaultPolicy.ForFault(dialects.FaultContention)
			}
			return DefaultPolicy.ForFault(dialects.FaultConnection)
		},
	}
	var delays []time.Duration
	b.after = func(d time.Duration, f func()) *time.Timer {
		delays = append(delays, d)
		f()
		return nil
	}
	sup := &restarts{}
	rs := actor.NewRestartStatistics()
	for range 10 {
		b.HandleFailure(nil, sup, nil, rs, lost, nil)
		b.HandleFailure(nil, sup, nil, rs, contention, nil)
	}
	// The tenth lost connection: delay(10) = the 30 s cap, jittered into [15 s, 30 s].
	if d := delays[18]; d < DefaultPolicy.Max/2 {
		t.Fatalf("the tenth lost connection, each after a deadlock, waits %v, want at least %v; lost-connection delays: %v",
			d, DefaultPolicy.Max/2, []time.Duration{delays[0], delays[2], delays[4], delays[6], delays[8], delays[18]})
	}
	// Contention still never waits more than Initial.
	for i := 1; i < len(delays); i += 2 {
		if delays[i] > DefaultPolicy.Initial {
			t.Fatalf("deadlock %d waits %v, want at most %v", i/2+1, delays[i], DefaultPolicy.Initial)
		}
	}
}

// HandleFailure runs on the supervising actor, but several Backoffs' children, or a
// strategy shared by several parents, may fail at once: the bookkeeping is safe under -race.
func TestBackoffConcurrentChildren(t *testing.T) {
	b := &Backoff{Policy: DefaultPolicy, PolicyFor: func(reason any) Policy {
		return DefaultPolicy.ForFault(reason.(dialects.Fault))
	}}
	b.after = func(_ time.Duration, f func()) *time.Timer { f(); return nil }
	done := make(chan struct{})
	for i := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			sup := &restarts{}
			pid := actor.NewPID("local", fmt.Sprintf("child-%d", i))
			rs := actor.NewRestartStatistics()
			for j := range 200 {
				f := dialects.FaultConnection
				if j%3 == 0 {
					f = dialects.FaultContention
				}
				b.HandleFailure(nil, sup, pid, rs, f, nil)
			}
		}()
	}
	for range 8 {
		<-done
	}
}

// A kind's count starts over after a Window without a failure of that kind, even when
// failures of another kind came in between.
func TestBackoffWindowResetsEachKind(t *testing.T) {
	contention, lost := errors.New("deadlock"), errors.New("connection refused")
	clock := time.Unix(0, 0)
	b := &Backoff{
		Policy: DefaultPolicy,
		PolicyFor: func(reason any) Policy {
			if reason == contention {
				return DefaultPolicy.ForFault(dialects.FaultContention)
			}
			return DefaultPolicy.ForFault(dialects.FaultConnection)
		},
		now: func() time.Time { return clock },
	}
	var counts []int
	b.OnRestart = func(_ *actor.PID, _ any, n int, _ time.Duration) { counts = append(counts, n) }
	b.after = func(_ time.Duration, f func()) *time.Timer { f(); return nil }
	sup, rs := &restarts{}, actor.NewRestartStatistics()
	for range 4 {
		b.HandleFailure(nil, sup, nil, rs, lost, nil)
	}
	for range 3 { // deadlocks every 30 s for 90 s: no lost connection for longer than the window
		clock = clock.Add(30 * time.Second)
		b.HandleFailure(nil, sup, nil, rs, contention, nil)
	}
	b.HandleFailure(nil, sup, nil, rs, lost, nil)
	if want := []int{1, 2, 3, 4, 1, 2, 3, 1}; fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Fatalf("failure counts %v, want %v", counts, want)
	}
}
