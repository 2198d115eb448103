package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/rowactortest"
	"github.com/rowactor/rowactor/settler"
)

// A settlement that waits for a row another session holds (a report reading it FOR
// UPDATE, an operator's transaction; on SQLite, another process's write transaction,
// SQLITE_BUSY up to busy_timeout) must not hold Shutdown past its context: when ctx
// ends, the wait ends, the broker holds nothing on the server afterwards (no statement
// waiting in the lock's queue, no key), the settlement is reported ErrClosed, and it never
// takes effect later. Its row is not lost: once the other session lets go and the lease
// (fenced by its token) runs out, the row is claimed again and settled once. Before the
// fix, Shutdown with a 1 s context took the settle timeout (30 s; on SQLite busy_timeout,
// 10 s): the lease form's busy lane and single-row statements waited on contexts of their
// own, and on SQLite so did a claim in flight.
func TestShutdownEndsASettlementWaitingForALockedRow(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		form    rowactor.Form
		tx      bool
		outcome rowactor.Outcome
		// step, when set, is the step the cut settlement reports: the outcome's own.
		step string
	}{
		// An ack goes through the lease form's batcher and, its row busy, its busy lane.
		// It is queued there with no goroutine waiting for it: the stop waits for its
		// answer and reports it, and never releases the row in its place.
		{"lease ack", rowactor.FormLease, false, rowactor.Ack(), "ack"},
		// RetryAfter and Fail carry a time per row: single-row statements.
		{"lease retry after", rowactor.FormLease, false, rowactor.RetryAfter(time.Hour), ""},
		{"lease fail", rowactor.FormLease, false, rowactor.Fail(errors.New("the payment service said no")), ""},
		// Settled inside the delivery's own transaction.
		{"lease transactional ack", rowactor.FormLease, true, rowactor.Ack(), ""},
		// On the session that holds the row's key.
		{"advisory ack", rowactor.FormAdvisory, false, rowactor.Ack(), ""},
		{"advisory transactional ack", rowactor.FormAdvisory, true, rowactor.Ack(), ""},
	}
	for _, drv := range drivers {
		for _, c := range cases {
			if drv.name == "sqlite" && c.tx {
				// A transactional delivery holds SQLite's write lock itself.
				continue
			}
			t.Run(drv.name+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, drv, c.form, withProcessedAt)
				h.tx = c.tx
				// Both brokers go by clock: the test moves it past the lease once the other
				// session let go, rather than waiting for the lease to run out.
				clock := rowactortest.NewClock()
				b := h.broker(rowactor.WithClock(clock))
				opts := []rowactor.SubscribeOption{rowactor.RetryPolicy(func(int, error) time.Duration { return time.Hour })}
				const lease = 2 * time.Second
				if c.form == rowactor.FormLease {
					opts = append(opts, rowactor.Lease(lease))
				}
				id, unlock := settleBehindLockedRow(t, h, b, c.outcome, opts...)
				defer unlock()

				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				start := time.Now()
				_, err := b.Shutdown(ctx)
				// Shutdown's own bound is 1.5 s past its context; 4 s leaves room for a loaded
				// CI machine (it took 4.1 s once, with MariaDB stalled), and the bug this
				// guards took the settle timeout, 30 s.
				if took := time.Since(start); took > 5*time.Second {
					t.Errorf("Shutdown with a 1 s context took %v behind a settlement waiting for a locked row", took)
				}
				if !errors.Is(err, rowactor.ErrNotDrained) {
					t.Errorf("Shutdown: %v, want ErrNotDrained", err)
				}
				s := h.waitSettled(1)[0]
				if s.ID != id || !errors.Is(s.Err, rowactor.ErrClosed) || c.step != "" && s.Step != c.step {
					t.Errorf("settlement %+v, want row %d's ending in ErrClosed (step %q where given)", s, id, c.step)
				}

				// Nothing of the broker's waits for the lock any more, nor holds the key,
				// while the other session still holds the row (a server session the broker
				// closed may take a moment to go; one left waiting would stay until then).
				waitFor(t, func() bool { return lockWaiters(t, h) == 0 })
				if c.form == rowactor.FormAdvisory && h.drv.keyLocked != nil {
					waitFor(t, func() bool { return !h.drv.keyLocked(t, h.d, fmt.Sprintf("%s-%d", h.table.Name, id)) })
				}
				r := h.row(id)
				if !r.exists || r.processedAt != nil || r.retryAfter != nil || r.attempt != attemptColumn(c.form, 1, 0) {
					t.Fatalf("row after Shutdown %+v, want it unsettled after one delivery", r)
				}
				if c.form == rowactor.FormLease && r.lockedUntil == nil {
					t.Error("the lease was cleared: a release cannot have run past another session's lock")
				}

				// The other session lets go; whatever the server still had of the cut
				// settlement must not run now. Once the lease runs out, the row is claimed
				// again and settled once.
				unlock()
				var calls atomic.Int32
				b2 := h.second(rowactor.WithClock(clock))
				h2 := *h
				h2.tx = false
				h2.subscribe(b2, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
					calls.Add(1)
					return rowactor.Ack()
				})
				clock.Advance(lease + time.Second) // the lease the cut settlement left runs out
				waitFor(t, func() bool { return h.row(id).processedAt != nil })
				r = h.row(id)
				if r.attempt != attemptColumn(c.form, 2, 0) || r.lockedUntil != nil || r.retryAfter != nil {
					t.Errorf("row after its second delivery %+v, want it processed after two deliveries", r)
				}
				if s := h.waitSettled(1)[0]; s.ID != id || s.Err != nil || s.Step != "ack" || s.Attempt != 2 {
					t.Errorf("second settlement %+v, want row %d acked at attempt 2", s, id)
				}
				h.quiet(300 * time.Millisecond)
				if n := calls.Load(); n != 1 {
					t.Errorf("the row was handled %d times after Shutdown, want once", n)
				}
			})
		}
	}
}

// The lease renewer retries a lease whose row another session holds with a statement
// that waits for the lock, up to an eighth of a lease: with a 40 s lease, Shutdown with a
// 1 s context took 5 s when it came during such a wait. The wait ends with the stop (a
// wait cut short moves nothing), and the row's lease runs out as it would have.
//
// The renewer's rounds come each half lease, and at once when a row that waited for a
// worker starts with less than half a lease left. So as not to wait 20 s for the first
// round, the brokers' clock is moved forward most of half a lease while a second row
// waits behind a third, and the third's handler then returns: the waiting row starts,
// asks for a round, and that round finds the held row busy. Its retry, an eighth of a
// lease later, waits for the row as the half-lease round's would.
func TestShutdownEndsALeaseExtensionWaitingForALockedRow(t *testing.T) {
	t.Parallel()
	const lease = 40 * time.Second
	for _, drv := range serverDrivers() {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			clock := rowactortest.NewClock()
			b := h.broker(rowactor.WithClock(clock))
			started := make(chan int64, 3)
			release, next := make(chan struct{}), make(chan struct{})
			defer close(release)
			var calls atomic.Int32
			sub := h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
				started <- d.ID()
				switch calls.Add(1) {
				case 1: // the row the test holds
					<-release // ignores its context: its row is released at the stop
				case 2: // the row the waiting one waits behind
					<-next
				}
				return rowactor.Ack()
			}, rowactor.Lease(lease), rowactor.Workers(2), rowactor.Prefetch(1))
			deliver := func() int64 {
				t.Helper()
				id := h.publish(b, 1)[0]
				select {
				case got := <-started:
					if got != id {
						t.Fatalf("delivered row %d, want %d", got, id)
					}
				case <-time.After(15 * time.Second):
					t.Fatal("the row was not delivered in 15 s")
				}
				return id
			}
			id := deliver()
			deliver()
			h.publish(b, 1) // claimed, it waits for a worker
			waitFor(t, func() bool { return sub.InWork() == 3 })
			unlock := holdRow(t, h, id)
			defer unlock()
			// Less than half a lease is left to the waiting row when it starts: it asks
			// for a round at once. No lease runs out.
			clock.Advance(lease/2 + lease/10)
			close(next)
			// The round finds the held row busy; its retry waits for the row.
			deadline := time.Now().Add(lease)
			for lockWaiters(t, h) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the renewer never waited for the row")
				}
				time.Sleep(50 * time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			start := time.Now()
			_, _ = b.Shutdown(ctx)
			if took := time.Since(start); took > 5*time.Second { // as above
				t.Errorf("Shutdown with a 1 s context took %v behind a lease extension waiting for a locked row", took)
			}
			// The stop ended the wait: a renewer that kept waiting would stay on the
			// server until its retry's own limit, an eighth of the lease (5 s) after it
			// began.
			for gone := time.Now().Add(time.Second); lockWaiters(t, h) > 0; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(gone) {
					t.Fatal("the renewer's statement still waits for the row a second after Shutdown returned")
				}
			}
			if r := h.row(id); !r.exists || r.processedAt != nil || r.lockedUntil == nil {
				t.Errorf("row after Shutdown %+v, want it leased still, to run out", r)
			}
		})
	}
}

// settleBehindLockedRow sets up a settlement that waits for a row another session holds:
// it publishes a row and subscribes to it on b with a handler that returns outcome; while
// the handler runs, a session of the test's own takes the row FOR UPDATE (holdRow). It
// returns once the settlement waits for that lock on the server, with the row's id and
// the end of the other session's hold (which may be called more than once). SQLite has no
// row locks: there the other session holds the file's write lock (holdWriteLock), and it
// returns once the handler returned. The lock form's claim holds its row itself: use it
// with the lease and advisory forms. The harness's tx decides transactional mode; opts
// A lease-form step that no batch takes (RetryAfter, Fail, a dead-letter move, a
// give-back of an unstarted row) and that Shutdown's stop cut short while it waited for a
// row another session held is reported cut (ErrCutByStop), and it never takes effect
// later. PostgreSQL learns that pgx gave up on a statement only from a cancel request,
// sent on a new connection and best effort (a proxy, a slow network): here the pool's
// dialer delays it 3 s, and the other session lets the row go meanwhile. The step runs in
// a transaction that commits only after its result was read, so the orphan rolls back
// instead of committing as an autocommit UPDATE did.
func TestASettlementCutBehindALockedRowNeverTakesEffectWhenTheCancelIsSlow(t *testing.T) {
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
	h := newHarness(t, drv, rowactor.FormLease, withProcessedAt)

	cfg, err := pgxpool.ParseConfig(postgresURL())
	if err != nil {
		t.Fatal(err)
	}
	var slow atomic.Bool
	var dialer net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if slow.Load() {
			time.Sleep(3 * time.Second) // a slow path to the server: the cancel request lands late
		}
		return dialer.DialContext(ctx, network, addr)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// Warm a few connections, so the stop's own statements need no new dial.
	var conns []*pgxpool.Conn
	for range 4 {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	b := h.brokerOn(postgres.New(pool))

	id, unlock := settleBehindLockedRow(t, h, b, rowactor.RetryAfter(time.Hour),
		rowactor.Lease(30*time.Second), rowactor.RetryPolicy(func(int, error) time.Duration { return time.Hour }))
	defer unlock()
	slow.Store(true)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = b.Shutdown(ctx)
	t.Logf("Shutdown: %v", err)
	s := h.waitSettled(1)[0]
	t.Logf("settlement: id %d step %s err %v", s.ID, s.Step, s.Err)
	if s.ID != id || !errors.Is(s.Err, rowactor.ErrClosed) {
		t.Fatalf("settlement %+v, want row %d's ending in ErrClosed", s, id)
	}
	before := h.row(id)
	if before.lockedUntil == nil || before.retryAfter != nil {
		t.Fatalf("row as Shutdown returned %+v: the step had taken effect already", before)
	}

	unlock() // the other session lets go, before the cancel request lands
	time.Sleep(time.Second)
	after := h.row(id)
	if errors.Is(s.Err, settler.ErrCutByStop) && (after.lockedUntil == nil || after.retryAfter != nil) {
		t.Errorf("the settlement was reported cut before it took effect (%v), but once the other session let go it committed: "+
			"row before %+v, after %+v (lease cleared: %v, retry_after set: %v)",
			s.Err, before, after, after.lockedUntil == nil, after.retryAfter != nil)
	}
}

// add to the subscription's options.
func settleBehindLockedRow(t *testing.T, h *harness, b *rowactor.Broker, outcome rowactor.Outcome,
	opts ...rowactor.SubscribeOption) (id int64, unlock func()) {
	t.Helper()
	started := make(chan int64, 1)
	locked, returned := make(chan struct{}), make(chan struct{})
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- d.ID()
		<-locked
		defer close(returned)
		return outcome
	}, opts...)
	id = h.publish(b, 1)[0]
	select {
	case got := <-started:
		if got != id {
			t.Fatalf("delivered row %d, want %d", got, id)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the row was not delivered in 15 s")
	}
	if h.drv.name == "sqlite" {
		unlock = holdWriteLock(t, h)
		close(locked)
		<-returned
		return id, unlock
	}
	unlock = holdRow(t, h, id)
	close(locked)
	waitFor(t, func() bool { return lockWaiters(t, h) > 0 })
	return id, unlock
}

// holdWriteLock has a connection of the test's own, on a pool of its own, take the
// SQLite file's write lock (BEGIN IMMEDIATE), as another process would; it returns the
// transaction's end (which may be called more than once). Writers wait for it in the busy
// handler, up to busy_timeout.
func holdWriteLock(t *testing.T, h *harness) (end func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := sqliteDB(h.newD()).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	end = func() {
		once.Do(func() {
			_, _ = conn.ExecContext(ctx, "ROLLBACK")
			_ = conn.Close()
		})
	}
	t.Cleanup(end)
	return end
}

// lockWaiters counts the server's sessions whose statement on h's table waits for a lock.
func lockWaiters(t *testing.T, h *harness) int {
	t.Helper()
	like := "%" + h.table.Name + "%"
	switch h.drv.name {
	case "postgres":
		return h.drv.count(t, h.d, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE ?`, like)
	case "mysql":
		// information_schema.innodb_trx does not show MariaDB's autocommit statements
		// waiting for a lock: any statement on the table that ran 300 ms waits (a claim or
		// a poll ends well before).
		return h.drv.count(t, h.d, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE ID <> CONNECTION_ID() AND COMMAND <> 'Sleep' AND TIME_MS >= 300 AND INFO LIKE ?`, like)
	}
	// SQLite: this process's own statements, which have all returned once Shutdown did.
	return 0
}
