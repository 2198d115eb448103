package rowactor

import (
	"log/slog"
	"math/rand/v2"
	"time"
)

// DefaultBackoff's numbers.
const (
	// backoffBase is the delay after a first failure.
	backoffBase = time.Second
	// backoffCap is the longest delay.
	backoffCap = time.Hour
	// backoffJitter is the spread: each delay is drawn uniformly within this fraction
	// either side of the exponential curve.
	backoffJitter = 0.2
)

// DefaultMaxAttempts caps the deliveries of a subscription that has a dead letter
// (DeadLetterGroup or DeadLetterTable) and no MaxAttempts: a Fail, Retry or RetryAfter of
// a row whose attempt reached it moves the row to its dead letter. 25 is River's default
// too; under DefaultBackoff a row's 24 waits add up to about twelve hours.
const DefaultMaxAttempts = 25

// DefaultBackoff is the retry policy of a subscription without RetryPolicy: 1 s after
// the first failure, doubling with each attempt (1 s · 2^(attempt-1)), spread ±20 % at
// random so that rows which failed together do not come back together, and never more
// than an hour. The tenth failure waits 6.8 to 10.2 minutes; from the thirteenth on the
// delay lies between 48 and 60 minutes. An attempt below 1 (a table without an attempt
// column reports 0) reads as 1. err is not consulted.
func DefaultBackoff(attempt int, err error) time.Duration {
	return jitter(backoffCurve(attempt), rand.Float64())
}

// backoffCurve is DefaultBackoff's delay before jitter: backoffBase · 2^(attempt-1),
// capped at backoffCap.
func backoffCurve(attempt int) time.Duration {
	d := backoffBase
	for i := 1; i < attempt && d < backoffCap; i++ {
		d *= 2
	}
	return min(d, backoffCap)
}

// jitter spreads d by ±backoffJitter: u in [0, 1) picks the point, from d·0.8 (u = 0) to
// d·1.2 (u → 1); the result is capped at backoffCap.
func jitter(d time.Duration, u float64) time.Duration {
	f := 1 - backoffJitter + 2*backoffJitter*u
	return min(time.Duration(float64(d)*f), backoffCap)
}

// RetryPolicy sets how long a row waits after its handler failed (Fail): policy gets the
// attempt the delivery reported (1 for the first delivery) and the handler's error, and
// returns the delay; a negative delay is none. It runs on the delivery's actor when the
// outcome settles, so it must be quick and must not block; a policy that panics is
// replaced by DefaultBackoff for that delivery, and the panic is logged. Retry and
// RetryAfter never consult it. nil keeps DefaultBackoff. Defaults to DefaultBackoff.
func RetryPolicy(policy func(attempt int, err error) time.Duration) SubscribeOption {
	return func(c *subscribeConfig) { c.retryPolicy = policy }
}

// safePolicy wraps a subscription's policy so a panic in it falls back on DefaultBackoff.
func safePolicy(policy func(int, error) time.Duration, log *slog.Logger, table, queue string) func(int, error) time.Duration {
	if policy == nil {
		return DefaultBackoff
	}
	return func(attempt int, err error) (d time.Duration) {
		defer func() {
			if v := recover(); v != nil {
				log.Error("rowactor: the retry policy panicked; the delivery backs off by DefaultBackoff",
					slog.String("table", table), slog.String("queue", queue), slog.Int("attempt", attempt), slog.Any("panic", v))
				d = DefaultBackoff(attempt, err)
			}
		}()
		return policy(attempt, err)
	}
}
