package leaserenewer

import (
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

func TestExpiryRoundsUpToWholeSeconds(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 250_000_000, time.UTC)
	if got, want := Expiry(now, 30*time.Second), time.Date(2026, 1, 2, 3, 4, 36, 0, time.UTC); !got.Equal(want) {
		t.Fatalf("Expiry = %v, want %v", got, want)
	}
	exact := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if got := Expiry(exact, time.Second); !got.Equal(exact.Add(time.Second)) {
		t.Fatalf("Expiry of a whole second = %v", got)
	}
}

// TestPinWaitsForAnExtensionInFlight: a settlement must not run with the token an
// extension is replacing, or it would find the new token and report a lost lease.
func TestPinWaitsForAnExtensionInFlight(t *testing.T) {
	b := NewBook()
	t0 := time.Unix(100, 0)
	h := b.Add(1, t0)
	held := b.begin()
	if ls := leases(held); len(ls) != 1 || ls[0] != (dialects.Lease{ID: 1, Token: t0}) {
		t.Fatalf("begin = %v", ls)
	}
	got := make(chan time.Time)
	go func() {
		l, lost, ok := h.Pin()
		if !ok || lost {
			t.Errorf("Pin ok=%v lost=%v", ok, lost)
		}
		got <- l.Token
	}()
	select {
	case tok := <-got:
		t.Fatalf("Pin returned %v while the extension was in flight", tok)
	case <-time.After(50 * time.Millisecond):
	}
	t1 := time.Unix(130, 0)
	b.end(held, t1, []int64{1}, false, nil)
	if tok := <-got; !tok.Equal(t1) {
		t.Fatalf("Pin token %v, want the extended %v", tok, t1)
	}
	if len(b.begin()) != 0 {
		t.Fatal("a pinned lease is still extended")
	}
	h.Done()
	if b.len() != 0 {
		t.Fatal("lease still in the book after its settlement")
	}
	if _, _, ok := h.Pin(); ok {
		t.Fatal("a settled lease pinned again")
	}
}

func TestARoundMarksMissingLeasesLostAndAFailedRoundKeepsTokens(t *testing.T) {
	b := NewBook()
	t0 := time.Unix(100, 0)
	h1 := b.Add(1, t0)
	h2 := b.Add(2, t0)
	held := b.begin()
	if lost := b.end(held, time.Unix(130, 0), nil, true, nil); len(lost) != 0 {
		t.Fatalf("a failed round lost %v", lost)
	}
	held = b.begin()
	lost := b.end(held, time.Unix(130, 0), []int64{2}, false, nil)
	if len(lost) != 1 || lost[0] != 1 {
		t.Fatalf("lost = %v, want [1]", lost)
	}
	if l, lo, ok := h1.Pin(); !ok || !lo || !l.Token.Equal(t0) {
		t.Fatalf("lease 1: token %v lost %v ok %v", l.Token, lo, ok)
	}
	if l, lo, ok := h2.Pin(); !ok || lo || !l.Token.Equal(time.Unix(130, 0)) {
		t.Fatalf("lease 2: token %v lost %v ok %v", l.Token, lo, ok)
	}
	h1.Done()
	h2.Done()
	if len(b.begin()) != 0 {
		t.Fatal("settled leases are still extended")
	}
}

// TestALaterClaimOfARowLosesTheEarlierLease: the same process claimed a row again after
// its first lease ran out. The first delivery's lease is lost for good (its settlement
// must change nothing), the renewer extends the second lease alone, and the first
// delivery's settlement leaves the second lease in the book.
func TestALaterClaimOfARowLosesTheEarlierLease(t *testing.T) {
	b := NewBook()
	stale := b.Add(7, time.Unix(100, 0))
	fresh := b.Add(7, time.Unix(140, 0))
	held := b.begin()
	if ls := leases(held); len(ls) != 1 || ls[0] != (dialects.Lease{ID: 7, Token: time.Unix(140, 0)}) {
		t.Fatalf("the round extends %v, want only the later claim's lease", ls)
	}
	b.end(held, time.Unix(160, 0), []int64{7}, false, nil)
	l, lost, ok := stale.Pin()
	if !ok || !lost || !l.Token.Equal(time.Unix(100, 0)) {
		t.Fatalf("stale lease: token %v lost %v ok %v; want its own token, lost", l.Token, lost, ok)
	}
	stale.Done()
	if b.len() != 1 {
		t.Fatal("the stale delivery's settlement took the later lease out of the book")
	}
	held = b.begin()
	if ls := leases(held); len(ls) != 1 || !ls[0].Token.Equal(time.Unix(160, 0)) {
		t.Fatalf("after the stale settlement the round extends %v, want the later lease at its new token", ls)
	}
	b.end(held, time.Unix(160, 0), []int64{7}, false, nil)
	l, lost, ok = fresh.Pin()
	if !ok || lost || !l.Token.Equal(time.Unix(160, 0)) {
		t.Fatalf("fresh lease: token %v lost %v ok %v", l.Token, lost, ok)
	}
}

func TestARoundKeepsTheTokensOfBusyLeases(t *testing.T) {
	b := NewBook()
	t0 := time.Unix(100, 0)
	h1 := b.Add(1, t0)
	h2 := b.Add(2, t0)
	h3 := b.Add(3, t0)
	held := b.begin()
	lost := b.end(held, time.Unix(130, 0), []int64{2}, false, []int64{3})
	if len(lost) != 1 || lost[0] != 1 {
		t.Fatalf("lost = %v, want [1]", lost)
	}
	if l, lo, ok := h3.Pin(); !ok || lo || !l.Token.Equal(t0) {
		t.Fatalf("busy lease 3: token %v lost %v ok %v, want its old token, not lost", l.Token, lo, ok)
	}
	if l, lo, ok := h2.Pin(); !ok || lo || !l.Token.Equal(time.Unix(130, 0)) {
		t.Fatalf("lease 2: token %v lost %v ok %v", l.Token, lo, ok)
	}
	if _, lo, _ := h1.Pin(); !lo {
		t.Fatal("lease 1 not lost")
	}
}

func TestBeginOfTakesOnlyTheLiveLeasesOfItsRows(t *testing.T) {
	b := NewBook()
	t0 := time.Unix(100, 0)
	b.Add(1, t0)
	b.Add(2, t0)
	b.Add(3, t0).Pin()
	held := b.beginOf(map[int64]struct{}{2: {}, 3: {}, 4: {}})
	if ls := leases(held); len(ls) != 1 || ls[0].ID != 2 {
		t.Fatalf("beginOf extends %v, want only row 2 (3 is pinned, 4 unknown)", ls)
	}
	b.end(held, time.Unix(130, 0), []int64{2}, false, nil)
	if all := b.begin(); len(all) != 2 {
		t.Fatalf("begin takes %d leases, want rows 1 and 2", len(all))
	}
}
