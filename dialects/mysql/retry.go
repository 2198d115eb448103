package mysql

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Server errors a claim retries: InnoDB rolled the transaction (or the statement) back
// and nothing of the claim was kept.
const (
	errLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT
	errDeadlock        = 1213 // ER_LOCK_DEADLOCK
)

// IsRetryable reports whether err is a deadlock (1213) or a lock wait timeout (1205): the
// server gave up on the statement or its transaction, and running it again may succeed.
// Claims retry these themselves, a few times with a short jittered backoff, before they
// return the error.
func IsRetryable(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	return me.Number == errDeadlock || me.Number == errLockWaitTimeout
}

// retryDelays are the waits before each retry of a claim, before jitter.
var retryDelays = []time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 80 * time.Millisecond}

// withRetry runs fn, and again after each retryDelay while it fails with a retryable
// error. Each run must be a whole transaction: a deadlock rolled the last one back.
func withRetry[T any](ctx context.Context, fn func() (T, error)) (T, error) {
	return withRetryIf(ctx, IsRetryable, fn)
}

// isDeadlock reports a deadlock (1213), which rolled its transaction back.
func isDeadlock(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == errDeadlock
}

// withRetryIf is withRetry for the errors retryable accepts.
func withRetryIf[T any](ctx context.Context, retryable func(error) bool, fn func() (T, error)) (T, error) {
	for i := 0; ; i++ {
		v, err := fn()
		if err == nil || !retryable(err) || i == len(retryDelays) {
			return v, err
		}
		// Half to one and a half times the delay, so colliding claims drift apart.
		d := retryDelays[i]
		d = d/2 + rand.N(d)
		timer := time.NewTimer(d)
		select {
		case <-ctx.Done():
			timer.Stop()
			return v, errors.Join(err, ctx.Err())
		case <-timer.C:
		}
	}
}
