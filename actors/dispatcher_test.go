package actors

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestDispatcherKeepsGoroutinesWarmAndEndsThemOnClose(t *testing.T) {
	defer goleak.VerifyNone(t)
	d := NewDispatcher(time.Minute)
	defer d.Close()
	base := runtime.NumGoroutine()
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		d.Schedule(wg.Done)
		wg.Wait() // one piece of work at a time: an idle goroutine takes each
	}
	// A goroutine that has just finished may not be back in its select when the next piece
	// of work comes, and then a second one starts (work never waits): a few, not a hundred.
	if n := runtime.NumGoroutine() - base; n < 1 || n > 4 {
		t.Fatalf("%d goroutines for 100 sequential pieces of work, want a few kept warm", n)
	}
	block := make(chan struct{})
	for range 3 {
		wg.Add(1)
		d.Schedule(func() { <-block; wg.Done() })
	}
	if n := runtime.NumGoroutine() - base; n < 3 {
		t.Fatalf("%d goroutines for 3 blocked pieces of work, want at least 3: work must not queue", n)
	}
	close(block)
	wg.Wait()
	d.Close()
	wg.Add(1)
	d.Schedule(wg.Done) // after Close work still runs
	wg.Wait()
}
