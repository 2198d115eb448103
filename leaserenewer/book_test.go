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

// TestCheckoutWaitsForAnExtensionInFlight: a settlement must not run with the token an
// extension is replacing, or it would find the new token and report a lost lease.
func TestCheckoutWaitsForAnExtensionInFlight(t *testing.T) {
	b := NewBook()
	t0 := time.Unix(100, 0)
	b.Add(1, t0)
	held := b.begin()
	if len(held) != 1 || held[0] != (dialects.Lease{ID: 1, Token: t0}) {
		t.Fatalf("begin = %v", held)
	}
	got := make(chan time.Time)
	go func() {
		tok, lost, ok := b.Checkout(1)
		if !ok || lost {
			t.Errorf("Checkout ok=%v lost=%v", ok, lost)
		}
		got <- tok
	}()
	select {
	case tok := <-got:
		t.Fatalf("Checkout returned %v while the extension was in flight", tok)
	case <-time.After(50 * time.Millisecond):
	}
	t1 := time.Unix(130, 0)
	b.end(held, t1, []int64{1}, false)
	if tok := <-got; !tok.Equal(t1) {
		t.Fatalf("Checkout token %v, want the extended %v", tok, t1)
	}
	if b.Len() != 0 {
		t.Fatal("lease still in the book after checkout")
	}
}

func TestARoundMarksMissingLeasesLostAndAFailedRoundKeepsTokens(t *testing.T) {
	b := NewBook()
	t0 := time.Unix(100, 0)
	b.Add(1, t0)
	b.Add(2, t0)
	held := b.begin()
	if lost := b.end(held, time.Unix(130, 0), nil, true); len(lost) != 0 {
		t.Fatalf("a failed round lost %v", lost)
	}
	held = b.begin()
	lost := b.end(held, time.Unix(130, 0), []int64{2}, false)
	if len(lost) != 1 || lost[0] != 1 {
		t.Fatalf("lost = %v, want [1]", lost)
	}
	if tok, l, ok := b.Checkout(1); !ok || !l || !tok.Equal(t0) {
		t.Fatalf("lease 1: token %v lost %v ok %v", tok, l, ok)
	}
	if tok, l, ok := b.Checkout(2); !ok || l || !tok.Equal(time.Unix(130, 0)) {
		t.Fatalf("lease 2: token %v lost %v ok %v", tok, l, ok)
	}
	if len(b.begin()) != 0 {
		t.Fatal("checked-out leases are still extended")
	}
}
