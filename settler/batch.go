package settler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// Batcher gathers the lease form's acks and releases and writes them in one token-fenced
// statement per kind: a group commit with no goroutine and no timer of its own. A
// settlement that finds no batch running runs one at once, on its caller's goroutine
// (the leader); those that arrive meanwhile queue, and when the leader's batch is done it
// hands the lead to the first of them, which runs them all as the next batch. Under
// light load each settlement runs alone, as without a batcher; under heavy load the
// batches grow with the database's latency, and the commits per message fall. A row
// whose token no longer matches is reported ErrLeaseLost and left alone.
type Batcher struct {
	q       dialects.LeaseBatchQueue
	timeout time.Duration
	max     int
	// waits ends the waits for rows other sessions hold (see NewBatcher).
	waits context.Context

	mu      sync.Mutex
	pending []*batchReq
	leading bool // a goroutine runs batches, or has been handed the lead
	// running counts batches whose statements run: a long one hands the lead on (watch),
	// but no more than maxRunning run at once.
	running int
	// busy are requests whose rows another session held when their batch ran, for the
	// busy lane (queueBusy); laneRunning says its goroutine runs, waiting that its waiter
	// does.
	busy        []*batchReq
	laneRunning bool
	waiting     bool
	// expected counts the handlers running whose settlement may join a batch (Expect);
	// lingering, while a leader waits for them (linger), is closed to wake it.
	expected  int
	lingering chan struct{}
	// backlog is how many claimed rows wait for a worker (SetBacklog): their
	// settlements come too.
	backlog int
	// lingerFor is lingerMax, or 0 when the batcher does not linger (a test's own
	// otherwise).
	lingerFor time.Duration
	// spawn runs a leader of queued settlements (Queue) on a goroutine that has nothing
	// else to do; leadQueued is that leader, made once.
	spawn      func(func())
	leadQueued func()
}

type batchReq struct {
	now   time.Time
	lease HeldLease
	held  dialects.Lease // the token, pinned when the request joins a batch
	// busySince is when its batch found the row held by another session (queueBusy).
	busySince time.Time
	err       error
	// answered is set once err is. The request's goroutine waits on signal for either:
	// its answer (done), or the lead (leads, a hand-off to it). One leads at a time, so at
	// most one hand-off waits there, and only before the answer (an answer comes from the
	// leader, which is then the request's own goroutine). The signal lives in the request,
	// which its caller made: a channel per settlement was an allocation per row, and 3 %
	// of the CPU of a SQLite drain.
	answered atomic.Bool
	used     bool
	// collect says the leader whose batch took the request tells its Answered (deliver),
	// not finish: set as a batch takes it, cleared when the busy lane takes it over.
	collect bool
	// kind is the batch's step (a retry's is a release); stepKind the request's own.
	kind, stepKind dialects.StepKind
	done           bool
	leads          int32
	sigMu          sync.Mutex
	signal         sync.Cond
	// then, for a settlement queued without a goroutine waiting (Queue), is told the
	// answer.
	then Answered
}

// BatchRequest is the room a settlement takes in its batch, made by the caller so that
// it lives as long as the caller's delivery: a batch may read a request after answering
// it, so a request is never used twice.
type BatchRequest struct {
	r batchReq
	// expected says the request's handler counts in the batcher's expected (Expect).
	expected atomic.Bool
}

// lingerMax bounds how long a leader waits for the settlements of handlers still
// running before it runs its batch (linger).
const lingerMax = time.Millisecond

// Expect says req's handler starts: its settlement may join a batch soon, and a leader
// waits for it a little (linger) instead of running a batch of a few rows. Each Expect
// ends with req's Settle or with Arrive, whichever comes first.
func (b *Batcher) Expect(req *BatchRequest) {
	if !req.expected.CompareAndSwap(false, true) {
		return
	}
	b.mu.Lock()
	b.expected++
	b.mu.Unlock()
}

// Arrive ends req's Expect, if Settle did not: its handler ended, and its settlement
// joins no batch (another step, a release at a stop, a panic).
func (b *Batcher) Arrive(req *BatchRequest) {
	if !req.expected.CompareAndSwap(true, false) {
		return
	}
	b.mu.Lock()
	b.expected--
	b.wakeLinger()
	b.mu.Unlock()
}

// SetBacklog says how many claimed rows wait for a worker: a leader waits for their
// settlements too (linger).
func (b *Batcher) SetBacklog(n int) {
	b.mu.Lock()
	b.backlog = n
	b.wakeLinger()
	b.mu.Unlock()
}

// coming is how many settlements a leader may wait for, under b.mu.
func (b *Batcher) coming() int { return b.expected + b.backlog }

// wakeLinger wakes a lingering leader, under b.mu, once no expected settlement is left
// or the batch is full.
func (b *Batcher) wakeLinger() {
	if b.lingering != nil && (b.coming() <= 0 || len(b.pending) >= b.max) {
		close(b.lingering)
		b.lingering = nil
	}
}

// linger, under b.mu (released meanwhile), waits up to lingerMax for the settlements of
// handlers still running, while the next batch has room for them: with fast handlers a
// batch then takes many rows in one statement and one commit instead of a few. A
// settlement waits no longer than that for it; a lone row, with no handler running
// beside it, does not wait.
//
// What it must not break: the leader holds no pool connection and no worker while it
// waits (workers are given back before the settlement), so claims, and a free worker's
// due row, never wait for it; every Expect ends exactly once (Settle or Arrive), or
// leaders would wait lingerMax on every batch.
func (b *Batcher) linger() {
	if b.lingerFor <= 0 || b.coming() <= 0 || len(b.pending) >= b.max || b.waits.Err() != nil {
		return
	}
	wake := make(chan struct{})
	b.lingering = wake
	b.mu.Unlock()
	t := time.NewTimer(b.lingerFor)
	select {
	case <-wake:
	case <-t.C:
	case <-b.waits.Done():
	}
	t.Stop()
	b.mu.Lock()
	if b.lingering == wake {
		b.lingering = nil
	}
}

// finish answers r: its err is set.
func (r *batchReq) finish() {
	r.answered.Store(true)
	r.sigMu.Lock()
	r.done = true
	r.sigMu.Unlock()
	r.signal.Signal()
	if r.then != nil && !r.collect {
		r.then.BatchAnswered(false) // the busy lane, or the waits' end: not a leader
	}
}

// handLead tells r's goroutine to lead.
func (r *batchReq) handLead() {
	r.sigMu.Lock()
	r.leads++
	r.sigMu.Unlock()
	r.signal.Signal()
}

// await waits for r's answer or a hand-off of the lead, and reports whether it is the
// lead: a hand-off, which always comes before the answer, is taken first.
func (r *batchReq) await() (lead bool) {
	r.sigMu.Lock()
	defer r.sigMu.Unlock()
	for r.leads == 0 && !r.done {
		r.signal.Wait()
	}
	if r.leads > 0 {
		r.leads--
		return true
	}
	return false
}

// Batchable says whether a step can join a batch: acks, retries and releases (one
// statement shape for every row). RetryAfter and snoozes carry a time per row, a step
// with an error its text; they, dead-letter moves and the service's own events run alone,
// and so do the ack and release of a row whose handler never started (Step.Unstarted),
// which also give back the attempt its claim counted.
func Batchable(step dialects.Step) bool {
	if step.Event != "" || step.Error != "" || step.Unstarted {
		return false
	}
	switch step.Kind {
	case dialects.StepAck, dialects.StepRetry, dialects.StepRelease:
		return true
	}
	return false
}

// NewBatcher returns a batcher whose batches hold at most max rows, each statement
// bounded by timeout. When waits ends (its subscription stops: Shutdown's context ended)
// no settlement waits any longer for a row another session holds: the busy lane's waiting
// statement is cut short, which changes nothing (SettleLeaseWaiting), and every request
// whose row is held, queued or to come, is answered ErrClosed at once, its lease left to
// run out (its token fences it). Batched statements, which wait for no row lock on
// PostgreSQL and MariaDB, get stopGrace to end (statementCtx).
//
// With linger, a leader waits a little for the settlements its subscription expects
// (Expect, SetBacklog). A subscription whose next row waits for a settlement (FIFO
// groups, partition keys) must not linger: its rows would each wait the longest.
func NewBatcher(waits context.Context, q dialects.LeaseBatchQueue, max int, timeout time.Duration, linger bool) *Batcher {
	b := &Batcher{q: q, timeout: timeout, max: max, waits: waits}
	b.leadQueued = b.leadOnce
	if linger {
		b.lingerFor = lingerMax
	}
	context.AfterFunc(waits, b.endWaits)
	return b
}

// Settle runs a batchable step for lease with the next batch, and returns when that batch
// ran: nil, ErrLeaseLost when the row held another token, or the batch's error. req is
// the request's room, the caller's (nil or used before: Settle makes one). The
// lease stays in its book, renewed, while the step waits: its token is pinned only when
// the batch that runs it is built. The batch's own timeout bounds its statement, and a
// wait for a row another session holds ends with the batcher's waits (NewBatcher),
// reported ErrClosed; ctx is not consulted once the step queued.
func (b *Batcher) Settle(_ context.Context, req *BatchRequest, step dialects.Step, lease HeldLease) error {
	arrived := req != nil && req.expected.CompareAndSwap(true, false)
	if req == nil || req.r.used {
		req = new(BatchRequest) // none, or used already: a batch may still read it
	}
	r := b.prepare(&req.r, step, lease)
	if b.join(r, arrived) {
		b.lead(r)
	}
	// The lead may come to r more than once: a leader whose batch ran long handed it on
	// (see watch) possibly to r itself, still queued behind that batch.
	for r.await() {
		b.lead(r)
	}
	return wrapBatch(step, r.held, r.err)
}

// Answered is told the answer of a settlement queued with Queue.
type Answered interface {
	// BatchAnswered is called once the request's answer is set (BatchRequest.Answer).
	// here says the caller is a leader the batcher spawned (SpawnLeadersWith), on a
	// goroutine with nothing else to do, which may finish the settlement itself; otherwise
	// it must be handed to a goroutine of its own, and soon: the caller may be a leader
	// with batches still to run, or the busy lane.
	BatchAnswered(here bool)
}

// SpawnLeadersWith makes spawn run the leaders of queued settlements (Queue): a
// dispatcher's Schedule, whose goroutines then finish the settlements they answered
// (Answered). Without it, each leader is a goroutine of its own.
func (b *Batcher) SpawnLeadersWith(spawn func(func())) { b.spawn = spawn }

// Queue runs a batchable step for lease with the next batch, as Settle does, without
// waiting for it: then is told once its answer is set (Answered), and req.Answer reads
// it. req must not have been used (Used). No goroutine parks on the settlement: with a
// batch of a hundred rows, Settle woke a hundred goroutines after its statement, each
// for a few microseconds of work.
//
// What it must not break: every request is answered exactly once, by one batch, the busy
// lane or the waits' end (NewBatcher), and then told exactly once; a leader is running
// or handed the lead whenever a request is pending (nextLeader); the lease stays in its
// book, renewed, until its batch pins it.
func (b *Batcher) Queue(req *BatchRequest, step dialects.Step, lease HeldLease, then Answered) {
	b.Prepare(req, step, lease, then)
	b.Enqueue(req)
}

// Prepare fills req, which must not have been used (Used), for step on lease, and marks
// it used; Enqueue queues it. Between the two, a caller can decide, with everything the
// request holds already written, whether it queues it at all (a delivery's stop may come
// first): a request prepared and never queued is left alone.
func (b *Batcher) Prepare(req *BatchRequest, step dialects.Step, lease HeldLease, then Answered) {
	if req.r.used {
		panic("settler: Prepare of a used BatchRequest") // a batch may still read it
	}
	b.prepare(&req.r, step, lease).then = then
}

// Enqueue queues a request Prepare filled, as Queue does.
func (b *Batcher) Enqueue(req *BatchRequest) {
	if b.join(&req.r, req.expected.CompareAndSwap(true, false)) {
		b.spawnLeader()
	}
}

// join queues r for the next batch (arrived: its Expect ends here), and reports whether
// its caller is to lead, no batch running or handed the lead.
func (b *Batcher) join(r *batchReq, arrived bool) (leader bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending = append(b.pending, r)
	if arrived {
		b.expected--
	}
	b.wakeLinger()
	leader = !b.leading
	b.leading = true
	return leader
}

// Step is the kind of the step the request was prepared for (Prepare).
func (req *BatchRequest) Step() dialects.StepKind { return req.r.stepKind }

// Used says the request took its room in a batch already: a batch may still read it, and
// it cannot be queued (Queue).
func (req *BatchRequest) Used() bool { return req.r.used }

// prepare fills r for step on lease.
func (b *Batcher) prepare(r *batchReq, step dialects.Step, lease HeldLease) *batchReq {
	kind := step.Kind
	if kind == dialects.StepRetry {
		kind = dialects.StepRelease // the lease form's retry clears the lease: the claim counted
	}
	r.kind, r.stepKind, r.now, r.lease, r.held = kind, step.Kind, step.Now, lease, dialects.Lease{ID: lease.ID()}
	r.used = true
	r.signal.L = &r.sigMu
	return r
}

// Answer waits for the answer of a request queued with Queue, and returns it: nil,
// ErrLeaseLost when the row held another token, or the batch's error.
func (req *BatchRequest) Answer() error {
	r := &req.r
	r.sigMu.Lock()
	for !r.done {
		r.signal.Wait()
	}
	r.sigMu.Unlock()
	return wrapBatch(dialects.Step{Kind: r.stepKind}, r.held, r.err)
}

// spawnLeader starts a leader of queued settlements.
func (b *Batcher) spawnLeader() {
	if b.spawn != nil {
		b.spawn(b.leadQueued)
		return
	}
	go b.leadQueued()
}

// leadOnce, a leader the batcher spawned, runs one batch, hands the lead on, and then
// finishes the batch's queued settlements here (deliver): the next batch runs meanwhile
// on another goroutine.
func (b *Batcher) leadOnce() {
	batch, handed := b.runBatch()
	var (
		next  *batchReq
		spawn bool
	)
	if !handed {
		next, spawn = b.nextLeader()
	}
	b.mu.Unlock()
	b.handTo(next, spawn)
	b.deliver(batch, true)
}

// runBatch runs the next batch: it waits a little for the settlements coming (linger),
// takes the batch, and runs its statements under a watch (slowBatch). It returns with
// b.mu held, the batch, and whether the watch handed the lead on meanwhile.
func (b *Batcher) runBatch() (batch []*batchReq, handed bool) {
	b.mu.Lock()
	b.linger()
	batch = b.take()
	w := b.watch()
	b.running++
	b.mu.Unlock()

	b.settle(b.pin(batch))

	b.mu.Lock()
	b.running--
	return batch, w.end()
}

// nextLeader, under b.mu, passes the lead on once a batch ran: to nobody when nothing is
// pending; to the oldest pending request's goroutine (next) when it waits in Settle; to a
// leader to spawn (spawn) when it was queued (Queue), as no goroutine waits for it.
func (b *Batcher) nextLeader() (next *batchReq, spawn bool) {
	if len(b.pending) == 0 {
		b.leading = false
		return nil, false
	}
	if next = b.pending[0]; next.then != nil {
		return nil, true
	}
	return next, false
}

// handTo gives the lead nextLeader passed on, once b.mu is released.
func (b *Batcher) handTo(next *batchReq, spawn bool) {
	switch {
	case next != nil:
		next.handLead()
	case spawn:
		b.spawnLeader()
	}
}

// inlineBudget is how long a leader finishes its batch's queued settlements on its own
// goroutine (deliver) before the rest are handed to goroutines of their own: a service's
// WithOnSettled hook that is slow, or that waits for another row of the batch (a Cancel
// of it, say), must not hold up the rows behind it.
const inlineBudget = time.Millisecond

// deliver tells the queued settlements of batch that its leader answered (collect) their
// answers. A leader the batcher spawned (here) finishes them on its goroutine, in order,
// until inlineBudget has passed; then a timer's goroutine hands each one not yet begun to
// a goroutine of its own, even while the leader is still inside one that blocks. Each is
// taken by one side alone (inlineTelling.take). Any other caller hands each off at once.
func (b *Batcher) deliver(batch []*batchReq, here bool) {
	var told []*batchReq
	for _, r := range batch {
		if r.then != nil && r.collect && isDone(r) {
			r.collect = false
			told = append(told, r)
		}
	}
	if len(told) == 0 {
		return
	}
	if !here {
		for _, r := range told {
			r.then.BatchAnswered(false)
		}
		return
	}
	t := &inlineTelling{reqs: told}
	timer := time.AfterFunc(inlineBudget, t.handOff)
	for r := t.take(); r != nil; r = t.take() {
		r.then.BatchAnswered(!t.handed.Load())
	}
	timer.Stop()
}

// inlineTelling is a leader's batch of queued settlements to tell (deliver).
type inlineTelling struct {
	reqs   []*batchReq
	next   atomic.Int64
	handed atomic.Bool
}

// take takes the next request to tell, once: nil when none is left.
func (t *inlineTelling) take() *batchReq {
	if i := t.next.Add(1) - 1; i < int64(len(t.reqs)) {
		return t.reqs[i]
	}
	return nil
}

// handOff hands the requests the leader has not begun to goroutines of their own.
func (t *inlineTelling) handOff() {
	t.handed.Store(true)
	for r := t.take(); r != nil; r = t.take() {
		r.then.BatchAnswered(false)
	}
}

// lead runs batches until own has its answer, then hands the lead to the oldest request
// still waiting, or gives it up when none is. A batch whose statement runs longer than
// slowBatch hands the lead on meanwhile (see watch), and its goroutine leads no more.
func (b *Batcher) lead(own *batchReq) {
	for {
		batch, handed := b.runBatch()
		if handed {
			b.mu.Unlock()
			b.deliver(batch, false)
			return // another request leads now
		}
		if isDone(own) || len(b.pending) == 0 {
			next, spawn := b.nextLeader()
			b.mu.Unlock()
			b.handTo(next, spawn)
			b.deliver(batch, false)
			return
		}
		b.mu.Unlock()
		b.deliver(batch, false)
	}
}

// slowBatch is how long a batch's statements may run before the requests queued behind
// it get a leader of their own: a statement that waits (a lone row's settlement waiting
// for a lock another session holds, a slow server) must not hold up every other
// settlement of the subscription.
const slowBatch = 100 * time.Millisecond

// maxRunning bounds the batches whose statements run at once: a hand-off past it waits
// for one to end (each running batch holds a pool connection).
const maxRunning = 2

// batchWatch hands the lead on when the batch it watches runs longer than slowBatch.
type batchWatch struct {
	b      *Batcher
	timer  *time.Timer
	ended  bool // under b.mu: the batch ran; the watch may no longer hand the lead on
	handed bool // under b.mu: the lead went to a queued request
}

// watch starts watching a batch; under b.mu, which fire takes before it reads the timer.
func (b *Batcher) watch() *batchWatch {
	w := &batchWatch{b: b}
	w.timer = time.AfterFunc(slowBatch, w.fire)
	return w
}

// fire hands the lead to the oldest queued request, if the batch still runs. Exactly one
// goroutine leads at any time: the watched leader gives up the lead here, under the lock
// it checks when its batch is done (end).
func (w *batchWatch) fire() {
	b := w.b
	b.mu.Lock()
	if w.ended {
		b.mu.Unlock()
		return
	}
	if len(b.pending) == 0 || b.running >= maxRunning {
		w.timer.Reset(slowBatch) // look again: requests may queue while the batch runs
		b.mu.Unlock()
		return
	}
	w.handed = true
	next, spawn := b.nextLeader() // pending is not empty: the lead goes to one of them
	b.mu.Unlock()
	b.handTo(next, spawn)
}

// end, under b.mu, closes the watch and reports whether the lead was handed on.
func (w *batchWatch) end() bool {
	w.timer.Stop()
	w.ended = true
	return w.handed
}

// take removes the next batch from pending: up to max requests in arrival order, at most
// one per row. A statement names each row once, so its result (the rows it settled)
// answers each request exactly; a second request of a row (a stale delivery and the
// current one) waits for the next batch.
func (b *Batcher) take() []*batchReq {
	batch := make([]*batchReq, 0, min(len(b.pending), b.max))
	rows := make(map[int64]struct{}, cap(batch))
	kept := b.pending[:0]
	for _, r := range b.pending {
		if _, dup := rows[r.held.ID]; dup || len(batch) == b.max {
			kept = append(kept, r)
			continue
		}
		rows[r.held.ID] = struct{}{}
		r.collect = true // its leader tells a queued request's Answered (deliver)
		batch = append(batch, r)
	}
	clear(b.pending[len(kept):])
	b.pending = kept
	return batch
}

// pin reads each request's current token, stopping its renewal, and answers at once the
// requests whose lease is gone; it returns the others.
func (b *Batcher) pin(batch []*batchReq) []*batchReq {
	kept := make([]*batchReq, 0, len(batch)) // not batch's array: deliver reads batch after

	for _, r := range batch {
		if _, ok := b.repin(r); ok {
			kept = append(kept, r)
		}
	}
	return kept
}

func isDone(r *batchReq) bool { return r.answered.Load() }

func wrapBatch(step dialects.Step, held dialects.Lease, err error) error {
	if err != nil {
		return fmt.Errorf("settle %s of row %d: %w", step.Kind, held.ID, err)
	}
	return nil
}

// settle runs one statement per kind in batch and answers every request.
func (b *Batcher) settle(batch []*batchReq) {
	for _, kind := range []dialects.StepKind{dialects.StepAck, dialects.StepRelease} {
		var (
			held []dialects.Lease
			now  time.Time
		)
		for _, r := range batch {
			if r.kind == kind {
				held = append(held, r.held)
				now = r.now // the latest: processed_at is the batch's settlement time
			}
		}
		if len(held) == 0 {
			continue
		}
		ctx, cancel := b.statementCtx()
		settled, err := b.run(ctx, kind, now, held)
		cancel()
		var busy *dialects.RowsBusyError
		if errors.As(err, &busy) {
			err = nil
		} else {
			busy = nil
		}
		slices.Sort(settled)
		for _, r := range batch {
			if r.kind != kind {
				continue
			}
			if busy != nil && busy.Busy(r.held.ID) {
				b.queueBusy(r) // another session holds the row: the busy lane waits for it
				continue
			}
			b.answer(r, settled, err)
		}
	}
}

// queueBusy hands a request whose row another session holds to the busy lane. The lane
// (one goroutine per batcher while it has work) keeps one waiter: the oldest busy request
// runs the single-row statement, which waits for the lock (SettleLeaseWaiting). On
// MariaDB that keeps the row's place in the lock's queue: a claim elsewhere cannot take
// it first once the lock ends, even with its lease run out. PostgreSQL wakes the waiter
// and only then locks the row, so a claim in between can take a row whose lease ran out
// while it was held, and the ack finds its lease lost (dialecttest
// WaitingSettlementAndALateClaim). The others are tried every busyPoll with the batched statement,
// which skips rows still held, so a row whose lock ends soon is settled at once instead
// of queuing behind a long wait. At most one pool connection waits, whatever the number
// of rows another session holds. A queued request's lease is unpinned meanwhile: the
// renewer keeps extending it, and the lane pins it again to run.
func (b *Batcher) queueBusy(r *batchReq) {
	r.collect = false // the lane answers it, and tells it (finish)
	r.busySince = time.Now()
	r.lease.Unpin()
	b.mu.Lock()
	if b.waits.Err() != nil {
		b.mu.Unlock()
		b.closeBusy(r)
		return
	}
	b.busy = append(b.busy, r)
	start := !b.laneRunning
	b.laneRunning = true
	b.mu.Unlock()
	if start {
		go b.lane()
	}
}

// busyPoll is how often the lane tries the busy requests that are not its waiter.
const busyPoll = 100 * time.Millisecond

// errWaitEnded is why a busy request was answered ErrClosed: its subscription stopped
// while another session held its row.
var errWaitEnded = fmt.Errorf("another session held the row: %w", ErrCutByStop)

// endWaits answers the busy requests queued in the lane (waits ended; see NewBatcher).
// The lane's waiter ends with its statement, whose context ended too. Requests that a
// tryBusy round holds meanwhile are answered as it puts them back (lane).
func (b *Batcher) endWaits() {
	b.mu.Lock()
	busy := b.busy
	b.busy = nil
	b.mu.Unlock()
	for _, r := range busy {
		b.closeBusy(r)
	}
}

// closeBusy answers a busy request, whose lease is unpinned, ErrClosed: its settlement did
// not happen, and its lease leaves the book so that it runs out.
func (b *Batcher) closeBusy(r *batchReq) {
	r.err = fmt.Errorf("%w: %w", ErrClosed, errWaitEnded)
	r.lease.Done()
	r.finish()
}

// lane runs the busy requests until none is left (see queueBusy).
func (b *Batcher) lane() {
	for {
		b.mu.Lock()
		if len(b.busy) == 0 && !b.waiting {
			b.laneRunning = false
			b.mu.Unlock()
			return
		}
		if !b.waiting && len(b.busy) > 0 {
			head := b.busy[0]
			b.busy = b.busy[1:]
			b.waiting = true
			go b.wait(head)
		}
		rest := b.busy
		b.busy = nil
		b.mu.Unlock()

		still := b.tryBusy(rest)
		b.mu.Lock()
		if b.waits.Err() != nil {
			// The waits ended: endWaits answers what is queued (queueBusy answers what
			// comes later at once), this round what it held, and the waiter its own, as
			// its statement is cut short. Nothing is left for the lane to do.
			b.laneRunning = false
			b.mu.Unlock()
			for _, r := range still {
				b.closeBusy(r)
			}
			return
		}
		b.busy = append(still, b.busy...)
		b.mu.Unlock()
		t := time.NewTimer(busyPoll)
		select {
		case <-t.C:
		case <-b.waits.Done():
			t.Stop()
		}
	}
}

// wait settles the lane's waiter: skipping first (its lock may have ended), then with
// the single-row statement that waits for the lock, up to the batcher's timeout.
func (b *Batcher) wait(r *batchReq) {
	defer func() {
		b.mu.Lock()
		b.waiting = false
		b.mu.Unlock()
	}()
	held, ok := b.repin(r)
	if !ok {
		return
	}
	if b.waits.Err() != nil {
		r.lease.Unpin()
		b.closeBusy(r)
		return
	}
	ctx, cancel := b.statementCtx()
	defer cancel()
	settled, err := b.q.SettleLeases(ctx, r.kind, r.now, []dialects.Lease{held})
	var busy *dialects.RowsBusyError
	if errors.As(err, &busy) {
		// The wait ends when the request has been busy for the timeout, as in tryBusy:
		// a request that became the waiter late in the lane waits no longer than that.
		// It ends at once when the batcher's waits end (NewBatcher), without
		// StatementCtx's grace: a wait cut short changes nothing, and the request is
		// answered ErrClosed.
		wctx, wcancel := context.WithDeadline(ctx, r.busySince.Add(b.timeout))
		stop := context.AfterFunc(b.waits, wcancel)
		var done bool
		done, err = b.q.SettleLeaseWaiting(wctx, dialects.Step{Kind: r.kind, Now: r.now}, held)
		stop()
		wcancel()
		if done {
			settled, err = []int64{held.ID}, nil
		} else if err != nil && b.waits.Err() != nil {
			r.err = fmt.Errorf("%w: %w (%w)", ErrClosed, errWaitEnded, err)
			r.lease.Done()
			r.finish()
			return
		} else if errors.As(err, &busy) || errors.Is(err, context.DeadlineExceeded) && wctx.Err() != nil {
			err = errBusyTooLong(b.timeout)
		}
	}
	b.answer(r, settled, err)
}

// tryBusy tries busy requests with the batched statements, which skip rows still held,
// answers those that settled or lost their leases, and returns the others, unpinned.
func (b *Batcher) tryBusy(rs []*batchReq) (still []*batchReq) {
	// A statement's result names rows, not tokens: as in a batch (take), a row's second
	// request (a stale delivery's beside the current one) waits for the next round, or
	// both would be answered by one token's settlement.
	rows := make(map[int64]struct{}, len(rs))
	for _, kind := range []dialects.StepKind{dialects.StepAck, dialects.StepRelease} {
		var (
			reqs []*batchReq
			held []dialects.Lease
			now  time.Time
		)
		for _, r := range rs {
			if r.kind != kind {
				continue
			}
			if _, dup := rows[r.lease.ID()]; dup {
				if time.Since(r.busySince) >= b.timeout {
					// Skipped rounds count too: it waits no longer than the others.
					b.answer(r, nil, errBusyTooLong(b.timeout))
					continue
				}
				still = append(still, r) // not pinned: it was put back unpinned
				continue
			}
			rows[r.lease.ID()] = struct{}{}
			if h, ok := b.repin(r); ok {
				reqs, held, now = append(reqs, r), append(held, h), r.now
			}
		}
		if len(held) == 0 {
			continue
		}
		ctx, cancel := b.statementCtx()
		settled, err := b.q.SettleLeases(ctx, kind, now, held)
		cancel()
		slices.Sort(settled)
		var busy *dialects.RowsBusyError
		if !errors.As(err, &busy) {
			busy = nil
		} else {
			err = nil
		}
		for _, r := range reqs {
			switch {
			case busy == nil || !busy.Busy(r.held.ID):
				b.answer(r, settled, err)
			case time.Since(r.busySince) >= b.timeout:
				// No request waits longer than a settlement may take, whatever its place
				// in the lane: its delivery (and a Shutdown waiting for it) gets an answer.
				b.answer(r, nil, errBusyTooLong(b.timeout))
			default:
				r.lease.Unpin()
				still = append(still, r)
			}
		}
	}
	return still
}

// errBusyTooLong answers a busy request whose row another session held longer than a
// settlement may take.
func errBusyTooLong(timeout time.Duration) error {
	return fmt.Errorf("%w: the row stayed locked by another session for %v", context.DeadlineExceeded, timeout)
}

// repin pins a request's lease, reading its current token (for a queued busy request,
// the one the renewer moved meanwhile); a lease lost or closed is answered, and ok is
// false.
func (b *Batcher) repin(r *batchReq) (dialects.Lease, bool) {
	held, lost, ok := r.lease.Pin()
	switch {
	case !ok:
		r.err = ErrClosed
	case lost:
		r.err = ErrLeaseLost
	default:
		r.held = held
		return held, true
	}
	r.lease.Done()
	r.finish()
	return dialects.Lease{}, false
}

// statementCtx bounds a statement of the batcher's (StatementCtx). A batched statement
// waits for no row lock on PostgreSQL and MariaDB, but it may wait for SQLite's write lock
// (another process's transaction, up to busy_timeout), for a pool connection or for a
// slow server: none of that may hold up a stop for long (see answer), while the releases
// a stop runs, which wait for nothing, still go through.
func (b *Batcher) statementCtx() (context.Context, context.CancelFunc) {
	return StatementCtx(context.Background(), b.waits, b.timeout)
}

// answer answers a request from its statement's result: settled sorted, the ids its
// statement settled; err, the statement's error. A statement cut short once the waits
// ended (NewBatcher, StatementCtx) reports an error that matches ErrClosed. Its row was not
// reported settled, and its lease runs out; a statement cut while its commit was under
// way may still have taken effect, which the error's database part says.
func (b *Batcher) answer(r *batchReq, settled []int64, err error) {
	_, found := slices.BinarySearch(settled, r.held.ID)
	switch {
	case err != nil && CutByStop(b.waits, err):
		r.err = fmt.Errorf("%w: %w: %w", ErrClosed, ErrCutByStop, err)
	case err != nil:
		r.err = err
	case !found:
		r.err = ErrLeaseLost
	}
	r.lease.Done()
	r.finish()
}

// run settles held in one batched statement, even a lone row: the batched statements
// never wait for a row lock another session holds (the single-row statement would, with a
// pool connection held meanwhile), and report such rows busy instead; the busy lane
// settles those.
func (b *Batcher) run(ctx context.Context, kind dialects.StepKind, now time.Time, held []dialects.Lease) ([]int64, error) {
	return b.q.SettleLeases(ctx, kind, now, held)
}
