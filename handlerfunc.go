package rowactor

import (
	"context"
	"errors"
)

// Func adapts an ordinary Go function to a Handler, so a handler needs no outcome
// vocabulary. Returning nil acks the row. Returning an error fails it as Fail does: the
// retry policy's backoff, the error kept in the error column, logged and traced, and a
// dead letter once the attempts are spent.
//
// Any Outcome is an error too, so the function can also return Snooze, Cancel,
// DeadLetter, RetryAfter, Drop or an Event, bare or wrapped with fmt.Errorf and %w. The
// outermost Outcome in the error's chain settles the row. A panic is handled as for a
// Handler: the row is released unsettled.
func Func(f func(ctx context.Context, d *Delivery) error) Handler {
	if f == nil {
		return nil // Subscribe refuses a nil handler by name
	}
	return func(ctx context.Context, d *Delivery) Outcome { return outcomeOf(f(ctx, d)) }
}

// outcomeOf is the outcome an error returned by a Func handler asks for.
func outcomeOf(err error) Outcome {
	if err == nil {
		return Ack()
	}
	var o Outcome
	if errors.As(err, &o) {
		return o
	}
	return Fail(err)
}

// Error makes an Outcome an error, so a Func handler can return it. Its text is the
// outcome's name, as String gives it, such as "snooze". The error it carries stays
// reachable through Unwrap.
func (o Outcome) Error() string { return o.o.Verdict.String() }

// Unwrap returns the error the outcome carries, from Fail, Cancel, DeadLetter or WithError, so
// errors.Is and errors.As see through an Outcome returned as an error.
func (o Outcome) Unwrap() error { return o.o.Err }
