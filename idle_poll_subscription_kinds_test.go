package rowactor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// idleReachMargin bounds the waits for rows the idle poll must reach. A subscription the probe
// misses waits for ever (its own poll is off while it idles), so any bound proves the
// row was reached; it is a margin over "within a poll" for a machine loaded by the
// whole suite under -race, not a latency (bench/ measures that).
const idleReachMargin = 8 * time.Second

type seen struct {
	mu sync.Mutex
	at map[int64]string // id -> queue that handled it
	ch chan int64
}

func newSeen() *seen { return &seen{at: map[int64]string{}, ch: make(chan int64, 1024)} }

func (s *seen) mark(d *rowactor.Delivery) {
	s.mu.Lock()
	s.at[d.ID()] = d.Queue()
	s.mu.Unlock()
	s.ch <- d.ID()
}

func (s *seen) handler(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
	s.mark(d)
	return rowactor.Ack()
}

func (s *seen) batch(_ context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
	out := make([]rowactor.Outcome, len(ds))
	for i, d := range ds {
		s.mark(d)
		out[i] = rowactor.Ack()
	}
	return out
}

// waitAll waits until every id in want was handled by its queue.
func (s *seen) waitAll(t *testing.T, h *harness, want map[int64]string, limit time.Duration) {
	t.Helper()
	deadline := time.After(limit)
	for {
		s.mu.Lock()
		missing := map[int64]string{}
		for id, q := range want {
			got, ok := s.at[id]
			if !ok {
				missing[id] = q
			} else if got != q {
				s.mu.Unlock()
				t.Fatalf("row %d handled by %q, want %q", id, got, q)
			}
		}
		s.mu.Unlock()
		if len(missing) == 0 {
			return
		}
		select {
		case <-s.ch:
		case <-deadline:
			t.Fatalf("rows not handled within %v: %v\nlogs:\n%s", limit, missing, h.logs.String())
		}
	}
}

// TestIdlePollReachesEveryKindOfSubscription proves that every kind of idle subscription
// (past 64 groups, another poll interval, another description of the table, transactional,
// Prefetch, WorkersByKey, SubscribeBatch, paused then resumed, SetWorkers) gets a row written
// by hand within a few polls.
func TestIdlePollReachesEveryKindOfSubscription(t *testing.T) {
	t.Parallel()
	const poll = 100 * time.Millisecond
	for _, drv := range drivers {
		for _, form := range drv.forms {
			t.Run(fmt.Sprintf("%s/%s", drv.name, form), func(t *testing.T) {
				h := newHarness(t, drv, form)
				b := h.broker(rowactor.WithPollOnly())
				s := newSeen()
				ctx := context.Background()
				sub := func(tb rowactor.Table, g string, opts ...rowactor.SubscribeOption) *rowactor.Subscription {
					t.Helper()
					sb, err := b.Subscribe(ctx, tb, g, s.handler, append([]rowactor.SubscribeOption{rowactor.PollInterval(poll)}, opts...)...)
					if err != nil {
						t.Fatalf("Subscribe %s: %v", g, err)
					}
					return sb
				}
				var plain []string
				for i := 0; i < 70; i++ {
					g := fmt.Sprintf("g%03d", i)
					plain = append(plain, g)
					sub(h.table, g)
				}
				sub(h.table, "slow-poll", rowactor.PollInterval(3*poll))
				sub(h.table, "fast-poll", rowactor.PollInterval(poll/2))
				other := h.table
				other.RetryAfter = "" // the same table described otherwise: a poll of its own
				sub(other, "other-description")
				sub(h.table, "transactional", rowactor.Transactional())
				if form == rowactor.FormLease {
					sub(h.table, "prefetch", rowactor.Prefetch(4), rowactor.Workers(2))
				} else {
					sub(h.table, "prefetch", rowactor.Workers(2))
				}
				sub(h.table, "by-key", rowactor.WorkersByKey(3, func(d *rowactor.Delivery) string { return fmt.Sprint(d.ID() % 2) }))
				if form == rowactor.FormRowLock {
					if _, err := b.SubscribeBatch(ctx, h.table, "batch", 3, s.batch, rowactor.PollInterval(poll)); err != nil {
						t.Fatal(err)
					}
				}
				paused := sub(h.table, "paused")
				retuned := sub(h.table, "retuned")
				time.Sleep(5 * poll) // every first claim came back empty

				want := map[int64]string{}
				add := func(g string) {
					want[insertByHand(t, h, g)] = g
				}
				for _, i := range []int{0, 1, 62, 63, 64, 65, 69} {
					add(plain[i])
				}
				for _, g := range []string{"slow-poll", "fast-poll", "other-description", "transactional", "prefetch", "prefetch", "prefetch",
					"by-key", "by-key", "by-key", "retuned", "retuned"} {
					add(g)
				}
				if form == rowactor.FormRowLock {
					add("batch")
					add("batch")
				}
				retuned.SetWorkers(3)
				s.waitAll(t, h, want, idleReachMargin)

				// Paused: nothing; resumed: the row, within a few polls.
				if err := paused.Pause(ctx); err != nil {
					t.Fatal(err)
				}
				id := insertByHand(t, h, "paused")
				time.Sleep(5 * poll)
				s.mu.Lock()
				_, early := s.at[id]
				s.mu.Unlock()
				if early {
					t.Fatalf("row %d handled while its subscription was paused", id)
				}
				if err := paused.Resume(ctx); err != nil {
					t.Fatal(err)
				}
				s.waitAll(t, h, map[int64]string{id: "paused"}, idleReachMargin)

				// Paused and resumed while idle, then a row.
				if err := paused.Pause(ctx); err != nil {
					t.Fatal(err)
				}
				time.Sleep(3 * poll)
				if err := paused.Resume(ctx); err != nil {
					t.Fatal(err)
				}
				time.Sleep(3 * poll)
				s.waitAll(t, h, map[int64]string{insertByHand(t, h, "paused"): "paused"}, idleReachMargin)

				// A second round on every plain group at once: 70 rows.
				want = map[int64]string{}
				for _, g := range plain {
					add(g)
				}
				s.waitAll(t, h, want, idleReachMargin)
			})
		}
	}
}

// TestIdlePollReachesATableWithoutGroups proves that an idle subscription of a table without
// a group column gets a row written by hand within a few polls.
func TestIdlePollReachesATableWithoutGroups(t *testing.T) {
	t.Parallel()
	const poll = 100 * time.Millisecond
	for _, drv := range drivers {
		for _, form := range drv.forms {
			t.Run(fmt.Sprintf("%s/%s", drv.name, form), func(t *testing.T) {
				h := newHarness(t, drv, form, withoutGroup)
				b := h.broker(rowactor.WithPollOnly())
				s := newSeen()
				if _, err := b.Subscribe(context.Background(), h.table, "anything", s.handler, rowactor.PollInterval(poll), rowactor.Workers(2)); err != nil {
					t.Fatal(err)
				}
				time.Sleep(3 * poll)
				for round := 0; round < 3; round++ {
					want := map[int64]string{}
					for i := 0; i <= round; i++ {
						want[insertByHand(t, h, "")] = "anything"
					}
					s.waitAll(t, h, want, idleReachMargin)
					time.Sleep(2 * poll)
				}
			})
		}
	}
}
