package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
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
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
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

func sorted(ids []int64) []int64 {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	return ids
}

func leaseIDs(held []dialects.Lease) []int64 {
	out := make([]int64, len(held))
	for i, l := range held {
		out[i] = l.ID
	}
	return out
}

// TestSettleLeases settles many leases in one statement: rows that still hold their
// tokens are acked (deleted, or marked processed with the lease cleared) or released; a row
// whose token moved on, or that is gone, is left as it is and missing from the result.
func TestSettleLeases(t *testing.T) {
	for _, processed := range []bool{false, true} {
		name := "ack deletes"
		if processed {
			name = "ack marks processed"
		}
		t.Run(name, func(t *testing.T) {
			f := newBatchFixture(t, 8, processed)
			held := f.held
			// Row 2's lease went to another claim; row 5 was deleted by someone else.
			other := f.until.Add(time.Hour)
			mustExec(t, f.d, "UPDATE jobs SET locked_until = ? WHERE id = ?", formatTime(other), held[2].ID)
			mustExec(t, f.d, "DELETE FROM jobs WHERE id = ?", held[5].ID)

			now := t0.Add(time.Second)
			acked, err := f.q.SettleLeases(ctx, dialects.StepAck, now, held[:3])
			if err != nil {
				t.Fatal(err)
			}
			if want := []int64{held[0].ID, held[1].ID}; !slices.Equal(sorted(acked), want) {
				t.Fatalf("acked %v, want %v", acked, want)
			}
			released, err := f.q.SettleLeases(ctx, dialects.StepRelease, now, held[3:6])
			if err != nil {
				t.Fatal(err)
			}
			if want := []int64{held[3].ID, held[4].ID}; !slices.Equal(sorted(released), want) {
				t.Fatalf("released %v, want %v", released, want)
			}
			// A retry clears the lease like a release (the claim counted the attempt).
			retried, err := f.q.SettleLeases(ctx, dialects.StepRetry, now, held[6:])
			if err != nil {
				t.Fatal(err)
			}
			if want := leaseIDs(held[6:]); !slices.Equal(sorted(retried), want) {
				t.Fatalf("retried %v, want %v", retried, want)
			}
			for i, l := range held {
				r, exists := f.row(t, l.ID)
				switch {
				case i < 2 && processed:
					if !exists || r.ProcessedAt != formatTime(now) || r.LockedUntil != "NULL" || r.Attempt != 2 {
						t.Errorf("acked row %d: %+v (exists %v)", l.ID, r, exists)
					}
				case i < 2:
					if exists {
						t.Errorf("acked row %d still exists: %+v", l.ID, r)
					}
				case i == 2:
					if !exists || r.LockedUntil != formatTime(other) || r.ProcessedAt != "NULL" || r.Attempt != 2 {
						t.Errorf("the row another claim holds changed: %+v (exists %v)", r, exists)
					}
				case i == 5:
					if exists {
						t.Errorf("the deleted row is back: %+v", r)
					}
				default:
					if !exists || r.LockedUntil != "NULL" || r.ProcessedAt != "NULL" || r.Attempt != 2 {
						t.Errorf("released row %d: %+v (exists %v)", l.ID, r, exists)
					}
				}
			}
			// Settled once, the rows hold no token: a second settlement finds none of them.
			again, err := f.q.SettleLeases(ctx, dialects.StepAck, now, held)
			if err != nil || len(again) != 0 {
				t.Errorf("settling again: %v, %v; want none", again, err)
			}
		})
	}
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

// TestSettleLeasesFullBatch settles the runtime's largest batch, 128 rows, a few of them
// lost, and then batches of every size up to it: each text is built once per padded size.
func TestSettleLeasesFullBatch(t *testing.T) {
	f := newBatchFixture(t, 128+127, false)
	batch, rest := f.held[:128], f.held[128:]
	other := f.until.Add(time.Minute)
	var lost []int64
	for i := 0; i < len(batch); i += 17 {
		lost = append(lost, batch[i].ID)
		mustExec(t, f.d, "UPDATE jobs SET locked_until = ? WHERE id = ?", formatTime(other), batch[i].ID)
	}
	acked, err := f.q.SettleLeases(ctx, dialects.StepAck, t0, batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(acked) != len(batch)-len(lost) {
		t.Fatalf("acked %d of %d, want %d", len(acked), len(batch), len(batch)-len(lost))
	}
	for _, id := range acked {
		if slices.Contains(lost, id) {
			t.Errorf("row %d, whose token moved on, was acked", id)
		}
	}
	if n := count(t, f.d, "SELECT count(*) FROM jobs WHERE locked_until = ?", formatTime(other)); n != len(lost) {
		t.Errorf("%d rows kept the other token, want %d", n, len(lost))
	}
	// Batches of 1, 2, … rows: 1 + 2 + … + 15 = 120 of the 127 left, then the last 7.
	texts := map[string]bool{}
	for size := 1; len(rest) > 0; size++ {
		n := min(size, len(rest))
		slot, _ := pairSlot(n)
		texts[f.q.batch.release.text(slot)] = true
		ids, err := f.q.SettleLeases(ctx, dialects.StepRelease, t0, rest[:n])
		if err != nil || !slices.Equal(sorted(ids), leaseIDs(rest[:n])) {
			t.Fatalf("release of %d: %v, %v", n, ids, err)
		}
		rest = rest[n:]
	}
	if len(texts) != 5 { // 1, 2, 4, 8, 16 pairs
		t.Errorf("%d texts for batches of 1 to 15 rows, want 5", len(texts))
	}
	if n := count(t, f.d, "SELECT count(*) FROM jobs WHERE locked_until IS NULL"); n != 127 {
		t.Errorf("%d rows released, want 127", n)
	}
}

// TestSettleLeasesChunks: more leases than one statement names run in chunks, in one
// transaction.
func TestSettleLeasesChunks(t *testing.T) {
	f := newBatchFixture(t, maxSettle+5, true)
	other := f.until.Add(time.Minute)
	lost := f.held[maxSettle+1].ID // in the second chunk
	mustExec(t, f.d, "UPDATE jobs SET locked_until = ? WHERE id = ?", formatTime(other), lost)
	acked, err := f.q.SettleLeases(ctx, dialects.StepAck, t0, f.held)
	if err != nil {
		t.Fatal(err)
	}
	if len(acked) != len(f.held)-1 || slices.Contains(acked, lost) {
		t.Fatalf("acked %d of %d (lost row among them: %v)", len(acked), len(f.held), slices.Contains(acked, lost))
	}
	if n := count(t, f.d, "SELECT count(*) FROM jobs WHERE processed_at = ? AND locked_until IS NULL", formatTime(t0)); n != len(acked) {
		t.Errorf("%d rows processed, want %d", n, len(acked))
	}
}

func TestSettleLeasesRefusesOtherSteps(t *testing.T) {
	f := newBatchFixture(t, 1, false)
	for _, kind := range []dialects.StepKind{dialects.StepRetryAfter, dialects.StepDeadLetter} {
		if _, err := f.q.SettleLeases(ctx, kind, t0, f.held); err == nil {
			t.Errorf("%v batched", kind)
		}
	}
	if r, ok := f.row(t, f.held[0].ID); !ok || r.LockedUntil != formatTime(f.until) {
		t.Errorf("row changed: %+v (exists %v)", r, ok)
	}
}
