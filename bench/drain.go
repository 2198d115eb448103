package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/sqlite"
	"github.com/rowactor/rowactor/leaserenewer"
)

const (
	lease   = 30 * time.Second
	poll    = 10 * time.Millisecond
	timeout = 10 * time.Minute // for a whole drain; only a broken run comes near it
)

// A contender drains a filled table with n workers.
type contender struct {
	name  string
	drain func(ctx context.Context, d *sqlite.Dialect, workers, rows int) (result, error)
}

var contenders = []contender{{"rowactor", drainRowactor}, {"raw", drainRaw}}

// result is one drain: the timed window and the allocations around the drain.
type result struct {
	rows    int
	took    time.Duration
	mallocs uint64
}

func (r result) rate() float64         { return float64(r.rows) / r.took.Seconds() }
func (r result) allocsPerMsg() float64 { return float64(r.mallocs) / float64(r.rows) }

func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// latch counts settlements down. The window opens when the first row is in hand and
// closes when the last one settled; fail ends the wait early.
type latch struct {
	left       atomic.Int64
	once       sync.Once
	start, end time.Time
	done       chan struct{}
	failOnce   sync.Once
	err        error
	failed     chan struct{}
}

func newLatch(n int) *latch {
	l := &latch{done: make(chan struct{}), failed: make(chan struct{})}
	l.left.Store(int64(n))
	return l
}

func (l *latch) begin() { l.once.Do(func() { l.start = time.Now() }) }

func (l *latch) settled() {
	if l.left.Add(-1) == 0 {
		l.end = time.Now()
		close(l.done)
	}
}

func (l *latch) fail(err error) {
	l.failOnce.Do(func() { l.err = err; close(l.failed) })
}

func (l *latch) wait(ctx context.Context) (time.Duration, error) {
	select {
	case <-l.done:
		return l.end.Sub(l.start), nil
	case <-l.failed:
		return 0, l.err
	case <-ctx.Done():
		return 0, fmt.Errorf("%d rows unsettled: %w", l.left.Load(), ctx.Err())
	}
}

// drainRowactor runs a broker on the shared pool; its handler acks at once.
func drainRowactor(ctx context.Context, d *sqlite.Dialect, workers, rows int) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	l := newLatch(rows)
	b, err := rowactor.New(d, rowactor.WithOnSettled(func(s rowactor.Settlement) {
		if s.Err != nil || s.Step != "ack" {
			l.fail(fmt.Errorf("row %d: step %s: %v", s.ID, s.Step, s.Err))
			return
		}
		l.settled()
	}))
	if err != nil {
		return result{}, err
	}
	handler := func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		l.begin()
		return rowactor.Ack()
	}
	before := mallocs()
	_, err = b.Subscribe(ctx, table, "bench", handler,
		rowactor.Workers(workers), rowactor.Lease(lease), rowactor.PollInterval(poll))
	var took time.Duration
	if err == nil {
		took, err = l.wait(ctx)
	}
	allocs := mallocs() - before
	rep, serr := b.Shutdown(ctx)
	if err != nil {
		return result{}, err
	}
	if serr != nil {
		return result{}, fmt.Errorf("shutdown: %w", serr)
	}
	if !rep.Drained || rep.Released != 0 {
		return result{}, fmt.Errorf("shutdown: %+v", rep)
	}
	return result{rows: rows, took: took, mallocs: allocs}, nil
}

// drainRaw runs the dialect's own claim and settlement statements by hand: n goroutines
// each claim one row and ack it, until no row is left to claim.
func drainRaw(ctx context.Context, d *sqlite.Dialect, workers, rows int) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	l := newLatch(rows)
	before := mallocs()
	q, err := d.Open(ctx, dialects.QueueSpec{Table: table})
	if err != nil {
		return result{}, err
	}
	defer q.Close()
	lq := q.(dialects.LeaseQueue)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			if err := rawWorker(ctx, lq, l); err != nil {
				l.fail(err)
			}
		})
	}
	took, err := l.wait(ctx)
	if err != nil {
		cancel()
	}
	wg.Wait()
	allocs := mallocs() - before
	if err != nil {
		return result{}, err
	}
	return result{rows: rows, took: took, mallocs: allocs}, nil
}

func rawWorker(ctx context.Context, q dialects.LeaseQueue, l *latch) error {
	for {
		now := time.Now()
		claimed, err := q.ClaimLeases(ctx, now, leaserenewer.Expiry(now, lease), 1)
		if err != nil {
			return err
		}
		if len(claimed) == 0 {
			return nil // empty, or its last rows are in other workers' hands
		}
		r := claimed[0]
		l.begin()
		ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: time.Now()}, dialects.Lease{ID: r.ID, Token: r.Token})
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("row %d: lease lost", r.ID)
		}
		l.settled()
	}
}
