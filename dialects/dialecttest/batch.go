package dialecttest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// batchScenarios are batched lease settlements (LeaseBatchQueue.SettleLeases).
var batchScenarios = []scenario{
	{name: "SettleLeases", run: testSettleLeases},
	{name: "SettleLeasesOne", run: testSettleLeasesOne},
	{name: "SettleLeasesOfSeveralClaims", run: testSettleLeasesOfSeveralClaims},
	{name: "SettleLeasesEmpty", run: testSettleLeasesEmpty},
	{name: "SettleLeasesFullBatch", run: testSettleLeasesFullBatch},
	{name: "SettleLeasesChunks", run: testSettleLeasesChunks},
	{name: "SettleLeasesRefusesOtherSteps", run: testSettleLeasesRefusesOtherSteps},
	{name: "SettleLeasesCanceled", run: testSettleLeasesCanceled},
	{name: "SettleLeasesLeavesARowWhoseTokenIsBeingWritten", run: testSettleLeasesLeavesARowWhoseTokenIsBeingWritten,
		applies: concurrentWriters},
}

// batchFixture is a fresh lease table of n rows in group "g", all claimed with the lease
// until t0+30s.
type batchFixture struct {
	*env
	tbl   dialects.Table
	q     dialects.LeaseBatchQueue
	held  []dialects.Lease
	until time.Time
}

func newBatchFixture(t *testing.T, h Harness, n int, processed bool) *batchFixture {
	t.Helper()
	e := setup(t, h)
	tbl := e.table("batch", func(name string) dialects.Table {
		tbl := leaseTable(name)
		if processed {
			tbl.ProcessedAt = "processed_at"
		}
		return tbl
	})
	e.fill(tbl.Name, n, "g")
	q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g"})
	bq, ok := q.(dialects.LeaseBatchQueue)
	if !ok {
		t.Fatalf("%T is not a LeaseBatchQueue", q)
	}
	f := &batchFixture{env: e, tbl: tbl, q: bq, until: t0.Add(30 * time.Second)}
	for len(f.held) < n { // a claim may take fewer rows than asked for
		rows, err := f.q.ClaimLeases(ctx, t0, f.until, n-len(f.held))
		if err != nil || len(rows) == 0 {
			t.Fatalf("claimed %d rows of %d: %v", len(f.held), n, err)
		}
		for _, r := range rows {
			f.held = append(f.held, dialects.Lease{ID: r.ID, Token: r.Token})
		}
	}
	return f
}

// moveToken gives row id's lease to another claim, as its token other.
func (f *batchFixture) moveToken(id int64, other time.Time) {
	f.t.Helper()
	f.exec("UPDATE "+f.env.q(f.tbl.Name)+" SET locked_until = ? WHERE id = ?", f.h.TimeArg(other), id)
}

func (f *batchFixture) rows(where string, args ...any) int {
	f.t.Helper()
	return f.count("SELECT COUNT(*) FROM "+f.env.q(f.tbl.Name)+" WHERE "+where, args...)
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

// SettleLeases settles many leases at once: rows that still hold their tokens are acked
// (deleted, or marked processed with the lease cleared), released or retried; a row whose
// token moved on, or that is gone, is left as it is and missing from the result.
func testSettleLeases(t *testing.T, h Harness) {
	for _, processed := range []bool{false, true} {
		name := "ack deletes"
		if processed {
			name = "ack marks processed"
		}
		t.Run(name, func(t *testing.T) { settleLeases(t, h, processed) })
	}
}

// SettleLeasesOfSeveralClaims: one batch settles the leases of two claims, each row by
// its own claim's token, in whatever order the leases come (a dialect may share the
// text of a token between the rows that hold it, never across tokens).
func testSettleLeasesOfSeveralClaims(t *testing.T, h Harness) {
	f := newBatchFixture(t, h, 4, false)
	second := f.until.Add(time.Minute)
	f.fill(f.tbl.Name, 4, "g")
	var later []dialects.Lease
	for len(later) < 4 {
		rows, err := f.q.ClaimLeases(ctx, t0, second, 4-len(later))
		if err != nil || len(rows) == 0 {
			t.Fatalf("second claim: %d rows of 4: %v", len(later), err)
		}
		for _, r := range rows {
			later = append(later, dialects.Lease{ID: r.ID, Token: r.Token})
		}
	}
	var held []dialects.Lease // first, second, first, second, ...
	for i := range 4 {
		held = append(held, f.held[i], later[i])
	}
	acked, err := f.q.SettleLeases(ctx, dialects.StepAck, t0.Add(time.Second), held)
	if err != nil {
		t.Fatal(err)
	}
	if want := sorted(leaseIDs(held)); !slices.Equal(sorted(acked), want) {
		t.Fatalf("acked %v, want all of %v", sorted(acked), want)
	}
	if n := f.rows("1 = 1"); n != 0 {
		t.Fatalf("%d rows left after acking both claims' rows; want 0", n)
	}
}

// settleLeases is testSettleLeases on a table with or without processed_at.
func settleLeases(t *testing.T, h Harness, processed bool) {
	f := newBatchFixture(t, h, 8, processed)
	held := f.held
	// Row 2's lease went to another claim; row 5 was deleted by someone else.
	other := f.until.Add(time.Hour)
	f.moveToken(held[2].ID, other)
	f.exec("DELETE FROM "+f.env.q(f.tbl.Name)+" WHERE id = ?", held[5].ID)

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
		s, exists := f.state(f.tbl, l.ID)
		checkSettledLease(t, i, l.ID, s, exists, processed, now, other)
	}
	// Settled once, the rows hold no token: a second settlement finds none of them.
	again, err := f.q.SettleLeases(ctx, dialects.StepAck, now, held)
	if err != nil || len(again) != 0 {
		t.Errorf("settling again: %v, %v; want none", again, err)
	}
}

// checkSettledLease checks row i of settleLeases: rows 0 and 1 acked at now, row 2 still
// held by the other claim's token, row 5 deleted, the others released or retried.
func checkSettledLease(t *testing.T, i int, id int64, s RowState, exists, processed bool, now, other time.Time) {
	t.Helper()
	switch {
	case i < 2 && processed:
		if !exists || s.LockedUntil != nil || s.Attempt != 2 {
			t.Errorf("acked row %d: %+v (exists %v)", id, s, exists)
		} else {
			sameTime(t, "processed_at", s.ProcessedAt, now)
		}
	case i < 2:
		if exists {
			t.Errorf("acked row %d still exists: %+v", id, s)
		}
	case i == 2:
		if !exists || s.ProcessedAt != nil || s.Attempt != 2 {
			t.Errorf("the row another claim holds changed: %+v (exists %v)", s, exists)
		} else {
			sameTime(t, "the other claim's token", s.LockedUntil, other)
		}
	case i == 5:
		if exists {
			t.Errorf("the deleted row is back: %+v", s)
		}
	default:
		if !exists || s.LockedUntil != nil || s.ProcessedAt != nil || s.Attempt != 2 {
			t.Errorf("released row %d: %+v (exists %v)", id, s, exists)
		}
	}
}

// A batch of one lease has the same result as a longer batch.
func testSettleLeasesOne(t *testing.T, h Harness) {
	for _, processed := range []bool{false, true} {
		f := newBatchFixture(t, h, 3, processed)
		other := f.until.Add(time.Hour)
		f.moveToken(f.held[1].ID, other)
		now := t0.Add(time.Second)
		for i, kind := range []dialects.StepKind{dialects.StepAck, dialects.StepAck, dialects.StepRelease} {
			ids, err := f.q.SettleLeases(ctx, kind, now, f.held[i:i+1])
			if err != nil {
				t.Fatal(err)
			}
			if lost := i == 1; lost != (len(ids) == 0) || !lost && !slices.Equal(ids, []int64{f.held[i].ID}) {
				t.Errorf("%v of row %d (token moved on: %v): %v", kind, f.held[i].ID, lost, ids)
			}
		}
		acked, ackedOK := f.state(f.tbl, f.held[0].ID)
		switch {
		case processed && (!ackedOK || acked.LockedUntil != nil):
			t.Errorf("acked row: %+v (exists %v)", acked, ackedOK)
		case processed:
			sameTime(t, "processed_at", acked.ProcessedAt, now)
		case ackedOK:
			t.Errorf("acked row still exists: %+v", acked)
		}
		if s, ok := f.state(f.tbl, f.held[1].ID); !ok || s.ProcessedAt != nil {
			t.Errorf("the row another claim holds changed: %+v (exists %v)", s, ok)
		} else {
			sameTime(t, "the other claim's token", s.LockedUntil, other)
		}
		if s, ok := f.state(f.tbl, f.held[2].ID); !ok || s.LockedUntil != nil || s.ProcessedAt != nil {
			t.Errorf("released row: %+v (exists %v)", s, ok)
		}
	}
}

// No leases, no statement: even a context that has ended is not looked at.
func testSettleLeasesEmpty(t *testing.T, h Harness) {
	f := newBatchFixture(t, h, 1, false)
	c, cancel := context.WithCancel(ctx)
	cancel()
	for _, kind := range []dialects.StepKind{dialects.StepAck, dialects.StepRelease} {
		ids, err := f.q.SettleLeases(c, kind, t0, nil)
		if ids != nil || err != nil {
			t.Errorf("%v of no leases: %v, %v", kind, ids, err)
		}
	}
	s, ok := f.state(f.tbl, f.held[0].ID)
	if !ok {
		t.Fatal("row gone")
	}
	sameTime(t, "locked_until", s.LockedUntil, f.until)
}

// The runtime's largest batch, 128 rows, a few of them lost, and then batches of every
// size up to 15; where the harness can tell (BatchTexter), each text is built once per
// padded size.
func testSettleLeasesFullBatch(t *testing.T, h Harness) {
	f := newBatchFixture(t, h, 128+120, false)
	batch, rest := f.held[:128], f.held[128:]
	other := f.until.Add(time.Minute)
	var lost []int64
	for i := 0; i < len(batch); i += 17 {
		lost = append(lost, batch[i].ID)
		f.moveToken(batch[i].ID, other)
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
	if n := f.rows("locked_until = ?", h.TimeArg(other)); n != len(lost) {
		t.Errorf("%d rows kept the other token, want %d", n, len(lost))
	}
	if n := f.rows("1 = 1"); n != len(lost)+len(rest) {
		t.Errorf("%d rows left, want %d", n, len(lost)+len(rest))
	}
	// Batches of 1, 2, … 15 rows: 120 rows.
	texter, _ := h.(BatchTexter)
	texts := map[string]bool{}
	for size := 1; len(rest) > 0; size++ {
		n := min(size, len(rest))
		if texter != nil {
			texts[texter.BatchText(f.q, dialects.StepRelease, n)] = true
		}
		ids, err := f.q.SettleLeases(ctx, dialects.StepRelease, t0, rest[:n])
		if err != nil || !slices.Equal(sorted(ids), leaseIDs(rest[:n])) {
			t.Fatalf("release of %d: %v, %v", n, ids, err)
		}
		rest = rest[n:]
	}
	if texter != nil && len(texts) != texter.BatchTexts() {
		t.Errorf("%d texts for batches of 1 to 15 rows, want %d", len(texts), texter.BatchTexts())
	}
	if n := f.rows("locked_until IS NULL"); n != 120 {
		t.Errorf("%d rows released, want 120", n)
	}
}

// More leases than one statement names (Caps.ListChunk) run in chunks, in one transaction;
// a lease named twice, once in each chunk, is settled once and reported once.
func testSettleLeasesChunks(t *testing.T, h Harness) {
	chunk := h.Caps().ListChunk
	if chunk == 0 {
		chunk = 5000
	}
	f := newBatchFixture(t, h, chunk+5, true)
	lost := f.held[chunk+1].ID // in the second chunk
	f.moveToken(lost, f.until.Add(time.Minute))
	held := append(slices.Clone(f.held), f.held[0])
	acked, err := f.q.SettleLeases(ctx, dialects.StepAck, t0, held)
	if err != nil {
		t.Fatal(err)
	}
	if len(acked) != len(f.held)-1 || slices.Contains(acked, lost) {
		t.Fatalf("acked %d of %d (lost row among them: %v)", len(acked), len(f.held), slices.Contains(acked, lost))
	}
	if n := f.rows("processed_at = ? AND locked_until IS NULL", h.TimeArg(t0)); n != len(acked) {
		t.Errorf("%d rows processed, want %d", n, len(acked))
	}
}

func testSettleLeasesRefusesOtherSteps(t *testing.T, h Harness) {
	f := newBatchFixture(t, h, 1, false)
	for _, kind := range []dialects.StepKind{dialects.StepRetryAfter, dialects.StepDeadLetter} {
		if _, err := f.q.SettleLeases(ctx, kind, t0, f.held); err == nil {
			t.Errorf("%v batched", kind)
		}
	}
	s, ok := f.state(f.tbl, f.held[0].ID)
	if !ok {
		t.Fatal("row gone")
	}
	sameTime(t, "locked_until", s.LockedUntil, f.until)
}

// A batch whose context ended changes nothing.
func testSettleLeasesCanceled(t *testing.T, h Harness) {
	f := newBatchFixture(t, h, 2, false)
	c, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := f.q.SettleLeases(c, dialects.StepAck, t0, f.held); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled batch: %v", err)
	}
	if n := f.rows("locked_until IS NOT NULL"); n != 2 {
		t.Errorf("%d rows still leased, want 2", n)
	}
}

// A row whose token another transaction is moving is not waited for (the batch would hold
// its other rows locked meanwhile): it is reported busy, the others are settled, and the
// row's own settlement, which waits for the writer, finds the token gone and leaves the
// row alone.
func testSettleLeasesLeavesARowWhoseTokenIsBeingWritten(t *testing.T, h Harness) {
	f := newBatchFixture(t, h, 3, false)
	other := f.until.Add(time.Hour)
	tx := h.Begin(t, f.d)
	defer tx.Rollback()
	if err := tx.Exec("UPDATE "+f.env.q(f.tbl.Name)+" SET locked_until = ? WHERE id = ?", h.TimeArg(other), f.held[1].ID); err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ids, err := f.q.SettleLeases(c, dialects.StepAck, t0, f.held)
	var busy *dialects.RowsBusyError
	if !errors.As(err, &busy) || !slices.Equal(busy.IDs, []int64{f.held[1].ID}) {
		t.Fatalf("batch: %v, %v; want row %d reported busy", ids, err, f.held[1].ID)
	}
	if want := []int64{f.held[0].ID, f.held[2].ID}; !slices.Equal(sorted(ids), want) {
		t.Fatalf("acked %v, want %v", ids, want)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, f.held[1]); ok || err != nil {
		t.Fatalf("the busy row's own ack: %v %v; want false (its token was moved)", ok, err)
	}
	s, ok := f.state(f.tbl, f.held[1].ID)
	if !ok {
		t.Fatal("the row the other transaction holds was acked")
	}
	sameTime(t, "locked_until", s.LockedUntil, other)
}
