package supervision

import (
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/rowactor/rowactor/dialects"
)

func TestPolicyDoublesUpToItsCap(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := p.Delay(i + 1); got != w*time.Millisecond {
			t.Fatalf("Delay(%d) = %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	if got := p.Delay(1000); got != time.Second {
		t.Fatalf("Delay(1000) = %v, want the cap", got)
	}
}

func TestJitterStaysInTheUpperHalf(t *testing.T) {
	d := 800 * time.Millisecond
	seen := map[time.Duration]bool{}
	for range 1000 {
		j := Jittered(d)
		if j < d/2 || j > d {
			t.Fatalf("Jittered(%v) = %v, outside [%v, %v]", d, j, d/2, d)
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
		want  []time.Duration // Delay(1), Delay(2), Delay(10)
	}{
		{dialects.FaultConnection, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 30 * time.Second}},
		{dialects.FaultUnknown, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 30 * time.Second}},
		{dialects.FaultContention, []time.Duration{100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond}},
		{dialects.FaultSchema, []time.Duration{time.Second, 2 * time.Second, 30 * time.Second}},
	}
	for _, c := range cases {
		fp := p.ForFault(c.fault)
		for i, n := range []int{1, 2, 10} {
			if got := fp.Delay(n); got != c.want[i] {
				t.Errorf("%v: Delay(%d) = %v, want %v", c.fault, n, got, c.want[i])
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
