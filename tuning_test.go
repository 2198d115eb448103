package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// Runtime tuning and per-key concurrency join the conformance table.
// peak tracks the most calls in flight at once.
type peak struct{ now, max atomic.Int64 }

func (p *peak) enter() {
	n := p.now.Add(1)
	for m := p.max.Load(); n > m && !p.max.CompareAndSwap(m, n); m = p.max.Load() {
	}
}
func (p *peak) leave() { p.now.Add(-1) }

var tuningScenarios = []scenario{
	{name: "pause stops claiming without dropping deliveries in work and resume claims again", run: func(t *testing.T, h *harness, form rowactor.Form) {
		b := h.broker()
		var calls atomic.Int64
		release := make(chan struct{})
		sub := h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			if calls.Add(1) <= 2 {
				<-release
			}
			return rowactor.Ack()
		}, rowactor.Workers(2), rowactor.PollInterval(20*time.Millisecond))
		h.publish(b, 2)
		waitFor(t, func() bool { return calls.Load() == 2 })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := sub.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		later := h.publish(b, 3)
		close(release)
		for _, s := range h.waitSettled(2) {
			if s.Err != nil || s.Step != "ack" {
				t.Fatalf("a delivery in work at the pause: %+v", s)
			}
		}
		h.quiet(400 * time.Millisecond)
		for _, id := range later {
			if st := h.row(id); !st.exists || st.lockedUntil != nil || st.attempt != 1 {
				t.Fatalf("row %d touched while paused: %+v", id, st)
			}
		}
		if err := sub.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		for _, s := range h.waitSettled(3) {
			if s.Err != nil || !slices.Contains(later, s.ID) {
				t.Fatalf("after resume: %+v", s)
			}
		}
	}},
	{name: "fewer workers keep the deliveries in work and bound the next ones", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		var p peak
		var calls atomic.Int64
		release := make(chan struct{})
		sub := h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			p.enter()
			defer p.leave()
			if calls.Add(1) <= 3 {
				<-release
			} else {
				time.Sleep(20 * time.Millisecond)
			}
			return rowactor.Ack()
		}, rowactor.Workers(3))
		h.publish(b, 3)
		waitFor(t, func() bool { return calls.Load() == 3 })
		sub.SetWorkers(1)
		h.publish(b, 4)
		time.Sleep(100 * time.Millisecond)
		p.max.Store(0)
		close(release)
		for _, s := range h.waitSettled(7) {
			if s.Err != nil {
				t.Fatalf("settlement %+v", s)
			}
		}
		if m := p.max.Load(); m > 1 {
			t.Fatalf("%d deliveries at once after SetWorkers(1)", m)
		}
	}},
	{name: "SetWorkers(0) is refused as Workers(0) is and the workers stay", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		var calls atomic.Int64
		hold := make(chan struct{})
		sub := h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			if calls.Add(1) <= 2 {
				<-hold
			}
			return rowactor.Ack()
		}, rowactor.Workers(2))
		h.publish(b, 3)
		waitFor(t, func() bool { return calls.Load() == 2 })
		for _, n := range []int{0, -1} {
			err := sub.SetWorkers(n)
			var ce *rowactor.ConfigError
			if !errors.Is(err, rowactor.ErrConfig) || !errors.As(err, &ce) || ce.Option != "SetWorkers" || ce.Table != h.table.Name {
				t.Fatalf("SetWorkers(%d) = %v, want a *ConfigError naming SetWorkers and the table", n, err)
			}
		}
		// Still two workers: with one held, the third row starts once the other returns.
		hold <- struct{}{}
		waitFor(t, func() bool { return calls.Load() == 3 })
		close(hold)
		for _, s := range h.waitSettled(3) {
			if s.Err != nil || s.Step != "ack" {
				t.Fatalf("settlement %+v", s)
			}
		}
		if err := sub.SetWorkers(1); err != nil {
			t.Fatalf("SetWorkers(1) = %v", err)
		}
	}},
	{name: "rows of other keys start beside a burst of one key's rows, not after it", forms: []rowactor.Form{rowactor.FormLease}, run: otherKeysBesideABurstScenario},
	{name: "rows of one key are handled one at a time in claim order and keys side by side", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		var (
			mu     sync.Mutex
			order  = map[string][]int64{}
			perKey = map[string]*peak{"a": {}, "b": {}, "c": {}}
			all    peak
		)
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			k := d.Header("account")
			perKey[k].enter()
			all.enter()
			mu.Lock()
			order[k] = append(order[k], d.ID())
			mu.Unlock()
			time.Sleep(30 * time.Millisecond)
			all.leave()
			perKey[k].leave()
			return rowactor.Ack()
		}, rowactor.WorkersByKey(3, func(d *rowactor.Delivery) string { return d.Header("account") }))
		published := map[string][]int64{}
		for i := range 12 {
			k := []string{"a", "a", "b", "a", "c", "b"}[i%6]
			id, err := b.Publish(context.Background(), h.table, h.queue, []byte(fmt.Sprint(i)), rowactor.WithHeaders(map[string]string{"account": k}))
			if err != nil {
				t.Fatal(err)
			}
			published[k] = append(published[k], id)
		}
		for _, s := range h.waitSettled(12) {
			if s.Err != nil {
				t.Fatalf("settlement %+v", s)
			}
		}
		for k, p := range perKey {
			if m := p.max.Load(); m != 1 {
				t.Errorf("key %s: %d deliveries at once, want 1", k, m)
			}
			if !slices.Equal(order[k], published[k]) {
				t.Errorf("key %s handled in order %v, published %v", k, order[k], published[k])
			}
		}
		if m := all.max.Load(); m < 2 || m > 3 {
			t.Errorf("%d deliveries at once across keys, want 2 or 3 with WorkersByKey(3)", m)
		}
	}},
}

// otherKeysBesideABurstScenario: WorkersByKey(8), no Prefetch. A burst of 16 rows of one
// key (200 ms handlers, one at a time) fills a claim; rows of 8 other keys published
// then start on the idle workers while the burst still runs, within its next few rows.
// (A claim held back because the burst's waiting rows seemed to keep every worker busy
// started them only after about 7 more rows of the burst.) The poll is an hour: a claim
// must come from the publish's wake or a settlement.
func otherKeysBesideABurstScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	for i := range 16 {
		if _, err := b.Publish(ctx, h.table, h.queue, []byte(fmt.Sprintf("A-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	var (
		burstDone  atomic.Int64 // rows of the burst handled
		firstOther = make(chan int64, 1)
	)
	key := func(d *rowactor.Delivery) string {
		if p := string(d.Payload()); !strings.HasPrefix(p, "A-") {
			return p
		}
		return "A"
	}
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if strings.HasPrefix(string(d.Payload()), "A-") {
			time.Sleep(200 * time.Millisecond)
			burstDone.Add(1)
			return rowactor.Ack()
		}
		select {
		case firstOther <- burstDone.Load():
		default:
		}
		return rowactor.Ack()
	}, rowactor.WorkersByKey(8, key), rowactor.PollInterval(time.Hour))
	waitFor(t, func() bool { return burstDone.Load() >= 1 }) // the room is measured
	for i := range 8 {
		if _, err := b.Publish(ctx, h.table, h.queue, []byte(fmt.Sprintf("K%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range h.waitSettled(24) {
		if s.Err != nil || s.Step != "ack" {
			t.Fatalf("settlement %+v", s)
		}
	}
	if done := <-firstOther; done > 3 {
		t.Fatalf("the first row of another key started after %d rows of the burst, with 7 of 8 workers idle; want it beside the burst's next few", done)
	}
}
