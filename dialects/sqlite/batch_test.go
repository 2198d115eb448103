package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// batchFixture is a lease table of n published rows in group "g", all claimed with the
// lease until t0+30s.
type batchFixture struct {
	d     *Dialect
	tbl   dialects.Table
	q     *leaseQueue
	held  []dialects.Lease
	until time.Time
}

func newBatchFixture(t *testing.T, n int, processed bool) *batchFixture {
	t.Helper()
	d := newDialect(t)
	tbl := leaseTable("jobs")
	if processed {
		tbl.ProcessedAt = "processed_at"
	}
	createTable(t, d, tbl)
	// One INSERT for all of them: n may be in the thousands.
	mustExec(t, d, "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?) "+
		"INSERT INTO jobs (payload, grp) SELECT x'78', 'g' FROM s", n)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	bq, ok := q.(dialects.LeaseBatchQueue)
	if !ok {
		t.Fatalf("%T is not a LeaseBatchQueue", q)
	}
	f := &batchFixture{d: d, tbl: tbl, q: bq.(*leaseQueue), until: t0.Add(30 * time.Second)}
	rows, err := f.q.ClaimLeases(ctx, t0, f.until, n)
	if err != nil || len(rows) != n {
		t.Fatalf("claimed %d rows of %d: %v", len(rows), n, err)
	}
	for _, r := range rows {
		f.held = append(f.held, dialects.Lease{ID: r.ID, Token: r.Token})
	}
	return f
}

// batchRow is a row as the batch tests see it; NULL reads as "NULL".
type batchRow struct {
	Attempt     int
	LockedUntil string
	ProcessedAt string
}

func (f *batchFixture) row(t *testing.T, id int64) (batchRow, bool) {
	t.Helper()
	processed := "'NULL'"
	if f.tbl.ProcessedAt != "" {
		processed = "ifnull(processed_at, 'NULL')"
	}
	var r batchRow
	err := f.d.DB().QueryRowContext(ctx, "SELECT attempt, ifnull(locked_until, 'NULL'), "+processed+
		" FROM jobs WHERE id = ?", id).Scan(&r.Attempt, &r.LockedUntil, &r.ProcessedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return r, true
}

// TestSettleLeasesEmpty: no leases, no statement: it does not even wait for the writer
// turn.
func TestSettleLeasesEmpty(t *testing.T) {
	f := newBatchFixture(t, 1, false)
	if err := f.q.f.lockWriter(ctx); err != nil {
		t.Fatal(err)
	}
	defer f.q.f.unlockWriter()
	c, cancel := context.WithCancel(ctx)
	cancel()
	for _, kind := range []dialects.StepKind{dialects.StepAck, dialects.StepRelease} {
		ids, err := f.q.SettleLeases(c, kind, t0, nil)
		if ids != nil || err != nil {
			t.Errorf("%v of no leases: %v, %v", kind, ids, err)
		}
	}
	if r, ok := f.row(t, f.held[0].ID); !ok || r.LockedUntil != formatTime(f.until) {
		t.Errorf("row changed: %+v (exists %v)", r, ok)
	}
}

// TestSettleLeasesWriterTurn: the statement runs in this process's writer turn, like every
// other write of the dialect.
func TestSettleLeasesWriterTurn(t *testing.T) {
	f := newBatchFixture(t, 2, false)
	if err := f.q.f.lockWriter(ctx); err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := f.q.SettleLeases(c, dialects.StepAck, t0, f.held)
	f.q.f.unlockWriter()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("settled while another write held the turn: %v", err)
	}
	if n := count(t, f.d, "SELECT count(*) FROM jobs"); n != 2 {
		t.Fatalf("%d rows left, want 2", n)
	}
	ids, err := f.q.SettleLeases(ctx, dialects.StepAck, t0, f.held)
	if err != nil || len(ids) != 2 {
		t.Fatalf("once the turn is free: %v, %v", ids, err)
	}
}
