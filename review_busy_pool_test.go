package rowactor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/postgres"
)

// smallPoolDialect opens a dialect of its own on the harness's database whose pool holds n
// connections (pgxpool's default on a host of up to four CPUs is four), closed after
// the brokers made on it shut down.
func smallPoolDialect(t *testing.T, h *harness, n int) dialects.Dialect {
	t.Helper()
	switch h.drv.name {
	case "postgres":
		url := strings.Replace(postgresURL(), "pool_max_conns=12", "pool_max_conns="+itoa(n), 1)
		d, err := postgres.Open(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	case "mysql":
		d := h.newD()
		mysqlDB(d).SetMaxOpenConns(n)
		mysqlDB(d).SetMaxIdleConns(n)
		return d
	}
	t.Fatalf("%s has no pool", h.drv.name)
	return nil
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// holdRows opens a transaction of the test's own, outside every pool of the broker's, that
// holds rows ids FOR UPDATE, and returns its end (which may be called more than once).
func holdRows(t *testing.T, h *harness, ids []int64) (end func()) {
	t.Helper()
	var ends []func()
	for _, id := range ids {
		ends = append(ends, holdRow(t, h, id))
	}
	return func() {
		for _, e := range ends {
			e()
		}
	}
}

// Rows another session holds locked must not take the connections every other row's
// settlement, the renewer and the claimer need. Since 3fe98c6 a batch reports such rows
// busy and settles each alone, on a goroutine of its own, with the single-row statement
// that waits for the lock; since d4d423c a lone settlement that waits hands the batcher's
// lead on after 100 ms, so the next lone locked row waits too. Each waiting statement
// holds a pool connection for as long as the lock lasts (up to the settle timeout): as
// many locked rows as the pool has connections take all of them, and the acks of rows
// nobody locked (and the renewer's rounds, and the claims) wait for the lock too.
// (Before both commits this failed as well: the batcher waited on the locked rows.)
func TestBusyRowsSettledAloneDoNotTakeThePool(t *testing.T) {
	// together: the locked rows' acks join one batch, which finds them busy and settles
	// each alone; spaced: each ack is a lone batch whose statement waits, and hands the
	// lead on to the next.
	for _, spacing := range []time.Duration{0, 250 * time.Millisecond} {
		name := "together"
		if spacing > 0 {
			name = "spaced"
		}
		t.Run(name, func(t *testing.T) { busyRowsPool(t, spacing) })
	}
}

func busyRowsPool(t *testing.T, spacing time.Duration) {
	for _, drv := range serverDrivers() {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			const poolSize, locked, free = 4, 4, 2
			b := h.brokerOn(smallPoolDialect(t, h, poolSize))
			ids := h.publish(b, locked+free)
			release := map[int64]chan struct{}{}
			for _, id := range ids {
				release[id] = make(chan struct{})
			}
			started := make(chan int64, len(ids))
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				started <- d.ID()
				<-release[d.ID()]
				return rowactor.Ack()
			}, rowactor.Workers(len(ids)), rowactor.Lease(30*time.Second))
			for range ids {
				select {
				case <-started:
				case <-time.After(15 * time.Second):
					t.Fatal("the rows were not all delivered")
				}
			}

			// Another session (a report, an operator's transaction) holds the first rows.
			unlock := holdRows(t, h, ids[:locked])
			defer unlock()
			for _, id := range ids[:locked] {
				close(release[id])
				time.Sleep(spacing)
			}
			time.Sleep(time.Second) // their acks are waiting on the server now
			for _, id := range ids[locked:] {
				close(release[id])
			}
			// The rows nobody locked are acked while the lock is still held.
			deadline := time.Now().Add(5 * time.Second)
			for {
				gone := 0
				for _, id := range ids[locked:] {
					if !h.row(id).exists {
						gone++
					}
				}
				if gone == free {
					break
				}
				if time.Now().After(deadline) {
					unlock()
					t.Fatalf("%d of the %d rows nobody locked were acked in 5 s while another session held %d rows "+
						"(pool of %d): the locked rows' lone settlements hold every connection", gone, free, locked, poolSize)
				}
				time.Sleep(20 * time.Millisecond)
			}
			unlock()
			for _, s := range h.waitSettled(len(ids)) {
				if s.Err != nil || s.Step != "ack" {
					t.Errorf("settlement %+v, want an ack", s)
				}
			}
		})
	}
}

// The same starvation costs the leases of rows nobody locked: the renewer's round needs a
// pool connection too, finds none while the locked rows' lone settlements wait, fails,
// and the lease of a row whose handler runs past it runs out; another process claims the
// row and delivers it a second time while the first delivery still runs. (Before 3fe98c6
// this failed too, differently: the renewer's round waited for the locked rows, whose
// queued acks kept them in the book. Now the round skips them, and waits for a connection.)
func TestBusyRowsSettledAloneStarveTheRenewer(t *testing.T) {
	for _, drv := range serverDrivers() {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			const poolSize, locked = 4, 4
			b := h.brokerOn(smallPoolDialect(t, h, poolSize))
			ids := h.publish(b, locked+1)
			freeID := ids[locked]
			release := map[int64]chan struct{}{}
			for _, id := range ids {
				release[id] = make(chan struct{})
			}
			started := make(chan int64, 2*len(ids))
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				started <- d.ID()
				<-release[d.ID()]
				return rowactor.Ack()
			}, rowactor.Workers(len(ids)), rowactor.Lease(2*time.Second))
			for range ids {
				select {
				case <-started:
				case <-time.After(15 * time.Second):
					t.Fatal("the rows were not all delivered")
				}
			}
			// Another process works the same table.
			var second calls
			second.attempts = map[int64][]int{}
			h.subscribe(h.second(), func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				second.add(d)
				return rowactor.Ack()
			}, rowactor.Workers(2), rowactor.Lease(2*time.Second))

			unlock := holdRows(t, h, ids[:locked])
			defer unlock()
			for _, id := range ids[:locked] {
				close(release[id])
			}
			// The free row's handler runs on, well past its lease: the renewer must keep it.
			time.Sleep(6 * time.Second)
			if n := len(second.of(freeID)); n > 0 {
				unlock()
				close(release[freeID])
				t.Fatalf("row %d, which nobody locked and whose handler still ran, was delivered again by another process "+
					"(%d times): its lease was not renewed while %d locked rows' settlements held the pool of %d\nlogs:\n%s",
					freeID, n, locked, poolSize, h.logs.String())
			}
			unlock()
			close(release[freeID])
			waitFor(t, func() bool { return !h.row(freeID).exists })
		})
	}
}

// And the claims and publishes: a free worker must get a due row within a poll interval,
// and a publish through the broker must not wait for other rows' locks, but both need a
// pool connection, and the locked rows' lone settlements hold them all (until the
// settle timeout, 30 s). (Before 3fe98c6 and d4d423c the batcher ran one statement at a
// time: the locked rows' acks held one connection, and claims and publishes went on.)
func TestBusyRowsSettledAloneStarveTheClaimer(t *testing.T) {
	for _, drv := range serverDrivers() {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			const poolSize, locked = 4, 4
			b := h.brokerOn(smallPoolDialect(t, h, poolSize))
			ids := h.publish(b, locked)
			release := map[int64]chan struct{}{}
			for _, id := range ids {
				release[id] = make(chan struct{})
			}
			started := make(chan int64, 2*locked+2)
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				started <- d.ID()
				if ch := release[d.ID()]; ch != nil {
					<-ch
				}
				return rowactor.Ack()
			}, rowactor.Workers(2*locked), rowactor.Lease(30*time.Second))
			for range ids {
				select {
				case <-started:
				case <-time.After(15 * time.Second):
					t.Fatal("the rows were not all delivered")
				}
			}
			other := h.second() // another process publishes
			unlock := holdRows(t, h, ids)
			defer unlock()
			for _, id := range ids {
				close(release[id])
			}
			time.Sleep(time.Second) // their acks wait on the server now

			// A new row, and free workers: it is delivered within a poll interval or two.
			fresh, err := other.Publish(context.Background(), h.table, h.queue, []byte("fresh"))
			if err != nil {
				t.Fatal(err)
			}
			select {
			case id := <-started:
				if id != fresh {
					t.Fatalf("delivered %d, want the new row %d", id, fresh)
				}
			case <-time.After(3 * time.Second):
				t.Errorf("a new row waited 3 s for a free worker (poll 50 ms) while another session held %d rows "+
					"whose lone settlements hold the pool of %d", locked, poolSize)
			}
			// A publish through the broker.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			start := time.Now()
			if _, err := b.Publish(ctx, h.table, h.queue, []byte("mine")); err != nil {
				t.Errorf("a publish through the broker failed after %v while another session held %d rows whose lone "+
					"settlements hold the pool of %d: %v", time.Since(start).Round(time.Millisecond), locked, poolSize, err)
			}
			unlock()
		})
	}
}
