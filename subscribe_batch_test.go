package rowactor_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// subscribeBatch subscribes a batch handler on the harness's table.
func (h *harness) subscribeBatch(b *rowactor.Broker, size int, fn rowactor.BatchHandler, opts ...rowactor.SubscribeOption) *rowactor.Subscription {
	h.t.Helper()
	opts = append([]rowactor.SubscribeOption{rowactor.PollInterval(50 * time.Millisecond)}, opts...)
	s, err := b.SubscribeBatch(context.Background(), h.table, h.queue, size, fn, opts...)
	if err != nil {
		h.t.Fatalf("SubscribeBatch: %v", err)
	}
	return s
}

var rowLockOnly = []rowactor.Form{rowactor.FormRowLock}

var batchHandlerScenarios = []scenario{
	{name: "a batch handler gets up to n rows a call and one commit settles each row by its outcome", forms: rowLockOnly, run: func(t *testing.T, h *harness, form rowactor.Form) {
		b := h.broker()
		ids := h.publish(b, 10)
		var (
			mu    sync.Mutex
			sizes []int
			seen  = map[int64][]int{}
		)
		h.subscribeBatch(b, 4, func(_ context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
			out := make([]rowactor.Outcome, len(ds))
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, len(ds))
			for i, d := range ds {
				seen[d.ID()] = append(seen[d.ID()], d.Attempt())
				out[i] = rowactor.Ack()
				if d.ID()%2 == 1 && d.Attempt() == 1 {
					out[i] = rowactor.Retry()
				}
			}
			return out
		})
		var retried, acked int
		for _, s := range h.waitSettled(15) {
			switch {
			case s.Err != nil:
				t.Fatalf("settlement %+v", s)
			case s.Step == "retry":
				retried++
			case s.Step == "ack":
				acked++
			}
		}
		if retried != 5 || acked != 10 {
			t.Fatalf("%d retries and %d acks, want 5 and 10", retried, acked)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, n := range sizes {
			if n < 1 || n > 4 {
				t.Fatalf("batch sizes %v, want 1 to 4 rows each", sizes)
			}
		}
		if sizes[0] != 4 {
			t.Fatalf("first batch held %d rows, want 4 (10 were due)", sizes[0])
		}
		for _, id := range ids {
			if h.row(id).exists {
				t.Fatalf("row %d still exists", id)
			}
			want := []int{1}
			if id%2 == 1 {
				want = []int{1, 2} // the row lock form counts the retry's attempt
			}
			if got := seen[id]; len(got) != len(want) || got[len(got)-1] != want[len(want)-1] {
				t.Fatalf("row %d delivered with attempts %v, want %v", id, got, want)
			}
		}
	}},
	{name: "a failing statement rolls the whole batch back and every row returns as it was", forms: rowLockOnly, run: func(t *testing.T, h *harness, form rowactor.Form) {
		b := h.broker()
		ids := h.publish(b, 3)
		var calls atomic.Int64
		checked := make(chan struct{})
		h.subscribeBatch(b, 3, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
			out := make([]rowactor.Outcome, len(ds))
			for i := range ds {
				out[i] = rowactor.Ack()
			}
			if calls.Add(1) == 1 {
				out[1] = rowactor.Event("set", "not a number") // the attempt column refuses it
			} else {
				select { // the rows are checked between the two batches
				case <-checked:
				case <-ctx.Done():
				}
			}
			return out
		}, rowactor.OnEvent("set", "UPDATE "+h.table.Name+" SET attempt = {arg1} WHERE id = {id}"))
		first := h.waitSettled(3)
		for _, s := range first {
			if s.Err == nil {
				t.Fatalf("first batch: %+v, want every row's settlement to fail", s)
			}
		}
		for _, id := range ids {
			if st := h.row(id); !st.exists || st.attempt != 1 {
				t.Fatalf("row %d after the failed batch: %+v", id, st)
			}
		}
		close(checked)
		for _, s := range h.waitSettled(3) {
			if s.Err != nil || s.Step != "ack" {
				t.Fatalf("second batch: %+v", s)
			}
		}
		for _, id := range ids {
			if h.row(id).exists {
				t.Fatalf("row %d still exists", id)
			}
		}
	}},
	{name: "a batch handler's panic releases the batch at once", forms: rowLockOnly, run: func(t *testing.T, h *harness, form rowactor.Form) {
		b := h.broker()
		h.publish(b, 2)
		var calls atomic.Int64
		h.subscribeBatch(b, 5, func(_ context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
			if calls.Add(1) == 1 {
				panic("boom")
			}
			return []rowactor.Outcome{rowactor.Ack(), rowactor.Ack()}
		})
		for _, s := range h.waitSettled(2) {
			if !s.Released || s.Panic == nil {
				t.Fatalf("after the panic: %+v", s)
			}
		}
		for _, s := range h.waitSettled(2) {
			if s.Err != nil || s.Step != "ack" || s.Attempt != 1 {
				t.Fatalf("redelivery %+v, want an ack on attempt 1 (the rollback spent none)", s)
			}
		}
	}},
}

// TestSubscribeBatchRefuses: what a batch subscription cannot do is refused before any
// claim.
func TestSubscribeBatchRefuses(t *testing.T) {
	t.Parallel()
	ack := func(_ context.Context, ds []*rowactor.Delivery) []rowactor.Outcome { return nil }
	drv := driverNamed(t, "postgres")
	h := newHarness(t, drv, rowactor.FormLease)
	b := h.broker()
	rowLock := h.table
	rowLock.LockedUntil = ""
	for _, c := range []struct {
		name string
		t    rowactor.Table
		size int
		fn   rowactor.BatchHandler
		opts []rowactor.SubscribeOption
		want string
	}{
		{"lease form", h.table, 10, ack, nil, "row lock form"},
		{"no rows", rowLock, 0, ack, nil, "size"},
		{"nil handler", rowLock, 10, nil, nil, "handler"},
		{"transactional", rowLock, 10, ack, []rowactor.SubscribeOption{rowactor.Transactional()}, "Transactional"},
	} {
		_, err := b.SubscribeBatch(context.Background(), c.t, h.queue, c.size, c.fn, c.opts...)
		var ce *rowactor.ConfigError
		if !errors.As(err, &ce) || !containsAll(err.Error(), c.want) {
			t.Errorf("%s: %v, want a *ConfigError about %q", c.name, err, c.want)
		}
	}
}
