package claimer

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

func cand(id int64) dialects.Candidate { return dialects.Candidate{ID: id, Key: fmt.Sprint("k", id)} }

func TestKeptCandidatesServeInReadOrderButNotTakenKeysOrStaleOnes(t *testing.T) {
	k := &Kept{}
	p := &Poison{}
	k.keep([]dialects.Candidate{cand(1), cand(2), cand(3), cand(4)}, map[string]struct{}{"k2": {}}, time.Now())
	var got []int64
	for {
		c, ok := k.take(p)
		if !ok {
			break
		}
		got = append(got, c.ID)
	}
	if fmt.Sprint(got) != "[1 3 4]" {
		t.Fatalf("took %v; want [1 3 4]: in read order, without the key the claim took", got)
	}
	k.keep([]dialects.Candidate{cand(5)}, nil, time.Now().Add(-keptFor-time.Millisecond))
	if c, ok := k.take(p); ok {
		t.Fatalf("took %v, read longer than %v ago", c, keptFor)
	}
	var nilKept *Kept
	nilKept.keep([]dialects.Candidate{cand(6)}, nil, time.Now())
	if _, ok := nilKept.take(p); ok || nilKept.read(3) != 3 {
		t.Fatal("a nil Kept kept something, or read more than asked")
	}
	if k.read(3) != keptRead || k.read(40) != 40 {
		t.Fatalf("read %d and %d; want %d and 40", k.read(3), k.read(40), keptRead)
	}
}

// TestAdvisoryClaimReadsAfreshWhenItsKeptCandidatesAreGone: candidates kept from the last
// read whose rows were taken meanwhile do not make a claim come back short while the
// table holds a due row: the claim reads afresh.
func TestAdvisoryClaimReadsAfreshWhenItsKeptCandidatesAreGone(t *testing.T) {
	ctx := context.Background()
	d, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "kept.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	tbl := dialects.Table{Name: "kept_jobs", ID: "id", Payload: "payload", Attempt: "attempt", AdvisoryKey: "kept-{id}"}
	ddl, err := d.Schema(tbl)
	if err != nil {
		t.Fatal(err)
	}
	db := d.DB()
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ {
		if _, err := db.ExecContext(ctx, "INSERT INTO kept_jobs (id, payload) VALUES (?, x'00')", i); err != nil {
			t.Fatal(err)
		}
	}
	q, err := d.Open(ctx, dialects.QueueSpec{Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	aq := q.(dialects.AdvisoryQueue)
	kept := &Kept{For: time.Hour} // the second claim meets the kept candidates, however slow the machine
	c := &claimer{cfg: Config{Kept: kept, Poison: &Poison{}, Ctx: ctx}, ctx: ctx}

	first, err := c.claimAdvisory(aq, time.Now(), 1, 1, 0)
	if err != nil || len(first) != 1 || first[0].Row.ID != 1 {
		t.Fatalf("first claim %v, %v; want row 1", first, err)
	}
	if n := len(kept.cands); n != 4 {
		t.Fatalf("%d candidates kept; want rows 2 to 5", n)
	}
	// Another process takes rows 2 to 5; row 6 comes in.
	if _, err := db.ExecContext(ctx, "DELETE FROM kept_jobs WHERE id BETWEEN 2 AND 5"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO kept_jobs (id, payload) VALUES (6, x'00')"); err != nil {
		t.Fatal(err)
	}
	second, err := c.claimAdvisory(aq, time.Now(), 1, 1, 0)
	if err != nil || len(second) != 1 || second[0].Row.ID != 6 {
		t.Fatalf("second claim %v, %v; want row 6, read afresh once the kept candidates were gone", rowIDs(second), err)
	}
	for _, cl := range append(first, second...) {
		if _, err := cl.Session.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func rowIDs(cs []Claim) []int64 {
	ids := make([]int64, len(cs))
	for i, c := range cs {
		ids[i] = c.Row.ID
	}
	return ids
}
