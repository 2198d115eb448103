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
	// The dispatcher's own goroutines: the process's count moves with other tests'.
	live := func() int {
		n := 0
		d.mine.Range(func(any, any) bool { n++; return true })
		return n
	}
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
