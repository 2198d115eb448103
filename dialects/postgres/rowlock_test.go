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

// A row lock claim sends its BEGIN with its statement, and a settlement its statement
// with its COMMIT: a round trip each, with every query execution mode a pool may use.
// The rows are settled as the steps say, and a settlement whose statement fails commits
// nothing: the row comes back with its attempt as it was.
func TestARowLockClaimAndItsSettlementTakeARoundTripEach(t *testing.T) {
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			var writes atomic.Int64
			pc, err := pgxpool.ParseConfig(withParams(testURL(), "pool_max_conns=1", "default_query_exec_mode="+mode))
			if err != nil {
				t.Fatal(err)
			}
			dialer := &net.Dialer{}
			pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := dialer.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return writeCounter{c, &writes}, nil
			}
			pool, err := pgxpool.NewWithConfig(ctx, pc)
			if err != nil {
				t.Fatal(err)
			}
			d := New(pool)
			t.Cleanup(func() { d.Close(); pool.Close() })
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
