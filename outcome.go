package rowactor

import (
	"time"

	"github.com/rowactor/rowactor/settler"
)

// Outcome is what a handler decided for its row. Build one with Ack, Drop, Retry,
// RetryAfter, Fail, Snooze or Custom; the zero Outcome is an unsettled delivery, whose
// row is released at once.
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

// Fail reports that the handler failed with err. The row returns to the queue after the
// subscription's retry policy's delay (RetryPolicy; DefaultBackoff: 1 s doubling per
// attempt, ±20 %, at most an hour), kept in its retry_after column like RetryAfter's, and
// the attempt is counted. With the attempts spent (MaxAttempts, or DefaultMaxAttempts when
// the subscription has a dead letter and no MaxAttempts) the row moves to its dead letter
// instead, as a Retry's would.
//
// err's text is written to the table's error column (Table.Error), when it has one, by
// the settlement statement itself, cut to dialects.MaxErrorBytes, and goes with the row to
// its dead letter. err is also logged once at WARN (attributes table, queue, id, attempt,
// form, error), recorded on the delivery's span (status Error, an exception event), and
// given to the WithOnSettled hook as Settlement.HandlerErr. Fail(nil) fails without a
// reason: the error column keeps what it held.
//
// A table without retry_after cannot keep the delay in the row: in the lease form the
// row stays leased until it is due (locked_until holds the due time); in the row lock and
// advisory forms it retries at once, and the subscription logs a warning once. In
// transactional mode the handler's writes are rolled back first.
func Fail(err error) Outcome {
	o := Outcome{settler.Outcome{Verdict: settler.Fail}}
	return o.WithError(err)
}

// Snooze returns the row to the queue, due after d, without spending an attempt: "not
// yet", not a failure. The lease and advisory forms give back the attempt their claim
// counted (never below zero) in the same statement; the row lock form counts none. A
// snoozed row never moves to a dead letter, whatever its attempts.
//
// The delay lives in the retry_after column. A lease table without one keeps the row
// leased until it is due instead; in the row lock and advisory forms Snooze on such a
// table is refused: the row is released unsettled, the settlement's error is a
// *ConfigError naming the table and the fix, and the subscription logs a warning once.
// In transactional mode the handler's writes are rolled back first. A Snooze has no
// event of its own (OnEvent): it always runs its built-in statement.
func Snooze(d time.Duration) Outcome {
	return Outcome{settler.Outcome{Verdict: settler.Snooze, Delay: d}}
}

// Cancel ends a row that can never succeed (a payload that does not decode, a job the
// service no longer wants), whatever its attempts: it moves to its dead letter at once
// when the subscription has one, else it is dropped. err's text is kept like Fail's (the
// error column, moved with the row to its dead letter; the WithOnSettled hook's
// HandlerErr; the span), and the cancel is logged once at WARN. In transactional mode the
// handler's writes are rolled back first.
func Cancel(err error) Outcome {
	o := Outcome{settler.Outcome{Verdict: settler.Cancel}}
	return o.WithError(err)
}

// Custom settles the row with an event of the service's own: the SQL the subscription
// gave for name with OnEvent, binding args to {arg1}, {arg2}, ... It runs where the form
// runs a settlement, and in transactional mode it commits the handler's writes with it,
// like Ack. A name the subscription has no event for releases the row unsettled, and the
// settlement reports ErrUnknownEvent.
func Custom(name string, args ...any) Outcome {
	return Outcome{settler.Outcome{Verdict: settler.Custom, Event: name, Args: args}}
}

// WithError returns the outcome carrying err: an event of the service's own binds its
// text as {error}, and the settlement writes it to the table's error column (Table.Error)
// like Fail's: Retry().WithError(err) and RetryAfter(d).WithError(err) record why, and
// Drop().WithError(err) keeps why a row was dropped (with processed_at). The
// WithOnSettled hook sees it as Settlement.HandlerErr, and the delivery's span records
// it. It changes nothing else (only Fail logs the error and backs off); a nil err
// changes nothing at all.
func (o Outcome) WithError(err error) Outcome {
	if err != nil {
		o.o.Err, o.o.Error = err, err.Error()
	}
	return o
}

// Event is a Custom outcome's event name.
func (o Outcome) Event() string { return o.o.Event }

// String names the outcome ("ack", "drop", "retry", "retry_after", "fail", "snooze",
// "cancel", "custom", "unsettled").
func (o Outcome) String() string { return o.o.Verdict.String() }

// Delay is RetryAfter's or Snooze's delay (a Fail's comes from the retry policy when it
// settles).
func (o Outcome) Delay() time.Duration { return o.o.Delay }

// Err is the error the outcome carries: Fail's, or WithError's; nil when none.
func (o Outcome) Err() error { return o.o.Err }
