package postgres

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

func claimLocked(t *testing.T, q dialects.RowLockQueue, now time.Time) (dialects.LockedClaim, bool) {
	t.Helper()
	c, ok, err := q.ClaimLocked(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	return c, ok
}

// acquired is how many of the pool's connections are in use.
func acquired(d *Dialect) int32 { return d.Pool().Stat().AcquiredConns() }

func TestRowLockIsolation(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	for level, want := range map[dialects.Isolation]string{
		"":                      "read committed", // the server's default
		dialects.ReadCommitted:  "read committed",
		dialects.RepeatableRead: "repeatable read",
		dialects.Serializable:   "serializable",
	} {
		tbl.Isolation = level
		q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl})
		c, ok := claimLocked(t, q, t0)
		if !ok {
			t.Fatalf("%q: nothing claimed", level)
		}
		var got string
		lc := c.(*lockedClaim)
		if err := lc.conn.QueryRow(ctx, "SHOW transaction_isolation").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("declared %q: the claim runs at %q", level, got)
		}
		if err := c.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A claim whose rollback fails closes its connection: the server rolls back.
func TestRowLockRollbackFailureClosesTheConnection(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl})
	c, _ := claimLocked(t, q, t0)
	lc := c.(*lockedClaim)
	var pid int
	if err := lc.conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	mustExec(t, d, "SELECT pg_terminate_backend($1)", pid)
	if err := c.Rollback(ctx); err == nil {
		t.Fatal("a rollback on a dead connection reported success")
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held", n)
	}
	waitGone(t, d, pid) // pg_terminate_backend only signals the backend
	if c, ok := claimLocked(t, q, t0); !ok || c.Row().ID != id {
		t.Fatal("the row did not return")
	} else {
		c.Rollback(ctx)
	}
}

// waitGone waits until a backend has exited (and so rolled back).
func waitGone(t *testing.T, d *Dialect, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for count(t, d, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("backend %d did not exit", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// writeCounter counts the writes on a connection's socket: pgx writes once per round
// trip, when it flushes what it queued for the server.
type writeCounter struct {
	net.Conn
	n *atomic.Int64
}

func (w writeCounter) Write(b []byte) (int, error) {
	w.n.Add(1)
	return w.Conn.Write(b)
}

// countingPool opens a dialect on a pool of its own (params) whose connections count
// their writes in writes.
func countingPool(t *testing.T, writes *atomic.Int64, params ...string) (*Dialect, *pgxpool.Pool) {
	t.Helper()
	pc, err := pgxpool.ParseConfig(withParams(testURL(), params...))
	if err != nil {
		t.Fatal(err)
	}
	dialer := &net.Dialer{}
	pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{c, writes}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	d := New(pool)
	t.Cleanup(func() { d.Close(); pool.Close() })
	return d, pool
}

// A row lock claim sends its BEGIN with its statement, and a settlement its statement
// with its COMMIT: a round trip each, with every query execution mode a pool may use.
// The rows are settled as the steps say, and a settlement whose statement fails commits
// nothing: the row comes back with its attempt as it was.
func TestARowLockClaimAndItsSettlementTakeARoundTripEach(t *testing.T) {
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			var writes atomic.Int64
			d, pool := countingPool(t, &writes, "pool_max_conns=1", "default_query_exec_mode="+mode)
			tbl := rowLockTable(tableName(t, d))
			tbl.Isolation = dialects.RepeatableRead
			createTable(t, d, tbl)
			var ids []int64
			for range 5 {
				ids = append(ids, dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")}))
			}
			q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl})
			trips := func(f func()) int64 {
				t.Helper()
				before := writes.Load()
				f()
				return writes.Load() - before
			}
			// The first claim and settlement prepare their statements (a round trip more
			// in the cached modes); the rest are timed.
			var c dialects.LockedClaim
			trips(func() { c, _ = claimLocked(t, q, t0) })
			if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetry, Now: t0}); err != nil {
				t.Fatal(err)
			}
			// The row's attempt goes no higher: a second retry's statement fails.
			first, _ := stateOf(t, d, tbl, ids[0])
			mustExec(t, d, "ALTER TABLE "+quote(tbl.Name)+" ADD CHECK (attempt <= "+strconv.Itoa(first.Attempt)+")")
			// describe_exec describes each statement before it runs: a round trip more, for
			// every statement of the pipeline at once.
			perStep := int64(1)
			if mode == "describe_exec" {
				perStep = 2
			}
			var level string
			for i, want := range ids {
				var ok bool
				if n := trips(func() { c, ok = claimLocked(t, q, t0) }); n != perStep && i > 0 {
					t.Errorf("claim %d: %d round trips, want %d", i, n, perStep)
				}
				if !ok || c.Row().ID != want {
					t.Fatalf("claim %d: got %v (claimed %v), want row %d", i, c, ok, want)
				}
				if i == 1 {
					if err := c.(*lockedClaim).tx.QueryRow(ctx, "SHOW transaction_isolation").Scan(&level); err != nil {
						t.Fatal(err)
					}
				}
				step := dialects.Step{Kind: dialects.StepAck, Now: t0}
				if i == 0 {
					step = dialects.Step{Kind: dialects.StepRetry, Now: t0}
				}
				var serr error
				if n := trips(func() { serr = c.Settle(ctx, step) }); n != perStep && i > 0 {
					t.Errorf("settlement %d: %d round trips, want %d", i, n, perStep)
				}
				if i == 0 {
					// The second retry breaks the CHECK: nothing of it is committed.
					if serr == nil {
						t.Fatal("a settlement whose statement failed reported success")
					}
					if st, ok := stateOf(t, d, tbl, want); !ok || st.Attempt != first.Attempt {
						t.Fatalf("after a failed settlement the row is %+v (exists %v), want attempt %d", st, ok, first.Attempt)
					}
					// It is unlocked: the next claim takes it again.
					mustExec(t, d, "ALTER TABLE "+quote(tbl.Name)+" DROP CONSTRAINT "+quote(tbl.Name+"_attempt_check"))
					c, ok = claimLocked(t, q, t0)
					if !ok || c.Row().ID != want {
						t.Fatalf("the row of the failed settlement did not come back: got %v", c)
					}
					if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}); err != nil {
						t.Fatal(err)
					}
				} else if serr != nil {
					t.Fatal(serr)
				}
				if _, ok := stateOf(t, d, tbl, want); ok {
					t.Fatalf("row %d is still in the table after its ack", want)
				}
			}
			if level != "repeatable read" {
				t.Errorf("the claim transaction ran at %q, want repeatable read", level)
			}
			if _, ok, err := q.ClaimLocked(ctx, t0); err != nil || ok {
				t.Fatalf("an empty queue's claim: claimed %v, %v", ok, err)
			}
			if n := pool.Stat().AcquiredConns(); n != 0 {
				t.Fatalf("%d connections held after the settlements", n)
			}
		})
	}
}

// A row lock claim that settles and claims the next row does both in the settlement's
// round trip, on its connection: every row is settled once, in order, each claimed row
// stays locked against other claims, and the claim after the last row finds none and
// gives the connection back. A settlement whose statement fails claims nothing and
// commits nothing; a release (nothing to write) rolls back and claims the row again.
func TestARowLockSettlementClaimsTheNextRowInItsRoundTrip(t *testing.T) {
	var writes atomic.Int64
	d, pool := countingPool(t, &writes, "pool_max_conns=2")
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	var ids []int64
	for range 6 {
		ids = append(ids, dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")}))
	}
	// A retry's statement fails; an ack deletes, a release writes nothing.
	published, _ := stateOf(t, d, tbl, ids[0])
	mustExec(t, d, "ALTER TABLE "+quote(tbl.Name)+" ADD CHECK (attempt <= "+strconv.Itoa(published.Attempt)+")")
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl})
	c, ok := claimLocked(t, q, t0)
	if !ok || c.Row().ID != ids[0] {
		t.Fatalf("first claim: %v %v", c, ok)
	}
	ack := dialects.Step{Kind: dialects.StepAck, Now: t0}
	for i := 1; i < len(ids); i++ {
		before := writes.Load()
		next, serr, cerr := c.(dialects.ChainingClaim).SettleAndClaim(ctx, ack, t0)
		if serr != nil || cerr != nil {
			t.Fatalf("row %d: settle %v, claim %v", i, serr, cerr)
		}
		// The first run prepares the pipeline's statements: a round trip more.
		if n := writes.Load() - before; n != 1 && i > 1 {
			t.Errorf("settle and claim %d: %d round trips, want 1", i, n)
		}
		if _, ok := stateOf(t, d, tbl, ids[i-1]); ok {
			t.Fatalf("row %d is still in the table after its ack", ids[i-1])
		}
		if next == nil || next.Row().ID != ids[i] {
			t.Fatalf("settle and claim %d claimed %v, want row %d", i, next, ids[i])
		}
		// Locked: another claim passes over it.
		if other, ok := claimLocked(t, q, t0); ok {
			if other.Row().ID == ids[i] {
				t.Fatalf("row %d was claimed twice", ids[i])
			}
			if err := other.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		}
		c = next
	}
	// A release writes nothing: it rolls back, and the row is the first due again.
	next, serr, cerr := c.(dialects.ChainingClaim).SettleAndClaim(ctx, dialects.Step{Kind: dialects.StepRelease, Now: t0}, t0)
	if serr != nil || cerr != nil || next == nil || next.Row().ID != ids[5] {
		t.Fatalf("release and claim: %v, %v, %v", next, serr, cerr)
	}
	// A settlement whose statement fails (the CHECK) commits nothing and claims nothing.
	next, serr, cerr = next.(dialects.ChainingClaim).SettleAndClaim(ctx, dialects.Step{Kind: dialects.StepRetry, Now: t0}, t0)
	if serr == nil || cerr != nil || next != nil {
		t.Fatalf("a failing retry and claim: %v, %v, %v", next, serr, cerr)
	}
	if st, ok := stateOf(t, d, tbl, ids[5]); !ok || st.Attempt != published.Attempt {
		t.Fatalf("after a failed settlement the row is %+v (exists %v), want attempt %d", st, ok, published.Attempt)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections held after a failed settlement", n)
	}
	c, ok = claimLocked(t, q, t0)
	if !ok || c.Row().ID != ids[5] {
		t.Fatalf("the row of the failed settlement did not come back: %v", c)
	}
	next, serr, cerr = c.(dialects.ChainingClaim).SettleAndClaim(ctx, ack, t0)
	if serr != nil || cerr != nil || next != nil {
		t.Fatalf("the last ack and claim: %v, %v, %v", next, serr, cerr)
	}
	if n := count(t, d, "SELECT count(*) FROM "+quote(tbl.Name)); n != 0 {
		t.Fatalf("%d rows left", n)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections held after the queue ran dry", n)
	}
}
