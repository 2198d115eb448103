package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
)

// Review of the idle probe on a pool of two connections: the probe takes a connection
// outside the subscriptions' budget (which leaves one spare). Row lock and advisory
// deliveries hold connections while their handlers run (and the handlers query the pool
// themselves, as the spare connection allows); idle groups of the same table are probed
// meanwhile. Every row written by hand must be handled, nothing may deadlock, and
// Shutdown must return at once.

func smallPool(t *testing.T, drv driver) dialects.Dialect {
	t.Helper()
	ctx := context.Background()
	switch drv.name {
	case "postgres":
		url := strings.Replace(postgresURL(), "pool_max_conns=12", "pool_max_conns=2", 1)
		d, err := postgres.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	case "mysql":
		d, err := mysql.Open(ctx, mysqlDSN())
		if err != nil {
			t.Fatal(err)
		}
		d.DB().SetMaxOpenConns(2)
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	t.Fatalf("no small pool for %s", drv.name)
	return nil
}

func TestReviewIdlePollSmallPool(t *testing.T) {
	for _, drv := range drivers {
		if drv.name == "sqlite" {
			continue
		}
		for _, form := range drv.forms {
			t.Run(fmt.Sprintf("%s/%s", drv.name, form), func(t *testing.T) {
				h := newHarness(t, drv, form)
				d := smallPool(t, drv)
				b := h.brokerOn(d, rowactor.WithPollOnly())
				s := newSeen()
				var handlerQueries atomic.Int64
				handler := func(ctx context.Context, dl *rowactor.Delivery) rowactor.Outcome {
					time.Sleep(50 * time.Millisecond)
					// A handler's own query on the pool (the spare connection).
					qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					defer cancel()
					var err error
					switch d := d.(type) {
					case *postgres.Dialect:
						_, err = d.Pool().Exec(qctx, "SELECT 1")
					case *mysql.Dialect:
						_, err = d.DB().ExecContext(qctx, "DO 1")
					}
					if err != nil {
						t.Errorf("handler's query: %v", err)
					}
					handlerQueries.Add(1)
					s.mark(dl)
					return rowactor.Ack()
				}
				groups := []string{h.queue, "busy-2", "idle-1", "idle-2", "idle-3"}
				for _, g := range groups {
					if _, err := b.Subscribe(context.Background(), h.table, g, handler, rowactor.PollInterval(20*time.Millisecond), rowactor.Workers(2)); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(200 * time.Millisecond)
				want := map[int64]string{}
				start := time.Now()
				for round := 0; round < 6; round++ {
					for _, g := range groups[:2] {
						want[insertByHand(t, h, g)] = g
					}
					if round%2 == 1 {
						g := groups[2+round/2]
						want[insertByHand(t, h, g)] = g
					}
					time.Sleep(30 * time.Millisecond)
				}
				s.waitAll(t, h, want, 20*time.Second)
				t.Logf("%d rows in %v on a pool of two", len(want), time.Since(start))

				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				began := time.Now()
				if _, err := b.Shutdown(ctx); err != nil {
					t.Fatalf("Shutdown: %v", err)
				}
				if d := time.Since(began); d > 2*time.Second {
					t.Errorf("Shutdown took %v", d)
				}
			})
		}
	}
}
