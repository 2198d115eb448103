package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// Review findings on the pool's shared connection budget (change 3).

func init() {
	scenarios = append(scenarios, scenario{
		name: "a subscription whose claims fail does not hold the pool's budget through its backoff",
		run:  reviewParkedClaimHoldsBudgetScenario,
	})
}

// reviewParkedClaimHoldsBudgetScenario: two subscriptions on one pool of 2 connections
// (a budget of 1). Subscription A's table was dropped: its claims fail and its claimer
// restarts after a growing backoff (1 s, 2 s, 4 s, ... up to 30 s). After a failure the
// subscription sends its next claim to the failed claimer at once, where it waits in the
// suspended mailbox for the restart ("parked") -- holding the connections it took from
// the pool's budget, though it holds no connection at all. Subscription B, healthy, finds
// the budget spent and queues: each of its rows waits for A's backoff to end (seconds, up
// to 30 s), though B's poll is 50 ms and the pool is idle. The invariants "a pool is
// shared by every subscription on it and every subscription makes progress" and "a free
// worker gets a due row within a poll interval" break for B.
func reviewParkedClaimHoldsBudgetScenario(t *testing.T, h *harness, form rowactor.Form) {
	d, ok := sizedDialect(t, h, 2)
	if !ok {
		t.Skip("SQLite has no connection budget")
	}
	broken := h.table
	broken.Name = h.table.Name + "_broken"
	if broken.AdvisoryKey != "" {
		broken.AdvisoryKey = broken.Name + "-{id}"
	}
	h.createTable(broken)
	b := h.brokerOn(d)
	noop := func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }
	if _, err := b.Subscribe(context.Background(), broken, h.queue, noop, rowactor.PollInterval(50*time.Millisecond)); err != nil {
		t.Fatalf("Subscribe A: %v", err)
	}
	delivered := make(chan time.Time, 16)
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		delivered <- time.Now()
		return rowactor.Ack()
	})
	h.exec(fmt.Sprintf("DROP TABLE %s", broken.Name))
	// After three failures A's claimer restarts after 2 to 4 s.
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(h.logs.String(), "failures=3") {
		if time.Now().After(deadline) {
			t.Fatalf("A's claims did not fail three times in 20 s\nlogs:\n%s", h.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	published := time.Now()
	h.publish(b, 1)
	select {
	case at := <-delivered:
		if wait := at.Sub(published); wait > time.Second {
			t.Fatalf("B's row waited %v for a worker (B's poll 50 ms, the pool idle): A's claim, parked in its failed "+
				"claimer's mailbox for the backoff, held the pool's whole budget", wait.Round(time.Millisecond))
		}
	case <-time.After(40 * time.Second):
		t.Fatalf("B's row not delivered in 40 s")
	}
}

// TestReviewMySQLPoolShrunkWhileRunning: the budget's doc says "a pool resized since is
// followed", but the limit is read only when a subscription subscribes (Limits, at
// Subscribe). A MySQL pool shrunk while a subscription runs (db.SetMaxOpenConns, which
// database/sql allows at any time) keeps the old budget: an advisory subscription then
// holds every connection of the pool in sessions and waits for more inside its claim (up
// to the claim deadline, 30 s), and the connection the budget leaves for publishes and
// handlers' own queries is gone: a Publish blocks. (Only a later Subscribe on the pool
// would read the new size.)
func TestReviewMySQLPoolShrunkWhileRunning(t *testing.T) {
	h := newHarness(t, driverNamed(t, "mysql"), rowactor.FormAdvisory)
	d, _ := sizedDialect(t, h, 8) // a budget of 7
	b := h.brokerOn(d, rowactor.WithPollOnly())
	hold := make(chan struct{})
	defer close(hold)
	h.subscribe(b, func(ctx context.Context, _ *rowactor.Delivery) rowactor.Outcome {
		select {
		case <-hold:
		case <-ctx.Done():
		}
		return rowactor.Ack()
	}, rowactor.Workers(7), rowactor.PollInterval(time.Minute))
	db := mysqlDB(d)
	db.SetMaxOpenConns(4) // a budget of 3 from now on
	for i := range 8 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		_, err := b.Publish(ctx, h.table, h.queue, []byte("x"))
		cancel()
		if err != nil {
			t.Fatalf("publish %d after the pool shrank to 4 (a budget of 3 for claims): %v after %v; pool %+v\nlogs:\n%s",
				i, err, time.Since(start).Round(time.Millisecond), db.Stats(), h.logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
