package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/postgres"
)

// chainedBatches counts the pipelines that settle a row and claim the next: four
// statements, the third a BEGIN.
type chainedBatches struct{ n atomic.Int64 }

func (c *chainedBatches) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if q := d.Batch.QueuedQueries; len(q) == 4 && strings.HasPrefix(q[2].SQL, "BEGIN") {
		c.n.Add(1)
	}
	return ctx
}

func (c *chainedBatches) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (c *chainedBatches) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *chainedBatches) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *chainedBatches) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// A row lock worker of a subscription with several workers gets its next row with its
// last row's settlement: on PostgreSQL the settlement's statement, COMMIT, BEGIN and the
// next claim go in one round trip on the settling row's connection (actors/chain.go).
// Every row is acked once, the table is left empty, Shutdown drains, and no connection
// stays held. With one worker no settlement claims.
func TestARowLockWorkerGetsItsNextRowWithItsSettlement(t *testing.T) {
	t.Parallel()
	drv := driverNamed(t, "postgres")
	for _, workers := range []int{4, 1} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormRowLock)
			cfg, err := pgxpool.ParseConfig(postgresURL())
			if err != nil {
				t.Fatal(err)
			}
			chained := &chainedBatches{}
			cfg.ConnConfig.Tracer = chained
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			b := h.brokerOn(postgres.New(pool))
			const n = 300
			ids := h.publish(b, n)
			h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() },
				rowactor.Workers(workers))
			acked := map[int64]int{}
			for _, s := range h.waitSettledWithin(n, 60*time.Second) {
				if s.Err != nil || s.Step != "ack" {
					t.Errorf("row %d: step %s, error %v", s.ID, s.Step, s.Err)
				}
				acked[s.ID]++
			}
			for _, id := range ids {
				if acked[id] != 1 {
					t.Errorf("row %d acked %d times", id, acked[id])
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if rep, err := b.Shutdown(ctx); err != nil || !rep.Drained {
				t.Fatalf("Shutdown: %+v, %v", rep, err)
			}
			var left int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+h.table.Name).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left != 0 {
				t.Errorf("%d rows left in the table", left)
			}
			if held := pool.Stat().AcquiredConns(); held != 0 {
				t.Errorf("%d connections held after Shutdown", held)
			}
			got := chained.n.Load()
			t.Logf("%d of %d rows claimed by a settlement", got, n)
			switch {
			case workers > 1 && got < n/2:
				t.Errorf("%d of %d rows were claimed by the settlement of the row before, want most", got, n)
			case workers == 1 && got != 0:
				t.Errorf("with one worker, %d rows were claimed by a settlement", got)
			}
		})
	}
}

// openPostgresPool opens a dialect on a pool of its own of size connections.
func openPostgresPool(t *testing.T, size int) *postgres.Dialect {
	t.Helper()
	d, err := postgres.Open(context.Background(), fmt.Sprintf("%s&pool_max_conns=%d", postgresURL(), size))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// countRows counts the rows of table whose group is group ("" for all).
func countRows(t *testing.T, d *postgres.Dialect, table, group string) int {
	t.Helper()
	var n int
	q, args := "SELECT count(*) FROM "+table, []any{}
	if group != "" {
		q, args = q+" WHERE grp = $1", []any{group}
	}
	if err := d.Pool().QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A row lock settlement that takes long (here a trigger that sleeps on its row's DELETE)
// holds back no claim but its own worker's: the other workers drain the backlog while it
// runs, and a row published once the queue ran dry reaches a free worker at once. The
// slow row's worker waits for its settlement, which claims its next row (chain.go).
func TestASlowRowLockSettlementHoldsBackNoOtherWorkersClaim(t *testing.T) {
	t.Parallel()
	h := newHarness(t, driverNamed(t, "postgres"), rowactor.FormRowLock)
	d := openPostgresPool(t, 12)
	b := h.brokerOn(d)
	h.exec("INSERT INTO " + h.table.Name + " (payload, grp) SELECT convert_to('p', 'UTF8'), 'q' FROM generate_series(1, 100)")
	var slowID int64
	if err := d.Pool().QueryRow(context.Background(), "SELECT min(id) FROM "+h.table.Name).Scan(&slowID); err != nil {
		t.Fatal(err)
	}
	fn := h.table.Name + "_slow"
	h.exec(fmt.Sprintf("CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF OLD.id = %d THEN PERFORM pg_sleep(10); END IF; RETURN OLD; END $$", fn, slowID))
	t.Cleanup(func() { _, _ = d.Pool().Exec(context.Background(), "DROP FUNCTION IF EXISTS "+fn+"() CASCADE") })
	h.exec("CREATE TRIGGER " + fn + " BEFORE DELETE ON " + h.table.Name + " FOR EACH ROW EXECUTE FUNCTION " + fn + "()")
	var slowReturned atomic.Int64
	handledAt := sync.Map{}
	h.subscribe(b, func(_ context.Context, dl *rowactor.Delivery) rowactor.Outcome {
		handledAt.Store(dl.ID(), time.Now())
		if dl.ID() == slowID {
			slowReturned.Store(time.Now().UnixNano())
		}
		return rowactor.Ack()
	}, rowactor.Workers(4))
	// The backlog drains while the slow settlement runs.
	for deadline := time.Now().Add(6 * time.Second); countRows(t, d, h.table.Name, "") > 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d rows left 6 s into a 10 s settlement of row %d", countRows(t, d, h.table.Name, ""), slowID)
		}
	}
	published := time.Now()
	id := h.publish(b, 1)[0]
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if at, ok := handledAt.Load(id); ok {
			if took := at.(time.Time).Sub(published); took > 2*time.Second {
				t.Errorf("a row published with three workers free waited %v for one (row %d's settlement still ran)", took, slowID)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the row published was never handled")
		}
	}
	if since := time.Since(time.Unix(0, slowReturned.Load())); since > 10*time.Second {
		t.Fatalf("the slow settlement ended %v ago: the check above proved nothing", since)
	}
	h.waitSettledWithin(101, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if rep, err := b.Shutdown(ctx); err != nil || !rep.Drained {
		t.Fatalf("Shutdown: %+v, %v", rep, err)
	}
	if n := countRows(t, d, h.table.Name, ""); n != 0 {
		t.Errorf("%d rows left", n)
	}
}

// A settling row lock delivery that offered to claim its worker's next row is answered
// even when no claim is sent for it: here the subscription was paused while the
// handlers ran, so it claims nothing, and each delivery settles alone at once. Left
// waiting for a claim, the rows stayed locked and unsettled until Resume.
func TestARowLockDeliveryOfferingToClaimSettlesWhenNoClaimComes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, driverNamed(t, "postgres"), rowactor.FormRowLock)
	d := openPostgresPool(t, 8)
	b := h.brokerOn(d)
	const workers = 4
	h.exec(fmt.Sprintf("INSERT INTO %s (payload, grp) SELECT convert_to('p', 'UTF8'), '%s' FROM generate_series(1, 20)", h.table.Name, h.queue))
	started, release := make(chan int64, 20), make(chan struct{})
	sub := h.subscribe(b, func(_ context.Context, dl *rowactor.Delivery) rowactor.Outcome {
		started <- dl.ID()
		<-release
		return rowactor.Ack()
	}, rowactor.Workers(workers))
	receiveN(t, started, workers, 10*time.Second, "a handler's start")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sub.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	close(release)
	for _, s := range h.waitSettledWithin(workers, 10*time.Second) {
		if s.Err != nil || s.Step != "ack" {
			t.Errorf("row %d: step %s, error %v", s.ID, s.Step, s.Err)
		}
	}
	if left := countRows(t, d, h.table.Name, ""); left != 20-workers {
		t.Errorf("%d rows left while paused, want %d", left, 20-workers)
	}
	if err := sub.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	h.waitSettledWithin(20-workers, 20*time.Second)
}

// Subscriptions on one pool share its connections (dialects.Budget): a row lock
// subscription whose settlements claim its next rows on their connections keeps none
// from another subscription waiting for one. The second's rows run while the first
// still has thousands.
func TestAChainingSubscriptionLeavesConnectionsToAnotherOnItsPool(t *testing.T) {
	t.Parallel()
	h := newHarness(t, driverNamed(t, "postgres"), rowactor.FormRowLock)
	d := openPostgresPool(t, 4)
	b, err := rowactor.New(d) // no hook: the harness's would fill up
	if err != nil {
		t.Fatal(err)
	}
	shutdownAtCleanup(t, b)
	h.exec("INSERT INTO " + h.table.Name + " (payload, grp) SELECT convert_to('a', 'UTF8'), 'a' FROM generate_series(1, 6000)")
	sleep := func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		time.Sleep(time.Millisecond)
		return rowactor.Ack()
	}
	if _, err := b.Subscribe(context.Background(), h.table, "a", sleep, rowactor.Workers(3)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	h.exec("INSERT INTO " + h.table.Name + " (payload, grp) SELECT convert_to('b', 'UTF8'), 'b' FROM generate_series(1, 20)")
	start := time.Now()
	var handled atomic.Int64
	done := make(chan time.Duration, 1)
	if _, err := b.Subscribe(context.Background(), h.table, "b", func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		if handled.Add(1) == 20 {
			done <- time.Since(start)
		}
		return rowactor.Ack()
	}, rowactor.Workers(3)); err != nil {
		t.Fatal(err)
	}
	select {
	case took := <-done:
		if left := countRows(t, d, h.table.Name, "a"); left == 0 {
			t.Errorf("the second subscription's 20 rows ran only once the first's 6,000 were done (%v)", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the second subscription handled %d of its 20 rows in 5 s while the first drained (%d of its rows left)",
			handled.Load(), countRows(t, d, h.table.Name, "a"))
	}
}
