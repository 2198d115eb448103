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

// TestIdlePollOnATwoConnectionPoolDoesNotDeadlock proves that probing idle groups while row
// lock and advisory deliveries hold a two-connection pool deadlocks nothing: every row
// written by hand is handled and Shutdown returns at once.
func TestIdlePollOnATwoConnectionPoolDoesNotDeadlock(t *testing.T) {
	t.Parallel()
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

// TestIdlePollDeliversSoonAfterThePoolGrows proves that a subscription starved of its
// pool's budget gets its due row within a few polls of the pool growing (SetMaxOpenConns),
// not only when another delivery on the pool settles.
func TestIdlePollDeliversSoonAfterThePoolGrows(t *testing.T) {
	t.Parallel()
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
