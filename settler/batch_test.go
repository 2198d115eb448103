package settler

import (
	"context"
	"errors"
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

// heldLease is a lease in a book of one.
type heldLease struct {
	mu           sync.Mutex
	id           int64
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
	return dialects.Lease{ID: h.id, Token: time.Unix(1, 0)}, false, true
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
	b := NewBatcher(waits, q, 8, time.Minute)
	step := dialects.Step{Kind: dialects.StepAck, Now: time.Now()}
	leases := []*heldLease{{id: 1}, {id: 2}, {id: 3}}
	errs := make(chan error, len(leases))
	for _, l := range leases {
		go func() { errs <- b.Settle(context.Background(), step, l) }()
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
	if err := b.Settle(context.Background(), step, late); !errors.Is(err, ErrClosed) || !late.isDone() {
		t.Errorf("settlement after the waits ended: %v (lease done: %v), want ErrClosed", err, late.isDone())
	}
}
