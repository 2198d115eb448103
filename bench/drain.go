package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/leaserenewer"
)

const (
	lease   = 30 * time.Second
	timeout = 10 * time.Minute // for a whole drain; only a broken run comes near it
)

// prefetch is the -prefetch flag: rowactor's Prefetch(n) in the lease form, given only
// when the flag is (-1, the default, leaves rowactor to size the room itself).
var prefetch int

// A contender drains a filled table with n workers.
type contender struct {
	name    string
	forms   []dialects.Form // the forms it drains; nil for every form
	tracing bool            // rowactor with an SDK tracer and meter provider
	drain   func(ctx context.Context, tg *target, t tableDesc, workers, rows int, tracing bool) (result, error)
}

// key tells the two rowactor contenders apart.
func (c contender) key() string {
	if c.name == "rowactor" {
		return c.name + "/" + onOff(c.tracing)
	}
	return c.name
}

// result is one drain: the timed window and what was counted around the drain.
type result struct {
	rows    int
	took    time.Duration
	mallocs uint64
	// cpu is the process's CPU time (user + system) over the same span as mallocs: the
	// client side's cost, whatever the other tenants of the machine do to the clock.
	cpu time.Duration
	// stmts is the statement count and stmtsBy how it was counted ("driver",
	// "construction"; "" for none).
	stmts   int64
	stmtsBy string
	// spans is the number of spans the exporter received (tracing on).
	spans int64
	// note holds what else the drain saw, for the progress line.
	note string
}

func (r result) rate() float64         { return float64(r.rows) / r.took.Seconds() }
func (r result) allocsPerMsg() float64 { return float64(r.mallocs) / float64(r.rows) }
func (r result) stmtsPerMsg() float64  { return float64(r.stmts) / float64(r.rows) }
func (r result) spansPerMsg() float64  { return float64(r.spans) / float64(r.rows) }
func (r result) cpuPerMsg() float64    { return float64(r.cpu.Microseconds()) / float64(r.rows) }

func (r result) notes() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%.0f µs CPU/msg ", r.cpuPerMsg())
	if r.stmtsBy != "" {
		fmt.Fprintf(&b, "%.2f stmts/msg (%s) ", r.stmtsPerMsg(), r.stmtsBy)
	}
	if r.spans > 0 {
		fmt.Fprintf(&b, "%.2f spans/msg ", r.spansPerMsg())
	}
	if r.note != "" {
		b.WriteString(r.note + " ")
	}
	return b.String()
}

func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// stmtCount reads the driver's statement counter, 0 where there is none.
func (tg *target) stmtCount() int64 {
	if tg.driverStmts == nil {
		return 0
	}
	return tg.driverStmts.Load()
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

// drainRowactor runs a broker on the shared dialect; its handler acks at once. With
// tracing, the broker gets an SDK tracer provider (always sampling, batching to an
// exporter that discards) and an SDK meter provider (a manual reader); without, it gets
// neither option and so otel's global providers, which are no-ops unless a program sets
// them, as here it does not. Shutdown must find every row settled.
func drainRowactor(ctx context.Context, tg *target, t tableDesc, workers, rows int, tracing bool) (result, error) {
	r, rep, err := runRowactor(ctx, tg, t, workers, rows, tracing)
	if err != nil {
		return result{}, err
	}
	if rep.Released != 0 {
		return result{}, fmt.Errorf("shutdown: %+v", rep)
	}
	return r, nil
}

// runRowactor is drainRowactor's run, timed until rows are settled (the table may hold
// more): Shutdown must drain what is in work, and may give back rows claimed but not yet
// started.
func runRowactor(ctx context.Context, tg *target, t tableDesc, workers, rows int, tracing bool) (result, rowactor.ShutdownReport, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	l := newLatch(rows)
	opts := []rowactor.Option{rowactor.WithOnSettled(func(s rowactor.Settlement) {
		if s.Released && s.Err == nil {
			return // given back unstarted (every worker stalled): delivered again
		}
		if s.Err != nil || s.Step != "ack" {
			l.fail(fmt.Errorf("row %d: step %s: %v", s.ID, s.Step, s.Err))
			return
		}
		l.settled()
	})}
	var tel *telemetryOn
	if tracing {
		tel = newTelemetry()
		opts = append(opts, tel.options()...)
	}
	var brokers []*rowactor.Broker
	for _, d := range tg.pools() {
		b, err := rowactor.New(d, opts...)
		if err != nil {
			return result{}, rowactor.ShutdownReport{}, err
		}
		brokers = append(brokers, b)
	}
	handler := func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		l.begin()
		return rowactor.Ack()
	}
	// rowactor's defaults but for the worker count and the lease: no PollInterval (a
	// drain never idles, and an untuned user keeps the default), Prefetch only when asked.
	sopts := []rowactor.SubscribeOption{rowactor.Workers(workers)}
	if t.Form() == dialects.FormLease {
		sopts = append(sopts, rowactor.Lease(lease))
		if prefetch >= 0 {
			sopts = append(sopts, rowactor.Prefetch(prefetch))
		}
	}
	before, cpuBefore, stmtsBefore := mallocs(), cpuTime(), tg.stmtCount()
	var err error
	for _, b := range brokers {
		if _, err = b.Subscribe(ctx, t.Table, "bench", handler, sopts...); err != nil {
			break
		}
	}
	var took time.Duration
	if err == nil {
		took, err = l.wait(ctx)
	}
	allocs, cpu, stmts := mallocs()-before, cpuTime()-cpuBefore, tg.stmtCount()-stmtsBefore
	rep, serr := shutdownAll(ctx, brokers)
	r := result{rows: rows, took: took, mallocs: allocs, cpu: cpu}
	if tg.driverStmts != nil {
		r.stmts, r.stmtsBy = stmts, "driver"
	}
	if tel != nil {
		o, terr := tel.finish(ctx)
		if terr != nil && err == nil {
			err = fmt.Errorf("telemetry: %w", terr)
		}
		r.spans = o.spans
		if o.deliveries != int64(rows) && err == nil {
			err = fmt.Errorf("telemetry: the rowactor.deliveries counter reads %d, want %d", o.deliveries, rows)
		}
		if o.claims > 0 {
			r.note = fmt.Sprintf("%d claims, %.2f rows and %.2f ms each", o.claims,
				float64(o.claimedRows)/float64(o.claims), 1000*o.claimTime/float64(o.claims))
		}
	}
	if err != nil {
		return result{}, rep, err
	}
	if serr != nil {
		return result{}, rep, fmt.Errorf("shutdown: %w", serr)
	}
	if !rep.Drained {
		return result{}, rep, fmt.Errorf("shutdown: %+v", rep)
	}
	if rep.ConnectionsClosed > 0 {
		r.note = strings.TrimPrefix(r.note+fmt.Sprintf(", %d session connections closed", rep.ConnectionsClosed), ", ")
	}
	return r, rep, nil
}

// shutdownAll shuts the brokers down and adds their reports up: drained only if every one
// drained.
func shutdownAll(ctx context.Context, brokers []*rowactor.Broker) (rowactor.ShutdownReport, error) {
	var (
		all  = rowactor.ShutdownReport{Drained: true}
		errs []error
	)
	for _, b := range brokers {
		rep, err := b.Shutdown(ctx)
		all.Drained = all.Drained && rep.Drained
		all.Released += rep.Released
		all.ConnectionsClosed += rep.ConnectionsClosed
		errs = append(errs, err)
	}
	return all, errors.Join(errs...)
}

// tally is what one raw worker ran: statements by construction (see costs), and the
// advisory claims that lost their key or row to another worker.
type tally struct {
	stmts              int64
	lockMiss, takeMiss int64
	connsClosed        int64
}

func (t *tally) add(o tally) {
	t.stmts += o.stmts
	t.lockMiss += o.lockMiss
	t.takeMiss += o.takeMiss
	t.connsClosed += o.connsClosed
}

// drainRaw runs the dialect's own claim and settlement statements by hand, through the
// dialect's interfaces: n goroutines each claim one row and ack it, until a claim finds no
// row left to claim.
func drainRaw(ctx context.Context, tg *target, t tableDesc, workers, rows int, _ bool) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	l := newLatch(rows)
	before, cpuBefore, stmtsBefore := mallocs(), cpuTime(), tg.stmtCount()
	retriesBefore := tg.retries.Load()
	qs, closeQueues, err := tg.openQueues(ctx, dialects.QueueSpec{Table: t.Table})
	if err != nil {
		return result{}, err
	}
	defer closeQueues()
	var work func(context.Context, *latch) (tally, error)
	switch t.Form() {
	case dialects.FormLease:
		next := spread[dialects.LeaseQueue](qs)
		work = func(ctx context.Context, l *latch) (tally, error) { return rawLease(ctx, next(), tg.costs, l) }
	case dialects.FormRowLock:
		next := spread[dialects.RowLockQueue](qs)
		work = func(ctx context.Context, l *latch) (tally, error) { return rawRowLock(ctx, next(), tg.costs, l) }
	case dialects.FormAdvisory:
		next := spread[dialects.AdvisoryQueue](qs)
		work = func(ctx context.Context, l *latch) (tally, error) { return rawAdvisory(ctx, next(), tg.costs, l) }
	}
	took, total, err := runLoops(ctx, cancel, l, workers*len(qs), work)
	allocs, cpu, driver := mallocs()-before, cpuTime()-cpuBefore, tg.stmtCount()-stmtsBefore
	if err != nil {
		return result{}, err
	}
	r := result{rows: rows, took: took, mallocs: allocs, cpu: cpu, stmts: total.stmts, stmtsBy: "construction"}
	var notes []string
	if tg.driverStmts != nil {
		r.stmts, r.stmtsBy = driver, "driver"
		// The construction's count leaves out d.Open's checks; a gap beyond them means
		// the table in costs.go is wrong.
		if gap := driver - total.stmts; gap < 0 || gap > 50 {
			notes = append(notes, fmt.Sprintf("WARNING: the driver counted %d statements, the construction %d", driver, total.stmts))
		}
	}
	if total.lockMiss+total.takeMiss > 0 {
		notes = append(notes, fmt.Sprintf("%d keys held elsewhere, %d rows gone", total.lockMiss, total.takeMiss))
	}
	if total.connsClosed > 0 {
		notes = append(notes, fmt.Sprintf("%d session connections closed", total.connsClosed))
	}
	if n := tg.retries.Load() - retriesBefore; n > 0 {
		notes = append(notes, fmt.Sprintf("%d claims or settlements run again after a certification conflict", n))
	}
	r.note = strings.Join(notes, ", ")
	return r, nil
}

// runLoops runs work on n goroutines until the latch says every row settled (or one
// failed), and adds up their tallies.
func runLoops(ctx context.Context, cancel context.CancelFunc, l *latch, n int, work func(context.Context, *latch) (tally, error)) (time.Duration, tally, error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total tally
	)
	for range n {
		wg.Go(func() {
			tl, err := work(ctx, l)
			if err != nil {
				l.fail(err)
			}
			mu.Lock()
			total.add(tl)
			mu.Unlock()
		})
	}
	took, err := l.wait(ctx)
	if err != nil {
		cancel()
	}
	wg.Wait()
	return took, total, err
}

func ack() dialects.Step { return dialects.Step{Kind: dialects.StepAck, Now: time.Now()} }

// rawLease: ClaimLeases(limit 1), then SettleLease(ack) fenced by the token, as rowactor's
// claimer computes it.
func rawLease(ctx context.Context, q dialects.LeaseQueue, c costs, l *latch) (tl tally, _ error) {
	for {
		now := time.Now()
		claimed, err := q.ClaimLeases(ctx, now, leaserenewer.Expiry(now, lease), 1)
		if err != nil {
			return tl, err
		}
		if len(claimed) == 0 {
			tl.stmts += int64(c.claimLeaseEmpty)
			return tl, nil // empty, or its last rows are in other workers' hands
		}
		tl.stmts += int64(c.claimLease)
		r := claimed[0]
		l.begin()
		ok, err := q.SettleLease(ctx, ack(), dialects.Lease{ID: r.ID, Token: r.Token})
		tl.stmts += int64(c.settleLease)
		if err != nil {
			return tl, err
		}
		if !ok {
			return tl, fmt.Errorf("row %d: lease lost", r.ID)
		}
		l.settled()
	}
}

// rawRowLock: ClaimLocked, then Settle(ack) in the claim transaction.
func rawRowLock(ctx context.Context, q dialects.RowLockQueue, c costs, l *latch) (tl tally, _ error) {
	for {
		lc, ok, err := q.ClaimLocked(ctx, time.Now())
		if err != nil {
			return tl, err
		}
		if !ok {
			tl.stmts += int64(c.claimLockedEmpty)
			return tl, nil // empty, or its last rows are locked by other workers
		}
		tl.stmts += int64(c.claimLocked)
		l.begin()
		err = lc.Settle(ctx, ack())
		tl.stmts += int64(c.settleLocked)
		if err != nil {
			return tl, err
		}
		l.settled()
	}
}

// rawAdvisory: Candidates(limit 1), then on a session of its own TryLock the key, Take the
// row, Settle(ack) and Unlock. A key held elsewhere or a row gone meanwhile sends the
// worker back to Candidates.
func rawAdvisory(ctx context.Context, q dialects.AdvisoryQueue, c costs, l *latch) (tl tally, _ error) {
	for {
		now := time.Now()
		cands, err := q.Candidates(ctx, now, 1)
		tl.stmts += int64(c.candidates)
		if err != nil {
			return tl, err
		}
		if len(cands) == 0 {
			return tl, nil // empty, or its last keys are held by other workers
		}
		cand := cands[0]
		s, err := q.Session(ctx)
		if err != nil {
			return tl, err
		}
		locked, err := s.TryLock(ctx, cand.Key)
		tl.stmts += int64(c.tryLock)
		if err != nil {
			return tl, errors.Join(err, s.Abort(ctx))
		}
		if !locked {
			tl.lockMiss++
			tl.stmts += int64(c.unlockNotHeld)
			if err := unlock(ctx, s, &tl); err != nil {
				return tl, err
			}
			continue
		}
		row, ok, err := s.Take(ctx, cand.ID, now)
		if err != nil {
			return tl, errors.Join(err, s.Abort(ctx))
		}
		if !ok {
			tl.takeMiss++
			tl.stmts += int64(c.takeMissed + c.unlockHeld)
			if err := unlock(ctx, s, &tl); err != nil {
				return tl, err
			}
			continue
		}
		tl.stmts += int64(c.take)
		l.begin()
		err = s.Settle(ctx, ack(), row.ID)
		tl.stmts += int64(c.settleSession + c.unlockHeld)
		if err != nil {
			return tl, errors.Join(err, s.Abort(ctx))
		}
		if err := unlock(ctx, s, &tl); err != nil {
			return tl, err
		}
		l.settled()
	}
}

func unlock(ctx context.Context, s dialects.Session, tl *tally) error {
	closed, err := s.Unlock(ctx)
	if closed {
		tl.connsClosed++
	}
	return err
}
