package main

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// result is one drain: the timed window and what was counted around it.
type result struct {
	rows int
	took time.Duration
	// handled is the part of the window until the last handler call: the rest is the
	// settlement of the last messages (for River, its completer's last batch).
	handled time.Duration
	mallocs uint64
	// cpu is the process's CPU time (user + system) over the same span as mallocs.
	cpu time.Duration
	// stmts counts the statements the system's pool ran (PostgreSQL only; -1 elsewhere).
	stmts int64
}

func (r result) rate() float64         { return float64(r.rows) / r.took.Seconds() }
func (r result) handledRate() float64  { return float64(r.rows) / r.handled.Seconds() }
func (r result) allocsPerMsg() float64 { return float64(r.mallocs) / float64(r.rows) }
func (r result) cpuPerMsg() float64    { return float64(r.cpu.Microseconds()) / float64(r.rows) }
func (r result) stmtsPerMsg() float64  { return float64(r.stmts) / float64(r.rows) }

// meter reads the process's counters at the start of a drain; stop returns the deltas.
type meter struct {
	mallocs uint64
	cpu     time.Duration
	stmts   func() int64
	stmts0  int64
}

func startMeter(stmts func() int64) meter {
	m := meter{mallocs: mallocs(), cpu: cpuTime(), stmts: stmts}
	if stmts != nil {
		m.stmts0 = stmts()
	}
	return m
}

func (m meter) stop(rows int, took, handled time.Duration) result {
	r := result{rows: rows, took: took, handled: handled, mallocs: mallocs() - m.mallocs, cpu: cpuTime() - m.cpu, stmts: -1}
	if m.stmts != nil {
		r.stmts = m.stmts() - m.stmts0
	}
	return r
}

func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// latch counts settlements down, as bench/drain.go's does: the window opens when the
// first message is in a handler's hands and closes when the last one is settled (deleted,
// or for River marked completed), whichever goroutine does it; fail ends the wait early.
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
	switch n := l.left.Add(-1); {
	case n == 0:
		l.end = time.Now()
		close(l.done)
	case n < 0:
		l.fail(fmt.Errorf("%d settlements more than rows", -n))
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
		return 0, fmt.Errorf("%d messages unsettled: %w", l.left.Load(), ctx.Err())
	}
}

// tally checks exactly-once handling: every message carries its sequence number, and
// each handler call counts it. A second call for the same number fails the drain at once;
// check finds the numbers never handled.
type tally struct {
	seen    []atomic.Int32
	l       *latch
	handled atomic.Int64
	last    time.Time // of the last handler call, set by the call that makes it rows
}

func newTally(rows int, l *latch) *tally { return &tally{seen: make([]atomic.Int32, rows), l: l} }

func (t *tally) handle(seq int) {
	if seq < 0 || seq >= len(t.seen) {
		t.l.fail(fmt.Errorf("handled message %d, outside 0..%d", seq, len(t.seen)-1))
		return
	}
	if n := t.seen[seq].Add(1); n > 1 {
		t.l.fail(fmt.Errorf("message %d handled %d times", seq, n))
	}
	if t.handled.Add(1) == int64(len(t.seen)) {
		t.last = time.Now()
	}
}

// handledIn is the time from the window's start to the last handler call; call it
// after the latch closed (every settlement follows its handler call).
func (t *tally) handledIn() time.Duration { return t.last.Sub(t.l.start) }

func (t *tally) check() error {
	missing := 0
	for i := range t.seen {
		if t.seen[i].Load() != 1 {
			missing++
		}
	}
	if missing > 0 {
		return fmt.Errorf("%d of %d messages not handled exactly once", missing, len(t.seen))
	}
	return nil
}

// payloadSize is every message's size, as in bench/: the sequence number in seqDigits
// decimal digits, then letters.
const (
	payloadSize = 64
	seqDigits   = 8
)

func payloadFor(seq int) []byte {
	p := make([]byte, payloadSize)
	copy(p, fmt.Sprintf("%0*d", seqDigits, seq))
	for i := seqDigits; i < payloadSize; i++ {
		p[i] = 'a' + byte(i%26)
	}
	return p
}

// seqOf reads the sequence number back; -1 for a payload that carries none.
func seqOf(p []byte) int {
	if len(p) < seqDigits {
		return -1
	}
	n, err := strconv.Atoi(string(p[:seqDigits]))
	if err != nil {
		return -1
	}
	return n
}
