package rowactor

import (
	"time"

	"github.com/rowactor/rowactor/settler"
)

// Outcome is what a handler decided for its row. Build one with Ack, Drop, Retry or
// RetryAfter; the zero Outcome is an unsettled delivery, whose row is released at once.
type Outcome struct{ o settler.Outcome }

// Ack ends the row: it is deleted, or marked processed when the table has processed_at.
func Ack() Outcome { return Outcome{settler.Outcome{Verdict: settler.Ack}} }

// Drop ends the row like Ack: a poison message leaves the queue.
func Drop() Outcome { return Outcome{settler.Outcome{Verdict: settler.Drop}} }

// Retry returns the row to the queue at once. With MaxAttempts, a row whose attempts are
// spent moves to its dead letter instead.
func Retry() Outcome { return Outcome{settler.Outcome{Verdict: settler.Retry}} }

// RetryAfter returns the row to the queue, due after d. The delay lives in the row's
// retry_after column: it survives restarts and nothing is held in memory. A table without
// that column retries at once and logs a warning. With MaxAttempts, a row whose attempts
// are spent moves to its dead letter instead.
func RetryAfter(d time.Duration) Outcome {
	return Outcome{settler.Outcome{Verdict: settler.RetryAfter, Delay: d}}
}

// String names the outcome ("ack", "drop", "retry", "retry_after", "unsettled").
func (o Outcome) String() string { return o.o.Verdict.String() }

// Delay is RetryAfter's delay.
func (o Outcome) Delay() time.Duration { return o.o.Delay }
