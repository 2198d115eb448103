package supervision

import (
	"testing"
	"time"
)

func TestPolicyDoublesUpToItsCap(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := p.Delay(i + 1); got != w*time.Millisecond {
			t.Fatalf("Delay(%d) = %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	if got := p.Delay(1000); got != time.Second {
		t.Fatalf("Delay(1000) = %v, want the cap", got)
	}
}

func TestJitterStaysInTheUpperHalf(t *testing.T) {
	d := 800 * time.Millisecond
	seen := map[time.Duration]bool{}
	for range 1000 {
		j := Jittered(d)
		if j < d/2 || j > d {
			t.Fatalf("Jittered(%v) = %v, outside [%v, %v]", d, j, d/2, d)
		}
		seen[j] = true
	}
	if len(seen) < 100 {
		t.Fatalf("only %d distinct delays in 1000 draws: no jitter", len(seen))
	}
}
