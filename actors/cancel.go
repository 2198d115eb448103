package actors

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/settler"
)

// Cancelling a delivery in work (Broker.Cancel of a row this process holds).
//
// A row claimed that waits for a worker has no delivery yet: the subscription actor takes
// it out of its backlog and spawns one that settles it as cancelled (cancelWaiting).
//
// Each delivery spawned to run its handler is in its subscription's book of deliveries in
// work, by row id, from its spawn to its end: Cancel finds it there (and a row still
// waiting for a worker in the subscription's backlog). A delivery and a Cancel
// meet on one atomic pointer of the delivery's (delivery.cancel), moved by
// compare-and-swap:
//
//	nil          running: the handler runs, or returned and its settlement has not begun
//	             (or the delivery has not started: then its handler is never called)
//	a request    Cancel asked first: the handler's context is cancelled with the cause, and
//	             the settlement ends the row as cancelled, whatever the handler returns
//	settling     the settlement of the handler's own outcome began first: it runs, and a
//	             Cancel that comes now waits for it (a request that did not win)
//	ended        the delivery ended: its row is no longer this subscription's
//
// A SubscribeBatch batch is in a book of its own (batchBook), under each of its rows' ids,
// and keeps one such pointer per row (batchDelivery.cancels), moved the same way. Its
// handler's context is the batch's, shared by rows that were not cancelled: a request
// does not cancel it, but marks its row, which the handler can ask about
// (Delivery.Cancelled), and the batch's settlement ends that row as cancelled whatever
// outcome the handler gave it. Once every row of the batch is cancelled, no work is left
// worth doing: the context is cancelled then, with the last request's cause (and a batch
// all of whose rows were cancelled before it started never calls its handler).
//
// A delivery that is never cancelled pays four atomic operations (its context published
// and the pointer read as it starts, a compare-and-swap as it settles, a swap as it ends)
// and two writes of the book (an uncontended lock of one of its shards and a map write
// each, allocation-free once the maps have grown); the request and its channel are made
// by Cancel alone. A batch pays, per row, the two writes of its book and a
// compare-and-swap and a swap, and one slice of two pointers a row: small beside the
// batch's claim and commit.

// cancelRequest is a Cancel of a delivery in work, or a Cancel waiting for a settlement
// that ran first (won false). r is the delivery's result, set before done closes.
type cancelRequest struct {
	cause  error
	reason string
	won    bool
	done   chan struct{}
	r      Result
}

var (
	settlingMark = &cancelRequest{} // the settlement of the handler's own outcome began
	endedMark    = &cancelRequest{} // the delivery ended
)

// Cancelled is what became of a delivery Cancel found in work.
type Cancelled struct {
	// Won says the cancel settled the row (Result.Err tells whether the settlement took
	// effect); false, that the settlement of the handler's own outcome began first, and
	// Result is that settlement's.
	Won    bool
	Result Result
}

// Cancel cancels the delivery of row id, when the subscription has it in work: its
// handler's context is cancelled with cause (context.Cause returns it), and once the
// handler returns the row is settled as a cancel of a queued row ends it (deleted, or
// processed with reason in the error column), whatever the handler returned; in
// transactional mode the handler's writes are rolled back first, as for a Drop. It waits
// for the delivery to end, until ctx ends. A row claimed and waiting for a worker is
// settled as cancelled without calling the handler (cancelWaiting). A row of a batch in
// work is marked cancelled instead, its batch's context left running for the other rows
// (batchDelivery.cancelRow). held is false when the subscription holds no such row. A
// Cancel that comes once the settlement of the handler's own outcome began does not win:
// it waits for that settlement and reports it.
func (s *Subscription) Cancel(ctx context.Context, id int64, cause error, reason string) (c Cancelled, held bool, err error) {
	d := s.book.get(id)
	if d == nil {
		if bd := s.batchBook.get(id); bd != nil {
			return bd.cancelRow(ctx, id, cause, reason)
		}
		return s.cancelWaiting(ctx, id, cause, reason)
	}
	return requestCancel(ctx, &d.cancel, cause, reason, func(*cancelRequest) {
		if dc := d.handlerCtx.Load(); dc != nil {
			dc.Cancel(cause) // no effect once the handler returned
		} // else the delivery sees the request as it starts
	})
}

// requestCancel moves a delivery's (or a batch row's) cancel pointer p for a Cancel, and
// waits for the end the pointer is handed: won runs once, with the request, when this
// Cancel asked first. held is false when the delivery ended already.
func requestCancel(ctx context.Context, p *atomic.Pointer[cancelRequest], cause error, reason string, won func(*cancelRequest)) (Cancelled, bool, error) {
	var req *cancelRequest
	for req == nil {
		switch v := p.Load(); v {
		case nil:
			r := &cancelRequest{cause: cause, reason: reason, won: true, done: make(chan struct{})}
			if p.CompareAndSwap(nil, r) {
				won(r)
				req = r
			}
		case endedMark:
			return Cancelled{}, false, nil
		case settlingMark:
			r := &cancelRequest{done: make(chan struct{})}
			if p.CompareAndSwap(settlingMark, r) {
				req = r
			}
		default:
			req = v // another Cancel's: wait for the same end
		}
	}
	return req.wait(ctx)
}

// Claiming reports the subscription's claims in flight (their rows, claimed, not yet in
// its backlog or its book), how many claims it took in or rows it gave back so far, and
// the rows it is giving back from its backlog (strand.go): a Cancel that found a row held
// by nobody the subscription knows looks again while these move, and for as long as a
// give-back is under way (its release ends by the settle timeout at most).
func (s *Subscription) Claiming() (inFlight int64, done uint64, givingBack int64) {
	return s.claiming.Load(), s.claimsDone.Load(), s.givingBack.Load()
}

func (req *cancelRequest) wait(ctx context.Context) (Cancelled, bool, error) {
	select {
	case <-req.done:
		return Cancelled{Won: req.won, Result: req.r}, true, nil
	case <-ctx.Done():
		return Cancelled{Won: req.won}, true, ctx.Err()
	}
}

// cancelWaitingMsg asks the subscription actor to cancel row id if it waits for a worker;
// found answers whether it did.
type cancelWaitingMsg struct {
	id    int64
	req   *cancelRequest
	found chan<- bool
}

func (cancelWaitingMsg) IgnoreDeadLetterLogging() {}

// cancelWaiting cancels row id if it was claimed and waits for a worker (Prefetch,
// WorkersByKey): the subscription actor takes it out of its backlog and settles it as
// cancelled, without calling the handler. The actor answers at once.
func (s *Subscription) cancelWaiting(ctx context.Context, id int64, cause error, reason string) (Cancelled, bool, error) {
	req := &cancelRequest{cause: cause, reason: reason, won: true, done: make(chan struct{})}
	found := make(chan bool, 1)
	s.sys.Root.Send(s.pid, cancelWaitingMsg{id: id, req: req, found: found})
	select {
	case ok := <-found:
		if !ok {
			return Cancelled{}, false, nil
		}
	case <-s.done:
		return Cancelled{}, false, nil
	case <-ctx.Done():
		return Cancelled{}, false, ctx.Err()
	}
	return req.wait(ctx)
}

// cancelWaiting takes row id out of the backlog, if it waits there, and spawns a delivery
// that settles it as cancelled without taking a worker.
func (a *subscriptionActor) cancelWaiting(c actor.Context, id int64, req *cancelRequest) bool {
	for i, w := range a.backlog {
		if w.claim.Row.ID != id {
			continue
		}
		a.backlog = slices.Delete(a.backlog, i, i+1)
		a.spawnDelivery(c, &delivery{sub: a.s, claim: w.claim, cancelOnly: req})
		return true
	}
	return false
}

// takeCancel is called as the delivery's settlement begins: it returns the Cancel that
// asked first, or nil, and from then on a Cancel waits for this settlement.
func (d *delivery) takeCancel() *cancelRequest { return takeCancel(&d.cancel) }

func takeCancel(p *atomic.Pointer[cancelRequest]) *cancelRequest {
	if p.CompareAndSwap(nil, settlingMark) {
		return nil
	}
	if req := p.Load(); req != settlingMark && req != endedMark {
		return req
	}
	return nil
}

// endCancel takes the delivery out of its subscription's book and hands its result to a
// Cancel waiting for it.
func (d *delivery) endCancel(r Result) {
	if d.inBook {
		d.sub.book.remove(d.claim.Row.ID, d)
	}
	endCancel(&d.cancel, r)
}

func endCancel(p *atomic.Pointer[cancelRequest], r Result) {
	if req := p.Swap(endedMark); req != nil && req != settlingMark && req != endedMark {
		req.r = r
		close(req.done)
	}
}

// settleCancelled ends the row of a cancelled delivery as a cancel of a queued row does:
// the ack step (deleted, or processed_at set with its unique key cleared), with the
// reason in the error column after dialects.CancelledPrefix, never replaced by an event of the subscription's. In
// transactional mode the handler's writes are rolled back first (the outcome is a Cancel).
func (d *delivery) settleCancelled(req *cancelRequest) Result {
	step, o := d.cancelStep(req)
	d.outcome = o
	r := d.runStep(step, o, d.tag)
	r.Panic = d.panic
	return r
}

// settleCancelledUnstarted is settleCancelled for a delivery whose handler never started
// (it was cancelled while it waited for a worker, or as it started): the row also gets
// back the attempt its claim counted (the lease and advisory forms), and reads as a
// cancel of the queued row would have left it.
func (d *delivery) settleCancelledUnstarted(req *cancelRequest) Result {
	step, o := d.cancelStep(req)
	step.Unstarted = true
	d.outcome = o
	return d.runStep(step, o, d.tag)
}

// cancelStep is the step and outcome that end a cancelled delivery's row.
func (d *delivery) cancelStep(req *cancelRequest) (dialects.Step, settler.Outcome) {
	return cancelStep(req, d.claim.Row, d.sub.cfg.Now())
}

// Its outcome is a Cancel, as the handler's own Cancel(err) would be, and its step the
// one that Cancel plans: the reason written as dialects.CancelledError.
func cancelStep(req *cancelRequest, row dialects.Row, now time.Time) (dialects.Step, settler.Outcome) {
	o := settler.Outcome{Verdict: settler.Cancel, Err: req.cause, Error: req.reason}
	return dialects.Step{Kind: dialects.StepAck, Now: now, Error: dialects.CancelledError(req.reason), Attempt: row.Attempt}, o
}

// inWorkBook is a subscription's deliveries (or batches) in work, by row id, in shards so
// that deliveries on many workers seldom meet on one lock.
type inWorkBook[D any] struct {
	shards [inWorkShards]inWorkShard[D]
}

const inWorkShards = 8

type inWorkShard[D any] struct {
	mu sync.Mutex
	m  map[int64]*D
	_  [48]byte // a cache line each
}

func (b *inWorkBook[D]) shard(id int64) *inWorkShard[D] { return &b.shards[uint64(id)%inWorkShards] }

// add books d under row id; a later delivery of the same row (its earlier lease ran out)
// replaces it.
func (b *inWorkBook[D]) add(id int64, d *D) {
	s := b.shard(id)
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[int64]*D)
	}
	s.m[id] = d
	s.mu.Unlock()
}

// remove takes d out, unless a later delivery of its row replaced it.
func (b *inWorkBook[D]) remove(id int64, d *D) {
	s := b.shard(id)
	s.mu.Lock()
	if s.m[id] == d {
		delete(s.m, id)
	}
	s.mu.Unlock()
}

func (b *inWorkBook[D]) get(id int64) *D {
	s := b.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[id]
}
