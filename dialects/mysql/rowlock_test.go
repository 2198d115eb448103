package mysql

import (
	"context"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

func claimLocked(t *testing.T, q dialects.RowLockQueue) dialects.LockedClaim {
	t.Helper()
	c, ok, err := q.ClaimLocked(ctx, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatal("no row claimed")
	}
	return c
}

// The claim transaction runs at the declared level (READ COMMITTED when none is), told
// apart by what its reads see of another transaction's update to a probe row, and the
// level applies to that transaction only.
func TestRowLockIsolation(t *testing.T) {
	d := newDialect(t)
	probe := tableName(t, d, "ra_probe")
	mustExec(t, d.DB(), "CREATE TABLE "+quote(probe)+" (id INT PRIMARY KEY, v INT NOT NULL)")
	mustExec(t, d.DB(), "INSERT INTO "+quote(probe)+" VALUES (1, 0)")
	read := "SELECT v FROM " + quote(probe) + " WHERE id = 1"
	for _, c := range []struct {
		level dialects.Isolation
		// what the claim transaction reads: before the update, while it is uncommitted
		// (-1: blocked), after its commit.
		want [3]int
	}{
		{"", [3]int{0, 0, 1}},
		{dialects.ReadCommitted, [3]int{0, 0, 1}},
		{dialects.ReadUncommitted, [3]int{0, 1, 1}},
		{dialects.RepeatableRead, [3]int{0, 0, 0}},
		{dialects.Serializable, [3]int{0, -1, -1}},
	} {
		t.Run(string(c.level), func(t *testing.T) {
			mustExec(t, d.DB(), "UPDATE "+quote(probe)+" SET v = 0")
			tbl := newTable(t, d, "ra_iso", func(name string) dialects.Table {
				tbl := rowLockTable(name)
				tbl.Isolation = c.level
				return tbl
			})
			dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
			q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl})
			claim := claimLocked(t, q)
			defer claim.Rollback(ctx)
			tx := claim.(*lockedClaim).Tx()
			if _, err := tx.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
				t.Fatal(err)
			}
			var got [3]int
			look := func(i int) {
				if err := tx.QueryRowContext(ctx, read).Scan(&got[i]); err != nil {
					if !IsRetryable(err) {
						t.Fatal(err)
					}
					got[i] = -1
				}
			}
			look(0)
			other, err := d.DB().BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Rollback()
			if _, err := other.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
				t.Fatal(err)
			}
			_, err = other.ExecContext(ctx, "UPDATE "+quote(probe)+" SET v = 1")
			if _, err := other.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = DEFAULT"); err != nil {
				t.Fatal(err)
			}
			switch {
			case IsRetryable(err):
				// SERIALIZABLE: the claim's read holds a shared lock on the row.
				got[1], got[2] = -1, -1
			case err != nil:
				t.Fatal(err)
			default:
				look(1)
				if err := other.Commit(); err != nil {
					t.Fatal(err)
				}
				look(2)
			}
			if got != c.want {
				t.Errorf("declared %q: the claim read %v, want %v", c.level, got, c.want)
			}
		})
	}
}

// A claim whose connection died rolls back with an error and the connection never
// returns to the pool; the server rolled the transaction back, so the row is free.
func TestRowLockRollbackOnADeadConnection(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_dead", rowLockTable)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl})
	claim := claimLocked(t, q)
	var conn int64
	if err := claim.(*lockedClaim).Tx().QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&conn); err != nil {
		t.Fatal(err)
	}
	mustExec(t, d.DB(), "KILL ?", conn)
	waitGone(t, d.DB(), conn)
	if err := claim.Rollback(ctx); err == nil {
		t.Error("a rollback on a killed connection reported success")
	}
	// No pooled connection is the killed one.
	for range 5 {
		var got int64
		if err := d.DB().QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&got); err != nil {
			t.Fatalf("the pool handed out a dead connection: %v", err)
		}
	}
	c := claimLocked(t, q)
	if c.Row().ID != id {
		t.Fatalf("claimed %d", c.Row().ID)
	}
	c.Rollback(ctx)
}

// A settlement whose context ends mid-transaction leaves nothing open.
func TestRowLockSettleCancelled(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_cncl", rowLockTable)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl})
	claim := claimLocked(t, q)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := claim.Settle(cctx, dialects.Step{Kind: dialects.StepAck}); err == nil {
		t.Fatal("a cancelled settlement succeeded")
	}
	c := claimLocked(t, q)
	if c.Row().ID != id {
		t.Fatalf("claimed %d", c.Row().ID)
	}
	c.Rollback(ctx)
}
