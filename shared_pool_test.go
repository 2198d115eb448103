package rowactor_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
)

// sizedDialect opens a dialect on the harness's database over a pool of size
// connections; false where no form holds a connection per row (SQLite).
func sizedDialect(t *testing.T, h *harness, size int) (dialects.Dialect, bool) {
	t.Helper()
	switch d := h.d.(type) {
	case *postgres.Dialect:
		cfg := d.Pool().Config()
		cfg.MaxConns = int32(size)
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatalf("pool of %d: %v", size, err)
		}
		t.Cleanup(func() {
			done := make(chan struct{})
			go func() { pool.Close(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Errorf("closing the pool of %d waited 15 s for a connection never released", size)
			}
		})
		return postgres.New(pool), true
	case *mysql.Dialect:
		md, err := mysql.Open(context.Background(), strings.TrimPrefix(h.drv.url(t, h.d), "mysql://"))
		if err != nil {
			t.Fatalf("mysql.Open: %v", err)
		}
		md.DB().SetMaxOpenConns(size)
		t.Cleanup(func() { _ = md.Close() })
		return md, true
	}
	return nil, false
}

var sharedPoolScenarios = []scenario{
	{
		name: "two subscriptions with all but one of a small pool's connections each make progress and leave nothing behind",
		run:  sharedPoolScenario,
	},
	{
		name: "a subscription whose claims fail does not hold the pool's budget through its backoff",
		run:  failingClaimsReleaseTheBudgetScenario,
	},
}

// sharedPoolScenario: two subscriptions of one table (groups a and b) on one pool of 4,
// each asking for Workers(3), the pool's size less one. Each budgets what the pool can
// spare, so together they ask for twice what it has: every row must still be handled,
// Shutdown must succeed, and no session, lock or transaction may survive it.
func sharedPoolScenario(t *testing.T, h *harness, form rowactor.Form) {
	const size, rows = 4, 40
	d, ok := sizedDialect(t, h, size)
	if !ok {
		t.Skip("SQLite holds no connection per row in any form")
	}
	log := &syncBuffer{}
	b, err := rowactor.New(d, rowactor.WithLogger(slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		if _, err := b.Publish(context.Background(), h.table, []string{"a", "b"}[i%2], []byte("x")); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	var handled atomic.Int64
	for _, g := range []string{"a", "b"} {
		_, err := b.Subscribe(context.Background(), h.table, g, func(context.Context, *rowactor.Delivery) rowactor.Outcome {
			time.Sleep(5 * time.Millisecond)
			handled.Add(1)
			return rowactor.Ack()
		}, rowactor.Workers(size-1), rowactor.PollInterval(50*time.Millisecond))
		if err != nil {
			t.Fatalf("Subscribe %s: %v", g, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for handled.Load() < rows && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, serr := b.Shutdown(ctx)
	if n := handled.Load(); n != rows {
		t.Fatalf("%d of %d rows handled in 30 s on a pool of %d\nlogs:\n%s", n, rows, size, log.String())
	}
	if serr != nil {
		t.Fatalf("Shutdown: %v", serr)
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s", h.table.Name)); n != 0 {
		t.Fatalf("%d rows left in the table", n)
	}
	if h.drv.keyLocked != nil && form == rowactor.FormAdvisory {
		for id := int64(1); id <= rows; id++ {
			if key := strings.ReplaceAll(h.table.AdvisoryKey, "{id}", fmt.Sprint(id)); h.drv.keyLocked(t, h.d, key) {
				t.Fatalf("key %s still locked after Shutdown", key)
			}
		}
	}
}

// failingClaimsReleaseTheBudgetScenario proves that a claim parked in a failed claimer's
// mailbox through its restart backoff holds none of the pool's budget, so another
// subscription on the pool still gets a due row within a poll interval.
// Two subscriptions share a pool of 2 connections (a budget of 1). Subscription A's table
// was dropped: its claims fail and its claimer restarts after a growing backoff (1 s, 2 s,
// 4 s, ... up to 30 s), while its next claim waits in the suspended mailbox ("parked").
// Subscription B, healthy, must not queue behind A's backoff.
func failingClaimsReleaseTheBudgetScenario(t *testing.T, h *harness, form rowactor.Form) {
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

// TestSharedPoolBudgetFollowsAMySQLPoolShrunkWhileRunning proves that a subscription's
// budget follows a MySQL pool shrunk while it runs (db.SetMaxOpenConns, which database/sql
// allows at any time), so an advisory subscription leaves a connection for publishes.
// With the budget read only at Subscribe, it would keep holding every connection in
// sessions and a Publish would block.
func TestSharedPoolBudgetFollowsAMySQLPoolShrunkWhileRunning(t *testing.T) {
	t.Parallel()
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

// TestSharedPoolBudgetFollowsAMySQLPoolLimitedAfterSubscribe proves that a pool unlimited
// when the subscription subscribed, and limited later (db.SetMaxOpenConns(4)), is followed
// too: an advisory subscription with Workers(7) leaves a connection for a Publish instead
// of keeping a budget of MaxInt for good.
func TestSharedPoolBudgetFollowsAMySQLPoolLimitedAfterSubscribe(t *testing.T) {
	t.Parallel()
	h := newHarness(t, driverNamed(t, "mysql"), rowactor.FormAdvisory)
	d, _ := sizedDialect(t, h, 0) // unlimited
	b := h.brokerOn(d, rowactor.WithPollOnly())
	hold := make(chan struct{})
	defer close(hold)
	h.subscribe(b, func(ctx context.Context, _ *rowactor.Delivery) rowactor.Outcome {
		select {
		case <-hold:
		case <-ctx.Done():
		}
		return rowactor.Ack()
	}, rowactor.Workers(7), rowactor.PollInterval(200*time.Millisecond))
	db := mysqlDB(d)
	db.SetMaxOpenConns(4) // a budget of 3 from now on, were it followed
	for i := range 8 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		_, err := b.Publish(ctx, h.table, h.queue, []byte("x"))
		cancel()
		if err != nil {
			t.Fatalf("publish %d after the unlimited pool was limited to 4: %v after %v; pool %+v",
				i, err, time.Since(start).Round(time.Millisecond), db.Stats())
		}
		time.Sleep(300 * time.Millisecond)
	}
}
