package rowactor

import (
	"time"

	"github.com/rowactor/rowactor/settler"
)

// Outcome is what a handler decided for its row. Build one with Ack, Drop, Retry,
// RetryAfter, Fail, Snooze, Cancel, DeadLetter or Event; the zero Outcome is an
// unsettled delivery, whose row is released at once.
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

// Fail reports that the handler failed with err. The attempt is counted, and the row
// returns to the queue after the subscription's retry policy's delay, kept in its
// retry_after column. The default policy is DefaultBackoff. Once the attempts are spent,
// the row moves to its dead letter instead, as a Retry's would.
//
// err's text is written to the table's error column, Table.Error, when it has one, cut
// to dialects.MaxErrorBytes; it goes with the row to its dead letter. err is also logged
// once at WARN, recorded on the delivery's span, and given to the WithOnSettled hook as
// Settlement.HandlerErr. Fail(nil) fails without a reason: the error column keeps what it
// held.
//
// A table without retry_after cannot keep the delay in the row. In the lease form the row
// stays leased until it is due. In the row lock and advisory forms it retries at once,
// and the subscription logs a warning once. In transactional mode the handler's writes
// are rolled back first. See docs/forms.md, "Outcomes".
func Fail(err error) Outcome {
	o := Outcome{settler.Outcome{Verdict: settler.Fail}}
	return o.WithError(err)
}

// Snooze returns the row to the queue, due after d, without spending an attempt: "not
// yet", not a failure. The lease and advisory forms give back the attempt their claim
// counted, never below zero, in the same statement; the row lock form counts none. A
// snoozed row never moves to a dead letter, and a Snooze runs no OnEvent event.
//
// The delay lives in the retry_after column. A lease table without one keeps the row
// leased until it is due instead. In the row lock and advisory forms, Snooze on such a
// table is refused: the row is released unsettled, the settlement's error is a
// *ConfigError, and the subscription logs a warning once. In transactional mode the
// handler's writes are rolled back first.
func Snooze(d time.Duration) Outcome {
	return Outcome{settler.Outcome{Verdict: settler.Snooze, Delay: d}}
}

// Cancel ends a row that should not run again: a job the service no longer wants. It
// ends the row exactly as Broker.Cancel does, whatever its attempts: as a Drop (deleted,
// or kept with processed_at set where the table has that column), its reason, err's
// text, in the error column after dialects.CancelledPrefix. A kept row then reads as
// JobCancelled, not as processed, and Stats leaves the reason out of its most frequent
// errors. It never moves to a dead letter: return DeadLetter for that. No event of the
// subscription's replaces it (as none replaces Broker.Cancel's end).
//
// err is also given to the WithOnSettled hook as HandlerErr and recorded on the span;
// the cancel is logged at INFO. Cancel(nil) writes the prefix alone. In transactional
// mode the handler's writes are rolled back first.
func Cancel(err error) Outcome {
	o := Outcome{settler.Outcome{Verdict: settler.Cancel}}
	return o.WithError(err)
}

// DeadLetter moves the row to its dead letter at once, whatever its attempts: a payload
// that does not decode, or a job that can never succeed and that someone should look at.
// Without a dead letter (no DeadLetterGroup or DeadLetterTable) the row is dropped
// instead, as a Drop with err's text, and a WARN says so.
//
// err's text is kept as Fail's is: in the error column, with the row in its dead letter,
// in the hook's HandlerErr and on the span. The move is logged once at WARN. In
// transactional mode the handler's writes are rolled back first.
func DeadLetter(err error) Outcome {
	o := Outcome{settler.Outcome{Verdict: settler.DeadLetter}}
	return o.WithError(err)
}

// Event settles the row with an event of the service's own: the SQL the subscription
// gave for name with OnEvent, binding args to {arg1}, {arg2}, ... It runs where the form
// runs a settlement, and in transactional mode it commits the handler's writes with it,
// like Ack. A name the subscription has no event for releases the row unsettled, and the
// settlement reports ErrUnknownEvent.
func Event(name string, args ...any) Outcome {
	return Outcome{settler.Outcome{Verdict: settler.Custom, Event: name, Args: args}}
}

// WithError returns the outcome carrying err. The settlement writes err's text to the
// table's error column, as Fail's, and an event of the service's own binds it as {error}.
// So Retry().WithError(err) records why a row is retried, and Drop().WithError(err) why
// it was dropped, on a table with processed_at.
//
// The WithOnSettled hook sees err as Settlement.HandlerErr, and the delivery's span
// records it. It changes nothing else: only Fail logs the error and backs off. A nil err
// changes nothing at all.
func (o Outcome) WithError(err error) Outcome {
	if err != nil {
		o.o.Err, o.o.Error = err, err.Error()
	}
	return o
}

// Event is an Event outcome's event name.
func (o Outcome) Event() string { return o.o.Event }

// String names the outcome: "ack", "drop", "retry", "retry_after", "fail", "snooze",
// "cancel", "dead_letter", "event" or "unsettled".
func (o Outcome) String() string { return o.o.Verdict.String() }

// Delay is the delay of RetryAfter or Snooze. A Fail's delay comes from the retry policy
// when it settles.
func (o Outcome) Delay() time.Duration { return o.o.Delay }

// Err is the error the outcome carries: Fail's, Cancel's, DeadLetter's, or WithError's;
// nil when none.
func (o Outcome) Err() error { return o.o.Err }
