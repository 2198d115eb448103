package rowactor_test

import (
	"context"
	"fmt"
	"strings"
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
	var drv driver
	for _, d := range drivers {
		if d.name == "postgres" {
			drv = d
		}
	}
	if drv.name == "" {
		t.Fatal("no postgres driver")
	}
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
