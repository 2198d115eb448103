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

// Custom settles the row with an event of the service's own: the SQL the subscription
// gave for name with OnEvent, binding args to {arg1}, {arg2}, ... It runs where the form
// runs a settlement, and in transactional mode it commits the handler's writes with it,
// like Ack. A name the subscription has no event for releases the row unsettled, and the
// settlement reports ErrUnknownEvent.
func Custom(name string, args ...any) Outcome {
	return Outcome{settler.Outcome{Verdict: settler.Custom, Event: name, Args: args}}
}

// WithError returns the outcome carrying err's text, which an event of the service's own
// binds as {error} (a retry that records why, say). It changes nothing else.
func (o Outcome) WithError(err error) Outcome {
	if err != nil {
		o.o.Error = err.Error()
	}
	return o
}

// Event is a Custom outcome's event name.
func (o Outcome) Event() string { return o.o.Event }

// String names the outcome ("ack", "drop", "retry", "retry_after", "custom", "unsettled").
func (o Outcome) String() string { return o.o.Verdict.String() }

// Delay is RetryAfter's delay.
func (o Outcome) Delay() time.Duration { return o.o.Delay }
