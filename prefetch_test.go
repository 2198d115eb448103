package rowactor_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/internal/testhook"
)

var prefetchScenarios = []scenario{
	{name: "without Prefetch, fast handlers get rows claimed ahead of their workers where a waiting row holds nothing", forms: leaseAndAdvisory,
		run: fastHandlersClaimAhead},
	{name: "without Prefetch, slow handlers hold Workers plus one and share a backlog with another process", forms: leaseAndAdvisory,
		run: slowHandlersDoNotHoard},
	{name: "slow handlers after fast ones do not hoard a backlog", forms: leaseAndAdvisory,
		run: slowHandlersAfterFastDoNotHoard},
	{name: "rows waiting in the measured room keep their short leases", forms: []rowactor.Form{rowactor.FormLease},
		run: roomBacklogKeepsShortLeases},
	{name: "rows waiting behind workers that all got stuck go back to another process", forms: leaseAndAdvisory,
		run: stuckWorkersGiveWaitingRowsBack},
	{name: "workers that keep freeing, however slowly, keep the rows claimed ahead", forms: leaseAndAdvisory,
		run: workersThatKeepFreeingKeepTheirRoom},
}

// leaseAndAdvisory are the forms whose rows may wait for a worker: a lease row anywhere,
// an advisory row where its key costs no connection (SQLite keeps keys in the process).
var leaseAndAdvisory = []rowactor.Form{rowactor.FormLease, rowactor.FormAdvisory}

// fastHandlersClaimAhead: one worker and an instant handler. Claiming only for free
// workers, no claim could take more than one row; the measured room (claim latency over
// handling time) makes claims take the next rows while the worker is busy, so some claim
// takes more rows than there are workers. Where a waiting row would hold a connection
// (an advisory key on a server), no claim takes more than the free worker's row.
func fastHandlersClaimAhead(t *testing.T, h *harness, form rowactor.Form) {
	tel := newTelemetry(t)
	b := h.broker(tel.options()...)
	const rows = 150
	h.publish(b, rows)
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }, rowactor.Workers(1))
	for _, s := range h.waitSettled(rows) {
		if s.Err != nil || s.Step != "ack" {
			t.Fatalf("settlement %+v", s)
		}
	}
	if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name); n != 0 {
		t.Fatalf("%d rows left after every ack", n)
	}
	most := tel.histogramMax(t, "rowactor.claim.rows")
	if form == rowactor.FormAdvisory && h.drv.keyLocked != nil {
		if most != 1 {
			t.Fatalf("the largest advisory claim took %d rows with Workers(1); want 1 (a waiting row's key would hold a connection)", most)
		}
		return
	}
	if most <= 1 {
		t.Fatalf("the largest claim took %d rows with Workers(1) and an instant handler; want more than one (rows claimed ahead of the worker)", most)
	}
}

// slowHandlersDoNotHoard: two brokers on pools of their own (two processes, as far as the
// table can tell) with equal workers and 100 ms handlers drain one backlog. Each holds
// at most its workers plus one claim's worth (the room a 100 ms handler measures is a row
// or two), so each handles 40–60% of the rows.
func slowHandlersDoNotHoard(t *testing.T, h *harness, _ rowactor.Form) {
	const (
		rows    = 60
		workers = 3
	)
	tel := [2]*telemetryBundle{newDeltaTelemetry(t), newDeltaTelemetry(t)}
	one, two := h.broker(tel[0].options()...), h.second(tel[1].options()...)
	h.publish(one, rows)
	var (
		handled  [2]atomic.Int64
		finished sync.Map // ids whose handler returned
	)
	handler := func(i int) rowactor.Handler {
		return func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			handled[i].Add(1)
			time.Sleep(100 * time.Millisecond)
			finished.Store(d.ID(), true)
			return rowactor.Ack()
		}
	}
	h.subscribe(one, handler(0), rowactor.Workers(workers))
	h.subscribe(two, handler(1), rowactor.Workers(workers))
	peak := sampleHeld(t, h, &finished)
	got := h.waitSettled(rows)
	most := peak()
	for _, s := range got {
		if s.Err != nil || s.Step != "ack" {
			t.Fatalf("settlement %+v", s)
		}
	}
	if limit := roomBound(t, tel[:], workers, 100*time.Millisecond); most > limit {
		t.Errorf("two subscriptions of %d workers with 100 ms handlers held %d rows at once; want at most %d (workers and one claim's worth of room each)", workers, most, limit)
	}
	a, b := handled[0].Load(), handled[1].Load()
	if a+b != rows || a < rows*4/10 || b < rows*4/10 {
		t.Errorf("the two processes handled %d and %d of %d rows; want each 40–60%%", a, b, rows)
	}
}

// sampleHeld samples, every 20 ms until the returned func is called, the rows the table
// holds for handlers that have not returned: leased (an advisory row: taken, its attempt
// counted, and not yet acked away), and not in finished (a returned row stays leased
// until its batched ack commits). A row whose handler returns while the
// sample's query runs is counted held though its worker may already have claimed the
// next one: those rows are taken off, so a sample never counts more than was held. The
// func returns the largest sample.
func sampleHeld(t *testing.T, h *harness, finished *sync.Map) func() int {
	heldRow := "locked_until IS NOT NULL"
	if h.table.LockedUntil == "" {
		// Published at attempt 1; the take counts the next (attemptColumn), an ack deletes.
		heldRow = "attempt > 1"
	}
	done := make(chan struct{})
	peak := make(chan int, 1)
	go func() {
		most := 0
		for {
			list := []string{"-1"}
			finished.Range(func(id, _ any) bool { list = append(list, strconv.FormatInt(id.(int64), 10)); return true })
			held := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name+
				" WHERE "+heldRow+" AND id NOT IN ("+strings.Join(list, ",")+")")
			after := 0
			finished.Range(func(any, any) bool { after++; return true })
			most = max(most, held-(after-(len(list)-1)))
			select {
			case <-done:
				peak <- most
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() int { close(done); return <-peak }
}

// roomFloor is actors.roomFloor: the least claim latency a measured room covers.
const roomFloor = 2 * time.Millisecond

// roomBound is the most rows subscriptions of workers workers, one per broker measured
// by tel, may hold with handlers that take at least work: each its workers and one
// claim's worth of room, ceil(workers × max(claim, roomFloor) / work), claim being the
// quickest of its latest claims (actors/room.go). The slowest claim each broker made
// since tel was last read bounds that from above whatever the machine's load: claims of
// 75 ms on a loaded CI run gave 3 rows of room, a hoarding subscription holds its whole
// room of rows.
func roomBound(t *testing.T, tel []*telemetryBundle, workers int, work time.Duration) int {
	t.Helper()
	limit := 0
	for i, tb := range tel {
		slowest := tb.slowestSeconds(t, "rowactor.claim.duration")
		room := int(math.Ceil(float64(workers) * max(slowest, roomFloor.Seconds()) / work.Seconds()))
		t.Logf("broker %d: slowest claim %.0f ms, room at most %d", i, slowest*1000, room)
		limit += workers + room
	}
	return limit
}

// histogramMax reads the largest value recorded by an int64 histogram.
func (tb *telemetryBundle) histogramMax(t *testing.T, name string) int64 {
	t.Helper()
	return histogramMaxOf[int64](t, tb, name)
}

// histogramMaxOf reads the largest value a histogram of N named name recorded.
func histogramMaxOf[N int64 | float64](t *testing.T, tb *telemetryBundle, name string) N {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tb.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var most N
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if data, ok := m.Data.(metricdata.Histogram[N]); ok && m.Name == name {
				for _, dp := range data.DataPoints {
					if v, ok := dp.Max.Value(); ok {
						most = max(most, v)
					}
				}
			}
		}
	}
	return most
}

// slowHandlersAfterFastDoNotHoard proves that a room grown on fast handlers shrinks when
// they turn slow: a subscription then holds at most Workers plus about one row, and two
// processes with equal workers share a backlog (40–60%).
// The two processes first drain rows their handler finishes at once (the measured room
// grows), then their handler takes 100 ms (a downstream got slow, or the rows are of
// another kind). The backlog of slow rows is made claimable to both at once (both paused
// while it is published, then resumed).
func slowHandlersAfterFastDoNotHoard(t *testing.T, h *harness, _ rowactor.Form) {
	const (
		fast    = 400
		rows    = 80
		workers = 4
	)
	// Each broker's claim latencies, read per phase (delta temporality): the room a
	// subscription may take is bounded by the slowest claim it made in the slow phase.
	tel := [2]*telemetryBundle{newDeltaTelemetry(t), newDeltaTelemetry(t)}
	one, two := h.broker(tel[0].options()...), h.second(tel[1].options()...)
	var (
		slow     atomic.Bool
		handled  [2]atomic.Int64
		finished sync.Map
	)
	handler := func(i int) rowactor.Handler {
		return func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			if slow.Load() {
				handled[i].Add(1)
				time.Sleep(100 * time.Millisecond)
				finished.Store(d.ID(), true)
			}
			return rowactor.Ack()
		}
	}
	s1 := h.subscribe(one, handler(0), rowactor.Workers(workers))
	s2 := h.subscribe(two, handler(1), rowactor.Workers(workers))
	h.publish(one, fast)
	h.waitSettled(fast)

	ctx := context.Background()
	if err := s1.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s2.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	slow.Store(true)
	for _, tb := range tel {
		tb.slowestSeconds(t, "rowactor.claim.duration") // forget the fast phase's claims
	}
	h.publish(one, rows)

	peak := sampleHeld(t, h, &finished)
	if err := s1.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s2.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	// A claim in flight as a Pause began gives its rows back (released, ErrClosed): they
	// are claimed again after the Resume. Every row is acked once.
	for acked := 0; acked < rows; {
		for _, s := range h.waitSettled(1) {
			switch {
			case s.Err == nil && s.Step == "ack":
				acked++
			case s.Released && errors.Is(s.Err, rowactor.ErrClosed):
			default:
				t.Fatalf("settlement %+v", s)
			}
		}
	}
	most := peak()
	a, b := handled[0].Load(), handled[1].Load()
	t.Logf("slow phase: peak rows held %d; processes handled %d and %d", most, a, b)
	// Hoarding would hold 19 to 73 rows with claims of milliseconds.
	limit := roomBound(t, tel[:], workers, 100*time.Millisecond)
	if most > limit {
		t.Errorf("two subscriptions of %d workers with 100 ms handlers held %d rows at once; want at most %d (workers and one claim's worth of room each)", workers, most, limit)
	}
	if a+b != rows || a < rows*4/10 || b < rows*4/10 {
		t.Errorf("the two processes handled %d and %d of %d slow rows; want each 40–60%%", a, b, rows)
	}
}

// roomBacklogKeepsShortLeases proves that rows waiting in the measured room keep their
// leases: no row is handled twice and every settlement takes effect.
// Two processes with Lease(2s) first drain instant rows (the room grows), then get rows
// whose handler takes 2.4 s, longer than the lease, so rows wait in the room for several
// leases and only the renewer keeps them from another process. (With Lease(1s) a loaded
// CI machine once delayed a renewal past the half lease it has, and two rows were lost.)
func roomBacklogKeepsShortLeases(t *testing.T, h *harness, _ rowactor.Form) {
	const (
		fast    = 400
		rows    = 16
		workers = 2
	)
	one, two := h.broker(), h.second()
	var (
		slow    atomic.Bool
		mu      sync.Mutex
		calls   = map[int64]int{}
		running = map[int64]int{}
		overlap []int64
	)
	handler := func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if !slow.Load() {
			return rowactor.Ack()
		}
		mu.Lock()
		calls[d.ID()]++
		if running[d.ID()]++; running[d.ID()] > 1 {
			overlap = append(overlap, d.ID())
		}
		mu.Unlock()
		time.Sleep(2400 * time.Millisecond)
		mu.Lock()
		running[d.ID()]--
		mu.Unlock()
		return rowactor.Ack()
	}
	s1 := h.subscribe(one, handler, rowactor.Workers(workers), rowactor.Lease(2*time.Second))
	s2 := h.subscribe(two, handler, rowactor.Workers(workers), rowactor.Lease(2*time.Second))
	h.publish(one, fast)
	h.waitSettled(fast)
	ctx := context.Background()
	_ = s1.Pause(ctx)
	_ = s2.Pause(ctx)
	slow.Store(true)
	slowRows := map[int64]bool{}
	for _, id := range h.publish(one, rows) {
		slowRows[id] = true
	}
	_ = s1.Resume(ctx)
	_ = s2.Resume(ctx)
	var got []rowactor.Settlement
	deadline := time.After(45 * time.Second)
	// Only the slow rows' acks count: the fast phase waited for 400 settlements, not 400
	// acks, so a fast row settled otherwise first (under load) may be acked while this
	// loop runs, and must not stand for a slow row still in its handler.
	for acked := 0; acked < rows; {
		select {
		case s := <-h.settled:
			got = append(got, s)
			if s.Err == nil && s.Step == "ack" && slowRows[s.ID] {
				acked++
			}
		case <-deadline:
			t.Fatalf("acked fewer than %d rows in 45 s: %+v", rows, got)
		}
	}
	// Every handler of the rows has returned: a process starts a row left in its room as
	// soon as a worker frees, and calls counts it at its start, so a moment's quiet
	// shows no late settlement (a second delivery's, a release's) without waiting out a
	// second handler.
	h.quiet(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for _, s := range got {
		// A claim in flight as a Pause began gives its rows back (released, ErrClosed).
		if s.Err != nil && !(s.Released && errors.Is(s.Err, rowactor.ErrClosed)) {
			t.Errorf("settlement of row %d: %+v", s.ID, s)
		}
	}
	for id, n := range calls {
		if n != 1 {
			t.Errorf("row %d handled %d times", id, n)
		}
	}
	if len(overlap) > 0 {
		t.Errorf("rows handled twice at once: %v", overlap)
	}
}

// stuckRows is a backlog in one process whose two workers each took a row whose handler
// blocks, in the middle of rows its handler acks at once: its measured room (grown on
// the instant rows) holds the rows claimed ahead of the blocked workers.
type stuckRows struct {
	ids     []int64
	slow    map[int64]bool
	unblock func()
}

// stickWorkers publishes rows rows on b's table, subscribes b with two workers, and
// returns once both workers are blocked in a slow row's handler. The slow rows' handlers
// return Ack once unblock is called (at cleanup at the latest).
func stickWorkers(t *testing.T, h *harness, b *rowactor.Broker, rows int) *stuckRows {
	const workers = 2
	ids := h.publish(b, rows)
	r := &stuckRows{ids: ids, slow: map[int64]bool{ids[rows/2]: true, ids[rows/2+1]: true}}
	stuck := make(chan int64, workers)
	block := make(chan struct{})
	var once sync.Once
	r.unblock = func() { once.Do(func() { close(block) }) }
	t.Cleanup(r.unblock)
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if r.slow[d.ID()] {
			stuck <- d.ID()
			<-block
		}
		return rowactor.Ack()
	}, rowactor.Workers(workers))
	for range workers {
		select {
		case <-stuck:
		case <-time.After(15 * time.Second):
			t.Fatalf("the slow rows did not both start in 15 s\nlogs:\n%s", h.logs.String())
		}
	}
	return r
}

// stickAndGiveBack sticks b's two workers (stickWorkers, 400 rows) with hold run on the
// goroutine of each row the measured room then gives back, before its release, and
// returns once the first give-back began, with that row's id.
func stickAndGiveBack(t *testing.T, h *harness, b *rowactor.Broker, hold func(id int64)) (*stuckRows, int64) {
	t.Helper()
	giving := make(chan int64, 256)
	onGiveBack(t, h.table.Name, func(id int64) {
		giving <- id
		hold(id)
	})
	stuck := stickWorkers(t, h, b, 400)
	select {
	case id := <-giving:
		return stuck, id
	case <-time.After(15 * time.Second):
		t.Fatalf("no row was given back in 15 s with both workers stuck\nlogs:\n%s", h.logs.String())
		return nil, 0
	}
}

// giveBackHooks holds, by table name, what a test does as the measured room gives a row
// back (testhook.BeforeGiveBack, installed once for every test of the package).
var (
	giveBackHooks       sync.Map // table name → func(id int64)
	installGiveBackHook sync.Once
)

// onGiveBack runs fn on the goroutine of each row of table given back by the measured
// room, before its release.
func onGiveBack(t *testing.T, table string, fn func(id int64)) {
	installGiveBackHook.Do(func() {
		hook := func(table string, id int64) {
			if fn, ok := giveBackHooks.Load(table); ok {
				fn.(func(int64))(id)
			}
		}
		testhook.BeforeGiveBack.Store(&hook)
	})
	giveBackHooks.Store(table, fn)
	t.Cleanup(func() { giveBackHooks.Delete(table) })
}

// stuckWorkersGiveWaitingRowsBack proves that a process does not hoard the rows of its
// measured room when every one of its workers gets stuck on a long handler: it gives them
// back (released, their attempt returned), claims none ahead while its workers stay stuck,
// and another process with free workers handles them while the long handlers still run.
// One process drains instant rows (its room grows to tens of rows) until its two workers
// each take a row whose handler blocks; a second process subscribes then. An advisory
// subscription on a server keeps no room (a waiting row would hold a connection): it has
// nothing to give back, and the second process takes the rest as they come.
func stuckWorkersGiveWaitingRowsBack(t *testing.T, h *harness, form rowactor.Form) {
	const rows = 400
	one, two := h.broker(), h.second()
	r := stickWorkers(t, h, one, rows)
	slow := r.slow
	h.subscribe(two, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() },
		rowactor.Workers(2))

	acks := map[int64]int{}
	var given []int64
	deadline := time.After(15 * time.Second)
	for len(acks) < rows-len(slow) {
		select {
		case s := <-h.settled:
			switch {
			case s.Err == nil && s.Step == "ack" && !slow[s.ID]:
				acks[s.ID]++
				if s.Attempt != 1 {
					t.Errorf("row %d was acked at attempt %d; want 1 (a row given back unstarted keeps its attempt)", s.ID, s.Attempt)
				}
			case s.Err == nil && s.Released && s.Step == "release":
				given = append(given, s.ID)
			default:
				t.Fatalf("settlement %+v", s)
			}
		case <-deadline:
			t.Fatalf("with both workers of one process stuck, %d of %d other rows were acked in 15 s (%d given back); "+
				"the rest stayed in the stuck process's room\nlogs:\n%s", len(acks), rows-len(slow), len(given), h.logs.String())
		}
	}
	noRoom := form == rowactor.FormAdvisory && h.drv.keyLocked != nil
	switch {
	case noRoom && len(given) > 0:
		t.Fatalf("an advisory subscription on a server gave back %d waiting rows; its room should hold none", len(given))
	case !noRoom && len(given) == 0:
		t.Fatalf("the process whose workers were stuck gave no waiting row back; its room held none?")
	}
	// Having given rows back, the stuck process claims none ahead until a worker frees:
	// no row goes back to it, and then back to the table, twice.
	for i, id := range given {
		if slices.Contains(given[:i], id) {
			t.Errorf("row %d was given back twice: the stuck process claimed it again while its workers stayed stuck", id)
		}
	}
	// The slow rows are all the table holds: held by the stuck process (leased, or their
	// keys locked), their one claim counted.
	if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name); n != len(slow) {
		t.Fatalf("%d rows left while the slow handlers run; want the %d slow rows", n, len(slow))
	}
	for id := range slow {
		st := h.row(id)
		leased := st.lockedUntil != nil && st.lockedUntil.After(time.Now())
		if want := attemptColumn(form, 1, 0); !st.exists || st.attempt != want || leased != (form == rowactor.FormLease) {
			t.Errorf("slow row %d while its handler runs: %+v; want held, attempt %d", id, st, want)
		}
	}
	r.unblock()
	for _, s := range h.waitSettled(len(slow)) {
		if s.Err != nil || s.Step != "ack" || !slow[s.ID] {
			t.Fatalf("settlement %+v; want the slow rows' acks", s)
		}
	}
	for id, n := range acks {
		if n != 1 {
			t.Errorf("row %d acked %d times", id, n)
		}
	}
	if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name); n != 0 {
		t.Fatalf("%d rows left after every ack", n)
	}
	t.Logf("the stuck process gave %d waiting rows back", len(given))
}

// workersThatKeepFreeingKeepTheirRoom proves that rows claimed ahead while handlers were
// fast stay with a process whose workers keep freeing, however slowly: only workers that
// all stay busy give rows back. One process drains a backlog whose second half takes
// 80 ms a row; the room grown on the first half holds up to 192 rows as the handlers turn
// slow, and the last of them wait about two seconds for a worker (eight workers finish a
// slow row every 10 ms), longer than the poll of 500 ms that a waiting row is given back
// after when no worker frees.
func workersThatKeepFreeingKeepTheirRoom(t *testing.T, h *harness, _ rowactor.Form) {
	const (
		fast    = 400
		slow    = 240
		workers = 8
	)
	b := h.broker()
	ids := h.publish(b, fast+slow)
	slowFrom := ids[fast]
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if d.ID() >= slowFrom {
			time.Sleep(80 * time.Millisecond)
		}
		return rowactor.Ack()
	}, rowactor.Workers(workers), rowactor.PollInterval(500*time.Millisecond))
	for _, s := range h.waitSettledWithin(fast+slow, 60*time.Second) {
		if s.Err != nil || s.Step != "ack" || s.Attempt != 1 {
			t.Errorf("settlement %+v; want every row acked at its first attempt, none given back", s)
		}
	}
	if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name); n != 0 {
		t.Fatalf("%d rows left after every ack", n)
	}
}
