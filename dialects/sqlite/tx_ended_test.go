package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// SQLite ends a transaction by itself after some errors: an interrupted write
// (sqlite3_interrupt, which the driver calls when a statement's context ends), or
// SQLITE_FULL, SQLITE_IOERR or SQLITE_NOMEM where the statement cannot be undone alone.
// The connection is then in autocommit, and the *sql.Tx does not know: a handler that goes
// on writing through it must not commit anything, and the settlement must report an error
// wrapping dialects.ErrTxEnded rather than commit.

// endings are the ways a handler's transaction is ended by SQLite, each run through tx.
var endings = []struct {
	name string
	end  func(t *testing.T, tx *sql.Tx)
}{
	{"interrupted write", func(t *testing.T, tx *sql.Tx) {
		c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := tx.ExecContext(c, "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 1000000000) "+
			"INSERT INTO notes (v) SELECT 'bulk' FROM n")
		// The driver reports the context's error; SQLite reported SQLITE_INTERRUPT.
		if !errors.Is(err, context.DeadlineExceeded) && (err == nil || !strings.Contains(err.Error(), "interrupt")) {
			t.Fatalf("want the bulk write interrupted, got %v", err)
		}
	}},
	{"disk full", func(t *testing.T, tx *sql.Tx) {
		var pages int64
		if err := tx.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "PRAGMA max_page_count = "+strconv.FormatInt(pages, 10)); err != nil {
			t.Fatal(err)
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO notes (v) VALUES (?)", strings.Repeat("x", 1<<20))
		if err == nil || !strings.Contains(err.Error(), "full") {
			t.Fatalf("want SQLITE_FULL, got %v", err)
		}
	}},
}

// endedHandler writes a debit through tx, has SQLite end the transaction, and writes a
// credit (whose failure, if any, it ignores).
func endedHandler(t *testing.T, tx *sql.Tx, end func(*testing.T, *sql.Tx)) {
	t.Helper()
	note(t, tx, "debit")
	end(t, tx)
	_, _ = tx.ExecContext(ctx, "INSERT INTO notes (v) VALUES ('credit')")
}

func noNotes(t *testing.T, d *Dialect) {
	t.Helper()
	if n := notes(t, d); n != 0 {
		t.Errorf("%d of the handler's writes were committed (debit, credit or bulk)", n)
	}
}

func TestTxEndedBySQLiteLease(t *testing.T) {
	for _, e := range endings {
		t.Run(e.name, func(t *testing.T) {
			d := newDialect(t)
			tbl := leaseTable("jobs")
			txFixture(t, d, tbl)
			q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true})
			held := dialecttest.ClaimOne(t, d, q, tbl)
			ltx, tx := beginLease(t, q)
			endedHandler(t, tx, e.end)

			ok, err := ltx.SettleLease(ctx, ack(), held)
			if ok || !errors.Is(err, dialects.ErrTxEnded) {
				t.Errorf("the Ack returned %v %v, want an error wrapping dialects.ErrTxEnded", ok, err)
			}
			noNotes(t, d)
			// The row keeps the delivery's lease, to expire or be released.
			s, found := stateOf(t, d, "jobs", held.ID)
			if !found || s.LockedUntil != formatTime(held.Token) || s.Attempt != 2 {
				t.Fatalf("row %+v (exists %v), want it leased at attempt 2", s, found)
			}
			if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepRelease}, held); !ok || err != nil {
				t.Fatalf("release: %v %v", ok, err)
			}
			noNotes(t, d)
			// The pool's connections write and commit as before.
			mustExec(t, d, "INSERT INTO notes (v) VALUES ('pool')")
			if n := notes(t, d); n != 1 {
				t.Errorf("%d notes after a write through the pool, want 1", n)
			}
			if n := d.DB().Stats().InUse; n != 0 {
				t.Errorf("%d connections still in use", n)
			}
		})
	}
}

func TestTxEndedBySQLiteAdvisory(t *testing.T) {
	for _, e := range endings {
		t.Run(e.name, func(t *testing.T) {
			d, q, tbl := advisoryTxFixture(t)
			s, tx, id := takeTx(t, d, q, tbl)
			endedHandler(t, tx, e.end)

			// The Ack as the runtime runs it: the settlement, the commit, the unlock.
			err := s.Settle(ctx, ack(), id)
			if err == nil {
				err = s.Commit(ctx)
			} else if cerr := s.Commit(ctx); cerr == nil {
				t.Error("Commit after a failed settlement reported success")
			}
			if !errors.Is(err, dialects.ErrTxEnded) {
				t.Errorf("the Ack returned %v, want an error wrapping dialects.ErrTxEnded", err)
			}
			if _, err := s.Unlock(ctx); err != nil {
				t.Errorf("unlock: %v", err)
			}
			noNotes(t, d)
			if processed(t, d, id) {
				t.Error("the row was acked")
			}
			cands, err := q.Candidates(ctx, t0, 10)
			if err != nil || len(cands) != 1 || cands[0].ID != id {
				t.Fatalf("the row is not a candidate again: %v %v", cands, err)
			}
			if n := d.DB().Stats().InUse; n != 0 {
				t.Errorf("%d connections still in use", n)
			}
		})
	}
}
