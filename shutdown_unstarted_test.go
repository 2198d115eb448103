package rowactor_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// A Shutdown that stops deliveries as they start gives the rows whose handler had not
// begun back unstarted: no handler is called after Shutdown returns, each row's attempts
// made (Inspect) are the calls its handler got. The rounds run in transactional mode, where
// a stopping delivery waits for a handler that runs: it must not wait for one that has
// not begun (its handler runs on the goroutine that processes the stop).
func TestShutdownGivesBackRowsWhoseHandlerHadNotBegun(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		db   string
		form rowactor.Form
	}{{"sqlite", rowactor.FormLease}, {"postgres", rowactor.FormRowLock}, {"mysql", rowactor.FormAdvisory}, {"postgres", rowactor.FormLease}} {
		t.Run(c.db+"/"+c.form.String(), func(t *testing.T) {
			t.Parallel()
			drv := driverNamed(t, c.db)
			for round := 0; round < 5 && !t.Failed(); round++ {
				shutdownAsHandlersStartRound(t, drv, c.form)
			}
		})
	}
}

func shutdownAsHandlersStartRound(t *testing.T, drv driver, form rowactor.Form) {
	h := newHarness(t, drv, form, withError)
	h.tx = true
	h.sideTable = h.side()
	var failedMu sync.Mutex
	failed := map[int64]error{} // rows whose give-back did not take effect (a database error)
	b := h.broker(rowactor.WithOnSettled(func(s rowactor.Settlement) {
		if s.Err != nil && s.Err.Error() != rowactor.ErrClosed.Error() {
			failedMu.Lock()
			failed[s.ID] = s.Err
			failedMu.Unlock()
		}
	}))
	ids := h.publish(b, 8)
	var mu sync.Mutex
	got := map[int64]int{}
	var shutDown atomic.Bool
	var late atomic.Int32
	first := make(chan struct{})
	once := sync.OnceFunc(func() { close(first) })
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if shutDown.Load() {
			late.Add(1)
		}
		mu.Lock()
		got[d.ID()]++
		mu.Unlock()
		once()
		<-ctx.Done()
		return rowactor.Retry()
	}, append(leaseOptions(form, time.Hour), rowactor.Workers(8))...)
	<-first
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	_, _ = b.Shutdown(ended)
	shutDown.Store(true)
	time.Sleep(200 * time.Millisecond) // a handler the stop did not prevent would start now
	if n := late.Load(); n != 0 {
		t.Fatalf("%d handlers were called after Shutdown returned", n)
	}
	other := h.broker()
	mu.Lock()
	defer mu.Unlock()
	failedMu.Lock()
	defer failedMu.Unlock()
	for _, id := range ids {
		if err := failed[id]; err != nil {
			t.Logf("row %d: its release failed, so its attempt may stand: %v", id, err)
			continue
		}
		job, err := other.Inspect(context.Background(), h.table, id)
		if err != nil {
			t.Fatal(err)
		}
		// The row lock form's release rolls the claim back, its attempt with it: there a
		// row counts at most the calls its handler got.
		if n := int(job.Attempt); n != got[id] && (form != rowactor.FormRowLock || n > got[id]) {
			t.Errorf("row %d: %d attempts made, its handler called %d times (%s)", id, job.Attempt, got[id], fmt.Sprint(got))
		}
	}
}
