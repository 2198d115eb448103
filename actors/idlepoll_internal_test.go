package actors

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/goleak"
)

type tickCounter struct {
	ticks atomic.Int64
	last  atomic.Int64 // unix nanos of the last tick
}

// tickFlush is answered once every message sent to a counter before it was received.
type tickFlush struct{}

func (c *tickCounter) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case tickMsg:
		c.ticks.Add(1)
		c.last.Store(time.Now().UnixNano())
	case tickFlush:
		ctx.Respond(true)
	}
}

// TestIdlePollConcurrentWaitLeaveAndClose proves that with subscriptions waiting and leaving
// from many goroutines while rounds probe (due, not due, failing, wrong count) and the poll
// closes: no probe or tick follows Close, no tick follows leave, a due waiter is ticked
// within an interval and a probe, and every goroutine of the poll ends.
func TestIdlePollConcurrentWaitLeaveAndClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	for run := 0; run < 20; run++ {
		var probes, afterClose atomic.Int64
		var closed atomic.Bool
		var mode atomic.Int32
		probe := func(ctx context.Context, groups []string, _ time.Time) ([]bool, error) {
			probes.Add(1)
			if closed.Load() {
				afterClose.Add(1)
			}
			switch mode.Load() % 4 {
			case 1:
				return nil, errors.New("probe failed")
			case 2:
				return make([]bool, len(groups)+1), nil // the wrong count: every waiter is ticked
			case 3:
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(time.Duration(20+rand.IntN(20)) * time.Millisecond): // spans leaves
				}
			}
			due := make([]bool, len(groups))
			for i := range due {
				due[i] = rand.IntN(2) == 0
			}
			return due, nil
		}
		p := NewIdlePoll("t", time.Millisecond, time.Now, log, probe)
		const n = 40
		subs := make([]*Subscription, n)
		counters := make([]*tickCounter, n)
		pids := make([]*actor.PID, n)
		for i := range subs {
			subs[i] = &Subscription{sys: sys}
			counters[i] = &tickCounter{}
			c := counters[i]
			pids[i] = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return c }))
		}
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var left sync.Map // index -> ticks seen when leave returned, for subscriptions gone for good
		for i := range subs {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				for k := 0; ; k++ {
					select {
					case <-stop:
						return
					default:
					}
					if i%8 == 0 && k == 50 {
						p.leave(subs[i])
						// Ticks sent before leave returned are received before the flush.
						_, _ = sys.Root.RequestFuture(pids[i], tickFlush{}, 10*time.Second).Result()
						left.Store(i, counters[i].ticks.Load())
						return
					}
					p.wait(subs[i], pids[i], "g")
					if rand.IntN(4) == 0 {
						p.leave(subs[i])
					}
					mode.Add(1)
					time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
				}
			}(i)
		}
		time.Sleep(time.Duration(80+rand.IntN(40)) * time.Millisecond)
		p.Close()
		closed.Store(true)
		close(stop)
		wg.Wait()
		// Ticks sent before Close returned may still sit in the mailboxes (slowly, on a
		// loaded machine): a flush sent now comes after them.
		for _, pid := range pids {
			if _, err := sys.Root.RequestFuture(pid, tickFlush{}, 10*time.Second).Result(); err != nil {
				t.Fatalf("run %d: flush: %v", run, err)
			}
		}
		ticks := int64(0)
		for _, c := range counters {
			ticks += c.ticks.Load()
		}
		time.Sleep(20 * time.Millisecond)
		if n := afterClose.Load(); n != 0 {
			t.Fatalf("run %d: %d probes after Close", run, n)
		}
		after := int64(0)
		for _, c := range counters {
			after += c.ticks.Load()
		}
		if after != ticks {
			t.Fatalf("run %d: %d ticks sent after Close returned", run, after-ticks)
		}
		left.Range(func(k, v any) bool {
			if got := counters[k.(int)].ticks.Load(); got != v.(int64) {
				t.Errorf("run %d: subscription %d left and still got %d ticks", run, k, got-v.(int64))
			}
			return true
		})
		if probes.Load() == 0 {
			t.Fatalf("run %d: no probe ran", run)
		}
		for _, pid := range pids {
			sys.Root.Stop(pid)
		}
	}
}

// TestIdlePollTicksALateWaiterWithinAnInterval proves that a subscription that starts
// waiting while others wait already (rounds running back to back) is ticked within an
// interval and a probe when its group is due. The interval is long beside the slack a
// loaded CI run needs (a tick came 98 ms after a wait began at a 50 ms interval), so that
// the bound still tells one interval from the two a late waiter would wait if it missed
// the round under way.
func TestIdlePollTicksALateWaiterWithinAnInterval(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	const interval = 200 * time.Millisecond
	const probeTime = 10 * time.Millisecond
	const slack = 100 * time.Millisecond // < interval - probeTime: one missed round exceeds it
	probe := func(ctx context.Context, groups []string, _ time.Time) ([]bool, error) {
		time.Sleep(probeTime)
		due := make([]bool, len(groups))
		for i, g := range groups {
			due[i] = g == "due"
		}
		return due, nil
	}
	p := NewIdlePoll("t", interval, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)), probe)
	defer p.Close()
	idle := &Subscription{sys: sys}
	p.wait(idle, sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &tickCounter{} })), "never")
	for i := 0; i < 12; i++ {
		time.Sleep(time.Duration(rand.IntN(int(interval))))
		c := &tickCounter{}
		pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return c }))
		s := &Subscription{sys: sys}
		start := time.Now()
		p.wait(s, pid, "due")
		deadline := time.Now().Add(time.Second)
		for c.ticks.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if c.ticks.Load() == 0 {
			t.Fatalf("wait %d: never ticked", i)
		}
		if d := time.Unix(0, c.last.Load()).Sub(start); d > interval+probeTime+slack {
			t.Errorf("wait %d: ticked %v after it began waiting, at a %v interval and a %v probe", i, d, interval, probeTime)
		}
		if p.numWaiting() != 1 {
			t.Fatalf("%d waiting, want the idle one", p.numWaiting())
		}
		sys.Root.Stop(pid)
	}
}
