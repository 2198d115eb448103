package settler

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// Batcher gathers the lease form's acks and releases and writes them in one token-fenced
// statement per kind: a group commit. It sets no timer: a settlement that finds no batch
// running starts one at once, and the settlements that arrive while one runs go together
// in the next. Under light load each settlement runs alone, as without a batcher; under
// heavy load the batches grow with the database's latency, and the commits per message
// fall. A row whose token no longer matches is reported ErrLeaseLost and left alone.
type Batcher struct {
	q       dialects.LeaseBatchQueue
	timeout time.Duration
	max     int

	reqs chan *batchReq
	stop context.CancelFunc
	wg   sync.WaitGroup
}

type batchReq struct {
	kind dialects.StepKind
	now  time.Time
	held dialects.Lease
	done chan error
}

// Batchable says whether a step can join a batch: acks, retries and releases (one
// statement shape for every row). RetryAfter carries a time per row, dead-letter moves
// and the service's own events run alone.
func Batchable(step dialects.Step) bool {
	if step.Event != "" {
		return false
	}
	switch step.Kind {
	case dialects.StepAck, dialects.StepRetry, dialects.StepRelease:
		return true
	}
	return false
}

// NewBatcher starts runners goroutines that settle batches of at most max rows, each
// statement bounded by timeout. Close stops them.
func NewBatcher(q dialects.LeaseBatchQueue, runners, max int, timeout time.Duration) *Batcher {
	ctx, stop := context.WithCancel(context.Background())
	b := &Batcher{q: q, timeout: timeout, max: max, reqs: make(chan *batchReq, max*runners), stop: stop}
	for range runners {
		b.wg.Add(1)
		go b.run(ctx)
	}
	return b
}

// Settle runs a batchable step for held with the next batch, and returns when that batch
// ran: nil, ErrLeaseLost when the row held another token, or the batch's error. ctx
// bounds the wait to join a batch; once joined, the batch's own timeout applies.
func (b *Batcher) Settle(ctx context.Context, step dialects.Step, held dialects.Lease) error {
	kind := step.Kind
	if kind == dialects.StepRetry {
		kind = dialects.StepRelease // the lease form's retry clears the lease: the claim counted
	}
	r := &batchReq{kind: kind, now: step.Now, held: held, done: make(chan error, 1)}
	select {
	case b.reqs <- r:
	case <-ctx.Done():
		return fmt.Errorf("settle %s of row %d: %w", step.Kind, held.ID, ctx.Err())
	}
	if err := <-r.done; err != nil {
		return fmt.Errorf("settle %s of row %d: %w", step.Kind, held.ID, err)
	}
	return nil
}

// Close stops the runners once the settlements already queued ran.
func (b *Batcher) Close() {
	close(b.reqs)
	b.wg.Wait()
	b.stop()
}

func (b *Batcher) run(ctx context.Context) {
	defer b.wg.Done()
	batch := make([]*batchReq, 0, b.max)
	for first := range b.reqs {
		batch = append(batch[:0], first)
	gather:
		for len(batch) < b.max {
			select {
			case r, ok := <-b.reqs:
				if !ok {
					break gather
				}
				batch = append(batch, r)
			default:
				break gather
			}
		}
		b.settle(ctx, batch)
	}
}

// settle runs one statement per kind in batch and answers every request.
func (b *Batcher) settle(ctx context.Context, batch []*batchReq) {
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
		sctx, cancel := context.WithTimeout(ctx, b.timeout)
		settled, err := b.q.SettleLeases(sctx, kind, now, held)
		cancel()
		slices.Sort(settled)
		for _, r := range batch {
			if r.kind != kind {
				continue
			}
			switch _, found := slices.BinarySearch(settled, r.held.ID); {
			case err != nil:
				r.done <- err
			case found:
				r.done <- nil
			default:
				r.done <- ErrLeaseLost
			}
		}
	}
}
