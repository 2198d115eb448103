package settler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// lockedQueue is a lease batch queue whose rows another session holds: the batched
// statement reports them busy, and the waiting statement waits until its context ends.
type lockedQueue struct {
	dialects.LeaseBatchQueue
	waiting chan struct{} // closed once a waiting statement runs
	once    sync.Once
	cut     chan error // the waiting statement's end
}

func (q *lockedQueue) SettleLeases(_ context.Context, _ dialects.StepKind, _ time.Time, held []dialects.Lease) ([]int64, error) {
	return nil, &dialects.RowsBusyError{IDs: dialects.IDs(held)}
}

func (q *lockedQueue) SettleLeaseWaiting(ctx context.Context, _ dialects.Step, _ dialects.Lease) (bool, error) {
	q.once.Do(func() { close(q.waiting) })
	<-ctx.Done()
	q.cut <- ctx.Err()
	return false, ctx.Err()
}

// heldLease is a lease in a book of one; its token is token, or the Unix second 1.
type heldLease struct {
	mu           sync.Mutex
	id           int64
	token        time.Time
	pinned, done bool
}

func (h *heldLease) ID() int64 { return h.id }
func (h *heldLease) Pin() (dialects.Lease, bool, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pinned || h.done {
		return dialects.Lease{}, false, false
	}
	h.pinned = true
	if h.token.IsZero() {
		return dialects.Lease{ID: h.id, Token: time.Unix(1, 0)}, false, true
	}
	return dialects.Lease{ID: h.id, Token: h.token}, false, true
}
func (h *heldLease) Unpin() { h.mu.Lock(); h.pinned = h.done; h.mu.Unlock() }
func (h *heldLease) Done()  { h.mu.Lock(); h.pinned, h.done = true, true; h.mu.Unlock() }
func (h *heldLease) isDone() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done
}

// The batcher's settlements whose rows another session holds (the busy lane's waiter, and
// the requests queued behind it) end with its waits, as ErrClosed, their leases out of
// the book to run out; one that comes after the waits ended is refused at once.
func TestBatcherEndsItsWaitsForLockedRows(t *testing.T) {
	waits, stop := context.WithCancel(context.Background())
	q := &lockedQueue{waiting: make(chan struct{}), cut: make(chan error, 1)}
	b := NewBatcher(waits, q, 8, time.Minute, true)
	step := dialects.Step{Kind: dialects.StepAck, Now: time.Now()}
	leases := []*heldLease{{id: 1}, {id: 2}, {id: 3}}
	errs := make(chan error, len(leases))
	for _, l := range leases {
		go func() { errs <- b.Settle(context.Background(), nil, step, l) }()
	}
	select {
	case <-q.waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("no settlement waited for its row")
	}
	stop()
	for range leases {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("settlement: %v, want ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a settlement still waited after the waits ended")
		}
	}
	if err := <-q.cut; !errors.Is(err, context.Canceled) {
		t.Errorf("the waiting statement ended with %v, want its context cancelled", err)
	}
	for _, l := range leases {
		if !l.isDone() {
			t.Errorf("lease %d is still in the book", l.id)
		}
	}
	late := &heldLease{id: 4}
	if err := b.Settle(context.Background(), nil, step, late); !errors.Is(err, ErrClosed) || !late.isDone() {
		t.Errorf("settlement after the waits ended: %v (lease done: %v), want ErrClosed", err, late.isDone())
	}
}

// settlingQueue settles every row it is given, each batch after a pause, and counts how
// often it saw each row.
type settlingQueue struct {
	dialects.LeaseBatchQueue
	pause time.Duration
	mu    sync.Mutex
	seen  map[int64]int
}

func (q *settlingQueue) SettleLeases(_ context.Context, _ dialects.StepKind, _ time.Time, held []dialects.Lease) ([]int64, error) {
	time.Sleep(q.pause)
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, l := range held {
		q.seen[l.ID]++
	}
	return dialects.IDs(held), nil
}

// Every settlement is answered once and its row written once, whoever leads: batches
// slower than slowBatch hand the lead on while they run, and each caller's request room
// is its own (a room used twice is replaced, not reused).
func TestBatcherAnswersEverySettlementOnceAcrossLeadHandOffs(t *testing.T) {
	q := &settlingQueue{pause: slowBatch + 20*time.Millisecond, seen: map[int64]int{}}
	b := NewBatcher(context.Background(), q, 4, time.Minute, true)
	step := dialects.Step{Kind: dialects.StepAck, Now: time.Now()}
	const n = 24
	rooms := make([]BatchRequest, n)
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- b.Settle(context.Background(), &rooms[i], step, &heldLease{id: int64(i + 1)}) }()
	}
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				t.Errorf("settlement: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a settlement was never answered")
		}
	}
	// A room used before: the settlement still runs and is answered.
	again := &heldLease{id: n + 1}
	if err := b.Settle(context.Background(), &rooms[0], step, again); err != nil || !again.isDone() {
		t.Fatalf("a settlement in a used room: %v (lease done %v)", err, again.isDone())
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for id := int64(1); id <= n+1; id++ {
		if q.seen[id] != 1 {
			t.Errorf("row %d written %d times, want once", id, q.seen[id])
		}
	}
}

// recordingQueue settles every row and records the rows of each batch, in order.
type recordingQueue struct {
	dialects.LeaseBatchQueue
	mu      sync.Mutex
	batches [][]int64
}

func (q *recordingQueue) SettleLeases(_ context.Context, _ dialects.StepKind, _ time.Time, held []dialects.Lease) ([]int64, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.batches = append(q.batches, dialects.IDs(held))
	return dialects.IDs(held), nil
}

func (q *recordingQueue) runs() [][]int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([][]int64(nil), q.batches...)
}

// lingerBatcher is a batcher whose leader waits as long as settlements are coming.
func lingerBatcher(waits context.Context) (*Batcher, *recordingQueue) {
	q := &recordingQueue{}
	b := NewBatcher(waits, q, 8, time.Minute, true)
	b.lingerFor = time.Hour
	return b, q
}

func settleAsync(b *Batcher, room *BatchRequest, id int64) <-chan error {
	done := make(chan error, 1)
	step := dialects.Step{Kind: dialects.StepAck, Now: time.Now()}
	go func() { done <- b.Settle(context.Background(), room, step, &heldLease{id: id}) }()
	return done
}

func answered(t *testing.T, what string, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: never answered", what)
	}
}

// A leader waits for the settlements of the rows its subscription expects (Expect) and
// runs them as one batch; the last of them wakes it.
func TestBatcherLeaderWaitsForExpectedSettlements(t *testing.T) {
	b, q := lingerBatcher(context.Background())
	rooms := make([]BatchRequest, 3)
	for i := range rooms {
		b.Expect(&rooms[i])
	}
	first := settleAsync(b, &rooms[0], 1)
	waitFor(t, "the first settlement to lead", func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.lingering != nil })
	second, third := settleAsync(b, &rooms[1], 2), settleAsync(b, &rooms[2], 3)
	for i, d := range []<-chan error{first, second, third} {
		answered(t, fmt.Sprintf("settlement %d", i+1), d)
	}
	if runs := q.runs(); len(runs) != 1 || len(runs[0]) != 3 {
		t.Fatalf("batches %v; want the three rows in one", runs)
	}
}

// An expected row whose settlement joins no batch (Arrive) and a backlog that empties
// (SetBacklog) wake a waiting leader too; the waits' end does as well.
func TestBatcherLeaderStopsWaitingWhenNothingIsComing(t *testing.T) {
	b, q := lingerBatcher(context.Background())
	var lone, gone BatchRequest
	b.Expect(&lone)
	b.Expect(&gone)
	b.SetBacklog(1)
	done := settleAsync(b, &lone, 1)
	waitFor(t, "the settlement to lead", func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.lingering != nil })
	b.Arrive(&gone)
	b.SetBacklog(0)
	answered(t, "the lone settlement", done)
	if runs := q.runs(); len(runs) != 1 || len(runs[0]) != 1 {
		t.Fatalf("batches %v; want the lone row's", runs)
	}

	waits, stop := context.WithCancel(context.Background())
	b, _ = lingerBatcher(waits)
	b.SetBacklog(5)
	done = settleAsync(b, nil, 1)
	waitFor(t, "the settlement to lead", func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.lingering != nil })
	stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a leader still waited after the waits ended")
	}
}

// Nothing expected: a settlement runs at once, alone.
func TestBatcherLoneSettlementDoesNotWait(t *testing.T) {
	b, q := lingerBatcher(context.Background())
	answered(t, "the settlement", settleAsync(b, nil, 1))
	if runs := q.runs(); len(runs) != 1 {
		t.Fatalf("batches %v; want one", runs)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A batcher made without linger (FIFO groups, partition keys) runs a settlement at once
// even while others are expected.
func TestBatcherWithoutLingerRunsAtOnce(t *testing.T) {
	q := &recordingQueue{}
	b := NewBatcher(context.Background(), q, 8, time.Minute, false)
	var first, other BatchRequest
	b.Expect(&first)
	b.Expect(&other)
	b.SetBacklog(3)
	answered(t, "the settlement", settleAsync(b, &first, 1))
	if runs := q.runs(); len(runs) != 1 || len(runs[0]) != 1 {
		t.Fatalf("batches %v; want the row's own", runs)
	}
}

// fencedQueue settles a row only with its current token, once; rows in locked are held by
// another session: the batched statement reports them busy, and the waiting statement
// waits until its context ends.
type fencedQueue struct {
	dialects.LeaseBatchQueue
	mu      sync.Mutex
	current map[int64]time.Time
	locked  map[int64]bool
	settled map[int64]bool
}

func (q *fencedQueue) SettleLeases(_ context.Context, _ dialects.StepKind, _ time.Time, held []dialects.Lease) ([]int64, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var ok, busy []int64
	for _, l := range held {
		switch {
		case q.locked[l.ID]:
			busy = append(busy, l.ID)
		case !q.settled[l.ID] && q.current[l.ID].Equal(l.Token):
			q.settled[l.ID] = true
			ok = append(ok, l.ID)
		}
	}
	if len(busy) > 0 {
		return ok, &dialects.RowsBusyError{IDs: busy}
	}
	return ok, nil
}

func (q *fencedQueue) SettleLeaseWaiting(ctx context.Context, _ dialects.Step, _ dialects.Lease) (bool, error) {
	<-ctx.Done()
	return false, ctx.Err()
}

func (q *fencedQueue) unlock(id int64) {
	q.mu.Lock()
	q.locked[id] = false
	q.mu.Unlock()
}

// A row's stale settlement (an earlier delivery's token) and its current one, both queued
// in the busy lane while another session holds the row, are told apart when the row is
// let go: the current one settles, the stale one learns its lease is lost. One statement
// answers its rows by id, so it names each row once, as a batch does.
func TestBusyLaneTellsAStaleSettlementOfARowItsLeaseIsLost(t *testing.T) {
	stale, current := time.Unix(100, 0), time.Unix(200, 0)
	q := &fencedQueue{current: map[int64]time.Time{1: current, 9: stale},
		locked: map[int64]bool{1: true, 9: true}, settled: map[int64]bool{}}
	waits, end := context.WithCancel(context.Background())
	defer end()
	b := NewBatcher(waits, q, 8, time.Minute, false)
	ack := dialects.Step{Kind: dialects.StepAck, Now: time.Now()}
	settle := func(l *heldLease) <-chan error {
		done := make(chan error, 1)
		go func() { done <- b.Settle(context.Background(), nil, ack, l) }()
		return done
	}
	waiter := settle(&heldLease{id: 9, token: stale}) // the lane's waiter: row 9 stays held
	waitFor(t, "the lane's waiter", func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.waiting })
	staleDone := settle(&heldLease{id: 1, token: stale})
	waitFor(t, "the stale settlement in the lane", func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.busy) == 1 })
	currentDone := settle(&heldLease{id: 1, token: current})
	waitFor(t, "both settlements of row 1 in the lane", func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.busy) == 2 })
	q.unlock(1)
	if err := <-staleDone; !errors.Is(err, ErrLeaseLost) {
		t.Errorf("the stale settlement of row 1: %v; want ErrLeaseLost", err)
	}
	if err := <-currentDone; err != nil {
		t.Errorf("the current settlement of row 1: %v; want nil", err)
	}
	if !q.settled[1] {
		t.Error("row 1 is not settled")
	}
	end()
	<-waiter
}

// Settlements of one row that another session holds for good take turns in the busy lane
// (one per statement), and each is still answered once it has waited the batcher's
// timeout: a turn skipped counts as time waited.
func TestBusyLaneAnswersEverySettlementOfAHeldRowWithinTheTimeout(t *testing.T) {
	q := &fencedQueue{current: map[int64]time.Time{1: time.Unix(1, 0)}, locked: map[int64]bool{1: true}, settled: map[int64]bool{}}
	waits, end := context.WithCancel(context.Background())
	defer end()
	const timeout = 200 * time.Millisecond
	b := NewBatcher(waits, q, 8, timeout, false)
	ack := dialects.Step{Kind: dialects.StepAck, Now: time.Now()}
	start := time.Now()
	done := make(chan error, 20)
	for i := 0; i < cap(done); i++ {
		go func() {
			done <- b.Settle(context.Background(), nil, ack, &heldLease{id: 1, token: time.Unix(int64(i+2), 0)})
		}()
	}
	for i := 0; i < cap(done); i++ {
		if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a settlement of the held row: %v, want DeadlineExceeded", err)
		}
	}
	// The lane looks every busyPoll: the last answer comes within a few of them past the
	// timeout, not one turn per request later (20 requests took over a second).
	if took := time.Since(start); took > timeout+4*busyPoll {
		t.Errorf("the last of 20 settlements was answered after %v; want within %v", took, timeout+4*busyPoll)
	}
}

// answerLog is an Answered per request that counts how often it was told, and whether
// on a leader the batcher spawned (here).
type answerLog struct {
	mu    sync.Mutex
	told  map[int64]int
	here  int
	reqs  map[int64]*BatchRequest
	total chan struct{} // one value per telling
}

type answerOf struct {
	log *answerLog
	id  int64
}

func (a answerOf) BatchAnswered(here bool) {
	a.log.mu.Lock()
	a.log.told[a.id]++
	if here {
		a.log.here++
	}
	a.log.mu.Unlock()
	a.log.total <- struct{}{}
}

// Queued settlements (Queue) park no goroutine: Queue returns while the batch that takes
// the request still runs, and each request is told its answer exactly once, by the
// leader the batcher spawned for its batch (here) or by the one a slow batch handed the
// lead to. Settlements that wait (Settle) mixed in among them get the lead or their
// answer too, whichever kind of request a batch hands the lead to.
func TestBatcherQueuedSettlementsAreToldTheirAnswersOnceWithNoGoroutineWaiting(t *testing.T) {
	q := &settlingQueue{pause: slowBatch + 20*time.Millisecond, seen: map[int64]int{}}
	b := NewBatcher(context.Background(), q, 4, time.Minute, true)
	var spawned sync.WaitGroup
	var leaders int
	var leadersMu sync.Mutex
	b.SpawnLeadersWith(func(f func()) {
		leadersMu.Lock()
		leaders++
		leadersMu.Unlock()
		spawned.Add(1)
		go func() { defer spawned.Done(); f() }()
	})
	step := dialects.Step{Kind: dialects.StepAck, Now: time.Now()}
	const queued, waiting = 20, 4
	log := &answerLog{told: map[int64]int{}, reqs: map[int64]*BatchRequest{}, total: make(chan struct{}, queued)}
	start := time.Now()
	errs := make(chan error, waiting)
	for i := range queued + waiting {
		id := int64(i + 1)
		if i%6 == 5 {
			go func() { errs <- b.Settle(context.Background(), nil, step, &heldLease{id: id}) }()
			continue
		}
		req := new(BatchRequest)
		log.reqs[id] = req
		b.Queue(req, step, &heldLease{id: id}, answerOf{log, id})
	}
	if took := time.Since(start); took > slowBatch {
		t.Errorf("queueing %d settlements took %v: Queue waited for a batch", queued, took)
	}
	for range queued {
		select {
		case <-log.total:
		case <-time.After(30 * time.Second):
			t.Fatal("a queued settlement was never told its answer")
		}
	}
	for range waiting {
		select {
		case err := <-errs:
			if err != nil {
				t.Errorf("waiting settlement: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a waiting settlement was never answered")
		}
	}
	spawned.Wait()
	log.mu.Lock()
	defer log.mu.Unlock()
	for id, req := range log.reqs {
		if log.told[id] != 1 {
			t.Errorf("request %d told %d times, want once", id, log.told[id])
		}
		if err := req.Answer(); err != nil {
			t.Errorf("request %d answered %v, want nil", id, err)
		}
	}
	if log.here == 0 {
		t.Error("no queued settlement was told on a leader the batcher spawned")
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for id := int64(1); id <= queued+waiting; id++ {
		if q.seen[id] != 1 {
			t.Errorf("row %d written %d times, want once", id, q.seen[id])
		}
	}
	t.Logf("%d leaders spawned for %d requests in batches of 4", leaders, queued+waiting)
}
