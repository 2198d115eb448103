package actors

import (
	"log/slog"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/settler"
)

// notePlan logs what a delivery's plan calls for: a failed handler once per Fail, with its
// error; a retry turned into a dead-letter move; a table that cannot keep a delay (once
// per subscription for Fail and Snooze, whose rows would otherwise flood the log). It
// returns the error a refused step reports (a Snooze the table cannot keep), nil when the
// step runs.
func (s *Subscription) notePlan(row dialects.Row, o settler.Outcome, step dialects.Step, note settler.Note) error {
	if o.Verdict != settler.Fail && note == settler.NoteNone {
		return nil // most rows: nothing to log
	}
	return s.logPlan(row, o, step, note)
}

// logPlan is notePlan's logging, in a function of its own: its log attributes take 2 KB
// of stack frame, which a delivery's goroutine, its stack shrunk by the GC while idle,
// had to grow (and copy) for every row on the way to its settlement.
func (s *Subscription) logPlan(row dialects.Row, o settler.Outcome, step dialects.Step, note settler.Note) error {
	cfg := &s.cfg
	log := cfg.Log
	if o.Verdict == settler.Fail {
		attrs := []any{slog.String("table", cfg.Table), slog.String("queue", cfg.QueueName), slog.Int64("id", row.ID),
			slog.Int("attempt", row.Attempt), slog.String("form", cfg.Form.String()), slog.Any("error", o.Err)}
		if note == settler.NoteAttemptsSpent {
			log.Warn("rowactor: the handler failed and its attempts are spent; moving the row to its dead letter",
				append(attrs, slog.String("dead_letter", cfg.DeadLetter))...)
		} else {
			log.Warn("rowactor: the handler failed; the row is retried", append(attrs, slog.Duration("delay", step.At.Sub(step.Now)))...)
		}
	}
	switch note {
	case settler.NoteCancelled:
		// A deliberate end, not a failure: INFO, as Broker.Cancel's ends are not logged.
		log.Info("rowactor: the handler cancelled the row; it ends as cancelled",
			slog.String("table", cfg.Table), slog.String("queue", cfg.QueueName), slog.Int64("id", row.ID),
			slog.Int("attempt", row.Attempt), slog.Any("reason", o.Err))
	case settler.NoteDeadLettered:
		attrs := []any{slog.String("table", cfg.Table), slog.String("queue", cfg.QueueName), slog.Int64("id", row.ID),
			slog.Int("attempt", row.Attempt), slog.String("form", cfg.Form.String()), slog.Any("error", o.Err)}
		if step.Kind == dialects.StepDeadLetter {
			log.Warn("rowactor: the handler sent the row to its dead letter; moving it",
				append(attrs, slog.String("dead_letter", cfg.DeadLetter))...)
		} else {
			log.Warn("rowactor: the handler sent the row to its dead letter, but the subscription has none, so the row is dropped", attrs...)
		}
	case settler.NoteAttemptsSpent:
		if o.Verdict != settler.Fail {
			log.Warn("rowactor: attempts are spent; moving the row to its dead letter",
				slog.String("table", cfg.Table), slog.Int64("id", row.ID), slog.Int("attempt", row.Attempt),
				slog.String("dead_letter", cfg.DeadLetter))
		}
	case settler.NoteNoRetryAfter:
		log.Warn("rowactor: the table has no retry_after column; RetryAfter runs as Retry",
			slog.String("table", cfg.Table), slog.Int64("id", row.ID))
	case settler.NoteFailNoRetryAfter:
		if s.warnedFailNoDelay.CompareAndSwap(false, true) {
			log.Warn("rowactor: the table has no retry_after column, so a failed row is retried at once, without its backoff; "+
				"add a retry_after column (Table.RetryAfter) to keep the delay (logged once per subscription)",
				slog.String("table", cfg.Table), slog.String("queue", cfg.QueueName), slog.String("form", cfg.Form.String()))
		}
	case settler.NoteSnoozeNoRetryAfter:
		err := &dialects.ConfigError{Table: cfg.Table, Option: "Snooze",
			Reason: "Snooze keeps the row's due time in its retry_after column, and the table names none (only the lease form can wait in its lease)",
			Fix:    "add a retry_after column (Table.RetryAfter), or return RetryAfter or Retry"}
		if s.warnedSnooze.CompareAndSwap(false, true) {
			log.Warn("rowactor: Snooze is refused on a table without a retry_after column; the row is released unsettled (logged once per subscription)",
				slog.String("table", cfg.Table), slog.String("queue", cfg.QueueName), slog.String("form", cfg.Form.String()),
				slog.Any("error", err))
		}
		return err
	}
	return nil
}
