package rowactor_test

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
)

// TestReviewIdlePollPoolGrown: a subscription that found its pool's budget spent waits for
// connections; when the pool is grown while it waits (database/sql's SetMaxOpenConns, which
// the budget follows "at once", dialects/budget.go), it must get its due row within a poll
// or so, not only when another delivery on the pool settles. Before the idle probe, the
// subscription's own poll timer took from the budget again every interval; an idle
// subscription ticked by the probe that then finds no budget is out of the probe, and has
// no timer of its own.
func TestReviewIdlePollPoolGrown(t *testing.T) {
	drv := driverNamed(t, "mysql")
	for _, form := range []rowactor.Form{rowactor.FormRowLock, rowactor.FormAdvisory} {
		t.Run(form.String(), func(t *testing.T) {
			h := newHarness(t, drv, form)
			d, err := mysql.Open(context.Background(), mysqlDSN())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			d.DB().SetMaxOpenConns(2) // a budget of one connection
			b := h.brokerOn(d, rowactor.WithPollOnly())
			const poll = 50 * time.Millisecond
			hold := make(chan struct{})
			holding := make(chan struct{}, 1)
			s := newSeen()
			ctx := context.Background()
			if _, err := b.Subscribe(ctx, h.table, "holder", func(_ context.Context, dl *rowactor.Delivery) rowactor.Outcome {
				holding <- struct{}{}
				select {
				case <-hold:
				case <-time.After(20 * time.Second):
				}
				s.mark(dl)
				return rowactor.Ack()
			}, rowactor.PollInterval(poll)); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Subscribe(ctx, h.table, "starved", s.handler, rowactor.PollInterval(poll)); err != nil {
				t.Fatal(err)
			}
			defer close(hold)
			time.Sleep(4 * poll)
			insertByHand(t, h, "holder")
			select {
			case <-holding: // the holder's delivery holds the budget's one connection
			case <-time.After(5 * time.Second):
				t.Fatalf("the holder's row was not handled\nlogs:\n%s", h.logs.String())
			}
			id := insertByHand(t, h, "starved")
			time.Sleep(10 * poll) // the starved subscription was told its row is due and found no connection
			s.mu.Lock()
			_, early := s.at[id]
			s.mu.Unlock()
			if early {
				t.Skip("the starved subscription got a connection anyway; nothing to test")
			}
			grown := time.Now()
			d.DB().SetMaxOpenConns(10)
			select {
			case got := <-s.ch:
				if got != id {
					t.Fatalf("handled row %d, want %d", got, id)
				}
				t.Logf("handled %v after the pool grew", time.Since(grown))
				if since := time.Since(grown); since > 20*poll {
					t.Errorf("the row waited %v after the pool grew, at a %v poll", since, poll)
				}
			case <-time.After(3 * time.Second):
				t.Fatalf("the row of the starved subscription was not handled within 3 s of the pool growing (the holder still holds its connection)")
			}
		})
	}
}
