package rowactor

import (
	"context"
	"errors"
)

// Func adapts an ordinary Go function to a Handler, so a handler needs no outcome
// vocabulary: returning nil acks the row; returning an error fails it (Fail: the
// subscription's retry policy's backoff, the error kept in the error column, logged and
// traced, a dead letter once the attempts are spent). Any Outcome is an error too, so a
// function can also return Snooze(d), Cancel(err), RetryAfter(d), Drop() or a Custom
// event, bare or wrapped (fmt.Errorf("...: %w", rowactor.Snooze(d))): the outermost
// Outcome in the error's chain settles the row.
//
// A panic is handled as for a Handler: the row is released unsettled.
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
// outcome's name, as String's ("snooze"), so an Outcome prints the same either way; the
// error it carries stays reachable through Unwrap.
func (o Outcome) Error() string { return o.o.Verdict.String() }

// Unwrap returns the error the outcome carries (Fail's, Cancel's, WithError's), so
// errors.Is and errors.As see through an Outcome returned as an error.
func (o Outcome) Unwrap() error { return o.o.Err }
