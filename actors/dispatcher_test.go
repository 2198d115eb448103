package actors

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestDispatcherKeepsGoroutinesWarmAndEndsThemOnClose(t *testing.T) {
	defer goleak.VerifyNone(t)
	d := NewDispatcher(time.Minute)
	defer d.Close()
	live := d.goroutines
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		d.Schedule(wg.Done)
		wg.Wait() // one piece of work at a time: an idle goroutine takes each
		// A goroutine that has just finished may not be back in its select when the next
		// piece of work comes, and then a second one starts (work never waits); on a loaded
		// machine that is often, unless the finished one gets a moment to get back.
		time.Sleep(time.Millisecond)
	}
	// A few, not a hundred.
	if n := live(); n < 1 || n > 8 {
		t.Fatalf("%d goroutines for 100 sequential pieces of work, want a few kept warm", n)
	}
	// Work never queues: three pieces that block until all three run, run.
	block, started := make(chan struct{}), make(chan struct{}, 3)
	for range 3 {
		wg.Add(1)
		d.Schedule(func() { started <- struct{}{}; <-block; wg.Done() })
	}
	for i := range 3 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			close(block)
			t.Fatalf("%d of 3 blocked pieces of work started: work must not queue", i)
		}
	}
	close(block)
	wg.Wait()
	d.Close()
	wg.Add(1)
	d.Schedule(wg.Done) // after Close work still runs
	wg.Wait()
}

// Goroutines that waited for work through a whole idle period end; those that work stay.
func TestDispatcherEndsGoroutinesIdleForAPeriod(t *testing.T) {
	defer goleak.VerifyNone(t)
	d := NewDispatcher(20 * time.Millisecond)
	defer d.Close()
	live := d.goroutines
	// Ten pieces of work that block until all ten run: ten goroutines.
	var wg sync.WaitGroup
	block := make(chan struct{})
	for range 10 {
		wg.Add(1)
		d.Schedule(func() { <-block; wg.Done() })
	}
	close(block)
	wg.Wait()
	if n := live(); n < 10 {
		t.Fatalf("%d goroutines ran ten blocked pieces of work at once; want 10", n)
	}
	// One piece of work every 2 ms keeps one of them busy, or two; the rest end.
	deadline := time.Now().Add(5 * time.Second)
	for live() > 2 && time.Now().Before(deadline) {
		wg.Add(1)
		d.Schedule(wg.Done)
		wg.Wait()
		time.Sleep(2 * time.Millisecond)
	}
	if n := live(); n > 2 {
		t.Fatalf("%d goroutines left after 5 s of one piece of work at a time, idle period 20 ms; want 1 or 2", n)
	}
	// With no work at all, none is left.
	for live() > 0 && time.Now().Before(deadline.Add(time.Second)) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := live(); n != 0 {
		t.Fatalf("%d goroutines left with no work; want 0", n)
	}
}

// A dispatcher never closed leaves no goroutine once its work is done: its goroutines
// end after their idle period, and the reaper with the last of them. One with no idle
// time ends each goroutine with its work.
func TestDispatcherNeverClosedLeavesNothing(t *testing.T) {
	for _, idle := range []time.Duration{0, -time.Second, 5 * time.Millisecond} {
		d := NewDispatcher(idle)
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			d.Schedule(wg.Done)
		}
		wg.Wait()
		goleak.VerifyNone(t)
	}
}

// goroutines counts the dispatcher's own goroutines: the process's count moves with other
// tests'.
func (d *Dispatcher) goroutines() int {
	n := 0
	d.mine.Range(func(any, any) bool { n++; return true })
	return n
}
