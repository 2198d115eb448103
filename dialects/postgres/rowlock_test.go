package postgres

import (
	"testing"
	"time"

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
