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
