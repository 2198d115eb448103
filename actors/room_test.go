package actors

import (
	"testing"
	"time"
)

func TestRoomCoversOneClaimOfHandling(t *testing.T) {
	var r roomSizer
	if n := r.size(8); n != 0 {
		t.Fatalf("room %d before anything was measured; want 0", n)
	}
	r.claimed(2 * time.Millisecond)
	r.freed(100*time.Millisecond, 0)
	if n := r.size(8); n != 1 {
		t.Fatalf("8 workers, 100 ms handlers, 2 ms claims: room %d; want 1 (8 × 2/100 rounded up)", n)
	}
	for range 100 {
		r.freed(20*time.Microsecond, 0)
	}
	if n := r.size(8); n != roomMax {
		t.Fatalf("instant handlers: room %d; want the cap %d", n, roomMax)
	}
	// One slow claim (a connection opened first) does not move the room: the quickest of
	// the last claims counts.
	var s roomSizer
	s.freed(10*time.Millisecond, 0)
	s.claimed(time.Millisecond)
	s.claimed(80 * time.Millisecond)
	if n := s.size(4); n != 1 {
		t.Fatalf("after a slow claim: room %d; want 1", n)
	}
	// Eight slow claims in a row do.
	for range 8 {
		s.claimed(20 * time.Millisecond)
	}
	if n := s.size(4); n != 8 {
		t.Fatalf("claims of 20 ms, 10 ms handlers, 4 workers: room %d; want 8", n)
	}
}

// Claims quicker than roomFloor (SQLite's take about 0.1 ms) size the room as if they
// took roomFloor: a claim of a few rows costs a statement and a commit each.
func TestRoomCoversAtLeastTheFloor(t *testing.T) {
	var r roomSizer
	r.claimed(100 * time.Microsecond)
	r.freed(time.Millisecond, 0)
	if n := r.size(8); n != 16 {
		t.Fatalf("8 workers, 1 ms handlers, 0.1 ms claims: room %d; want 16 (8 × 2 ms floor / 1 ms)", n)
	}
	r.freed(100*time.Millisecond, 0)
	if n := r.size(8); n != 1 {
		t.Fatalf("8 workers, 100 ms handlers: room %d; want 1", n)
	}
}

// Rows waiting cover a claim when they keep the workers busy for its round trip.
func TestBacklogCoversAClaim(t *testing.T) {
	var r roomSizer
	if r.covers(10, 2) {
		t.Fatal("covers before anything was measured")
	}
	r.claimed(time.Millisecond)
	r.freed(100*time.Microsecond, 0)
	// 2 workers finish 20 rows per ms: 20 waiting rows last one claim.
	if !r.covers(20, 2) || r.covers(19, 2) || r.covers(0, 2) {
		t.Fatalf("covers(20, 2) %v, covers(19, 2) %v, covers(0, 2) %v; want true, false, false",
			r.covers(20, 2), r.covers(19, 2), r.covers(0, 2))
	}
}
