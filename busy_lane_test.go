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

// TestBusyRowsSettledAloneDoNotTakeThePool proves that rows another session holds locked
// do not take the connections every other row's settlement needs: as many locked rows as
// the pool has connections, each settled alone with a statement that waits for its lock,
// must leave the acks of rows nobody locked going on while the lock is held.
func TestBusyRowsSettledAloneDoNotTakeThePool(t *testing.T) {
	t.Parallel()
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

// TestBusyRowsSettledAloneDoNotStarveTheRenewer proves that the renewer keeps the lease of a row
// nobody locked while locked rows' lone settlements wait on the pool: otherwise its round
// finds no connection, the lease of a handler running past it runs out, and another
// process delivers the row a second time while the first delivery still runs.
func TestBusyRowsSettledAloneDoNotStarveTheRenewer(t *testing.T) {
	t.Parallel()
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
			}, rowactor.Workers(len(ids)), rowactor.Lease(3*time.Second)) // three leases' worth of margin under the suite's load, still half the hold below
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
			// The free row's handler runs on, twice its lease: the renewer must keep it.
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

// TestBusyRowsSettledAloneDoNotStarveTheClaimer proves that claims and publishes go on while
// locked rows' lone settlements wait: a free worker gets a due row within a poll interval,
// and a publish through the broker does not wait for other rows' locks.
func TestBusyRowsSettledAloneDoNotStarveTheClaimer(t *testing.T) {
	t.Parallel()
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

// TestBusyLaneRowWhoseLockEndedIsNotHeldBehindALongLock proves that a busy row whose lock
// ended at once is acked by its own delivery, not left waiting in the busy lane behind a
// row another session holds for long. Waiting there, its lease would be pinned and not
// renewed, run out, and another process would deliver the row a second time although its
// handler acked long before.
func TestBusyLaneRowWhoseLockEndedIsNotHeldBehindALongLock(t *testing.T) {
	t.Parallel()
	for _, drv := range serverDrivers() {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			b := h.broker()
			ids := h.publish(b, 2)
			long, short := ids[0], ids[1]
			release := map[int64]chan struct{}{long: make(chan struct{}), short: make(chan struct{})}
			started := make(chan int64, 4)
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				started <- d.ID()
				<-release[d.ID()]
				return rowactor.Ack()
			}, rowactor.Workers(2), rowactor.Lease(2*time.Second))
			for range ids {
				select {
				case <-started:
				case <-time.After(15 * time.Second):
					t.Fatal("the rows were not all delivered")
				}
			}
			second := newCalls()
			h.subscribe(h.second(), func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				second.add(d)
				return rowactor.Ack()
			}, rowactor.Workers(2), rowactor.Lease(2*time.Second))

			endLong := holdRow(t, h, long) // a long report holds this row
			defer endLong()
			close(release[long]) // its ack waits in the lane
			time.Sleep(300 * time.Millisecond)
			endShort := holdRow(t, h, short) // a moment's lock on the other
			close(release[short])            // its ack is busy: into the lane, behind the long one
			time.Sleep(300 * time.Millisecond)
			endShort()

			deadline := time.Now().Add(6 * time.Second)
			for h.row(short).exists && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			n := len(second.of(short))
			exists := h.row(short).exists
			endLong()
			if n > 0 || exists {
				t.Fatalf("row %d, acked by its handler and locked for 300 ms only, was not acked by its own delivery within 6 s "+
					"(still there: %v; delivered again by another process %d times): its ack waited in the busy lane behind row %d, "+
					"which another session held, with its lease pinned and not renewed\nlogs:\n%s",
					short, exists, n, long, h.logs.String())
			}
		})
	}
}
