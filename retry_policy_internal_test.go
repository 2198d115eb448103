package rowactor

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestDefaultBackoff checks DefaultBackoff's numbers: 1 s · 2^(attempt-1), within ±20 %,
// never above an hour, an attempt below 1 read as 1.
func TestDefaultBackoff(t *testing.T) {
	t.Parallel()
	curve := map[int]time.Duration{
		-3: time.Second, 0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second,
		10: 512 * time.Second, 12: 2048 * time.Second, 13: time.Hour, 25: time.Hour, 1 << 30: time.Hour,
	}
	for attempt, want := range curve {
		if got := backoffCurve(attempt); got != want {
			t.Errorf("curve at attempt %d: %v, want %v", attempt, got, want)
		}
		lo, hi := time.Duration(float64(want)*0.8), min(time.Duration(float64(want)*1.2), time.Hour)
		// The jitter's ends, exactly, and a spread of random draws between them.
		if got := jitter(want, 0); got != lo {
			t.Errorf("jitter's low end at attempt %d: %v, want %v", attempt, got, lo)
		}
		if got := jitter(want, 1); got != hi {
			t.Errorf("jitter's high end at attempt %d: %v, want %v", attempt, got, hi)
		}
		seenLow, seenHigh := false, false
		for range 2000 {
			d := DefaultBackoff(attempt, errors.New("boom"))
			if d < lo || d > hi {
				t.Fatalf("DefaultBackoff(%d) = %v, outside [%v, %v]", attempt, d, lo, hi)
			}
			seenLow = seenLow || d < want-(want-lo)/2
			seenHigh = seenHigh || d > want+(hi-want)/2 || hi == want
		}
		if !seenLow || !seenHigh {
			t.Errorf("DefaultBackoff(%d) is not spread over [%v, %v]", attempt, lo, hi)
		}
	}
	// After its tenth failure a row comes back at most once in 6.8 minutes: never more
	// than a few times a minute.
	for attempt := 10; attempt <= 40; attempt++ {
		if d := DefaultBackoff(attempt, nil); d < 6*time.Minute {
			t.Fatalf("DefaultBackoff(%d) = %v, under six minutes", attempt, d)
		}
	}
}

// TestRetryPolicyFallsBack checks that a nil policy is DefaultBackoff and that a policy
// that panics backs off by DefaultBackoff, with an error logged.
func TestRetryPolicyFallsBack(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	if d := safePolicy(nil, log, "jobs", "q")(1, nil); d < 800*time.Millisecond || d > 1200*time.Millisecond {
		t.Fatalf("nil policy: %v, want DefaultBackoff's first delay", d)
	}
	panicky := safePolicy(func(int, error) time.Duration { panic("no") }, log, "jobs", "q")
	if d := panicky(10, nil); d < 409*time.Second || d > 615*time.Second {
		t.Fatalf("panicking policy: %v, want DefaultBackoff's tenth delay", d)
	}
	if !strings.Contains(buf.String(), "retry policy panicked") || !strings.Contains(buf.String(), "table=jobs") {
		t.Fatalf("no error logged: %s", buf.String())
	}
	if d := safePolicy(func(int, error) time.Duration { return time.Minute }, log, "jobs", "q")(1, nil); d != time.Minute {
		t.Fatalf("own policy: %v", d)
	}
}
