package rowactor

import (
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
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

// DefaultMaxAttempts caps the deliveries of a subscription that has a dead letter and no
// MaxAttempts. A Fail, Retry or RetryAfter of a row whose attempt reached it moves the
// row to its dead letter. 25 is River's default too; under DefaultBackoff a row's 24
// waits add up to about twelve hours.
const DefaultMaxAttempts = 25

// DefaultBackoff is the retry policy of a subscription without RetryPolicy. It waits 1 s
// after the first failure, doubling with each attempt, and never more than an hour. Each
// delay is spread by 20 % either side at random, so that rows which failed together do
// not come back together. The tenth failure waits 6.8 to 10.2 minutes; from the
// thirteenth on, the delay lies between 48 and 60 minutes.
//
// An attempt below 1 reads as 1; a table without an attempt column reports 0. err is not
// consulted.
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

// jitter spreads d by backoffJitter either side. u, from 0 up to but not including 1,
// picks the point: d·0.8 at 0, towards d·1.2 as u nears 1. The result is capped at
// backoffCap.
func jitter(d time.Duration, u float64) time.Duration {
	f := 1 - backoffJitter + 2*backoffJitter*u
	return min(time.Duration(float64(d)*f), backoffCap)
}

// RetryPolicy sets how long a row waits after its handler failed with Fail. policy gets
// the attempt the delivery reported, 1 for the first delivery, and the handler's error,
// and returns the delay; a negative delay is none. Retry and RetryAfter never consult it.
// A nil policy keeps the default, DefaultBackoff.
//
// It runs on the delivery's actor when the outcome settles, so it must be quick and must
// not block. A policy that panics is replaced by DefaultBackoff for that delivery, and the
// panic is logged.
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
					slog.String("table", table), slog.String("queue", queue), slog.Int("attempt", attempt), slog.Any("panic", v),
					slog.String("stack", string(debug.Stack())))
				d = DefaultBackoff(attempt, err)
			}
		}()
		return policy(attempt, err)
	}
}
