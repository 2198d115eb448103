package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/rowactor/rowactor/claimer"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/settler"
)

// Poison rows: one row's data never stops its queue. A row whose data a claim cannot read,
// or whose settlement failed on its data, is set aside by the claimer at its claim (see
// claimer/poison.go), and the rows beside it are delivered. The subscription keeps the
// record the claimers share, tells it of settlements that failed on a row's data, and logs
// every row set aside as an error naming the table, the row and the fix.

// newPoison is the record a subscription's claimers share.
func newPoison(cfg *Config) *claimer.Poison {
	return &claimer.Poison{
		DeadLetter:      cfg.DeadLetter != "",
		DeadLetterEvent: cfg.Rules.Events[dialects.EventDeadLetter],
		RetryAfter:      cfg.Rules.HasRetryAfter,
		Classify:        cfg.Classify,
	}
}

// setAside logs the rows a claim set aside and returns how many were, which the claim
// counts as rows it took (the queue may hold more behind them). A row no way could set
// aside is not counted: the next claim waits for the poll rather than finding it at once.
func (a *subscriptionActor) setAside(m *claimer.Claimed) int {
	cfg := &a.s.cfg
	n := 0
	for _, sa := range m.SetAside {
		attrs := []any{slog.String("table", cfg.Table), slog.String("queue", cfg.QueueName), slog.Int64("id", sa.Row.ID),
			slog.String("set_aside", sa.Way.String()), slog.Any("cause", sa.Cause)}
		if sa.Err != nil {
			attrs = append(attrs, slog.Any("error", sa.Err))
		}
		fix := setAsideFix(sa.Way, cfg.DeadLetter)
		if sa.Announced && sa.Way != claimer.NotSetAside {
			fix = "the dead letter " + cfg.DeadLetter + " refused the row's move (the error logged then says why): make it take the row; then " +
				strings.TrimPrefix(fix, "correct the row's data, then ")
		}
		attrs = append(attrs, slog.String("fix", fix))
		if sa.Way == claimer.NotSetAside {
			cfg.Log.Error("rowactor: a row cannot be worked on its data and could not be set aside; its claim tries again", attrs...)
			continue
		}
		n++
		if sa.Announced {
			// The error was logged when the move failed, with its fix: this is its sequel.
			cfg.Log.Warn("rowactor: a row whose dead-letter move failed is set aside and the queue goes on", attrs...)
			continue
		}
		cfg.Log.Error("rowactor: a row cannot be worked on its data; it is set aside and the queue goes on", attrs...)
	}
	return n
}

// setAsideFix says what an operator does about a row set aside way.
func setAsideFix(way claimer.Way, deadLetter string) string {
	switch way {
	case claimer.DeadLettered:
		return "the row was moved to the dead letter " + deadLetter + "; correct its data there, then requeue it (rowactor requeue)"
	case claimer.ParkedRetryAfter:
		return "correct the row's data, then set its retry_after column (Table.RetryAfter) to NULL to return it to the queue"
	case claimer.ParkedLease:
		return "correct the row's data, then set its locked_until column (Table.LockedUntil) to NULL to return it to the queue"
	case claimer.Skipped:
		return "correct the row's data or delete the row: this subscription passes over it until the process restarts; " +
			"a dead letter (DeadLetterGroup or DeadLetterTable) or a retry_after column would set such rows aside for good"
	}
	return "correct the row's data or delete the row, or give the subscription a dead letter (MaxAttempts with DeadLetterGroup or DeadLetterTable)"
}

// guardsSettlements says whether a delivery brackets its settlement with Poison.Settling
// and Settled: in the row lock and advisory forms a failed settlement gives the row back
// before notePoison runs, so another claim could take it first and deliver it again. A
// leased row stays held by its token until its lease runs out; without Classify nothing
// is noted.
func (s *Subscription) guardsSettlements() bool {
	return s.cfg.Form != dialects.FormLease && s.cfg.Classify != nil
}

// notePoison tells the claimers of a row whose settlement failed on its data (FaultData):
// its next claim sets it aside instead of delivering it again. A batched settlement's
// failure names no row, and is left alone. A failed dead-letter move is noted whatever
// its fault but a passing one (noteDeadLetterFailed).
func (s *Subscription) notePoison(r Result) {
	cfg := &s.cfg
	if r.Err == nil || cfg.Classify == nil {
		return
	}
	if r.Step == dialects.StepDeadLetter {
		s.noteDeadLetterFailed(r)
		return
	}
	if cfg.Classify(r.Err) != dialects.FaultData {
		return
	}
	if s.batcher != nil && settler.Batchable(dialects.Step{Kind: r.Step, Event: r.Event, Error: r.Outcome.Error}) {
		return
	}
	s.poison.Suspect(r.Row.ID, r.Err)
	cfg.Log.Warn("rowactor: a settlement failed on the row's data; the row is set aside at its next claim",
		slog.String("table", cfg.Table), slog.Int64("id", r.Row.ID), slog.String("step", r.Step.String()), slog.Any("error", r.Err))
}

// noteDeadLetterFailed handles a move to the dead letter that failed. The row stays in
// the queue table as it was (the move is one statement, or one transaction). A failure
// that passes by itself (a lost connection, a deadlock, a lock wait, the settlement's
// timeout) leaves the row to come back by its form's rule. Any other (a constraint or a
// trigger of the dead-letter table, a column it cannot take, a table or privilege gone)
// would fail every move again: the row is not delivered again, but set aside at its next
// claim (parked in retry_after, or the other ways), and one error says which table,
// row, dead letter and constraint, and what to do.
func (s *Subscription) noteDeadLetterFailed(r Result) {
	cfg := &s.cfg
	err := r.Err
	if errors.Is(err, settler.ErrLeaseLost) || errors.Is(err, settler.ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return
	}
	switch cfg.Classify(err) {
	case dialects.FaultConnection, dialects.FaultContention:
		return
	}
	s.poison.DeadLetterFailed(r.Row.ID, err)
	where := "dead-letter group"
	if cfg.DeadLetterTable {
		where = "dead-letter table"
	}
	attrs := []any{slog.String("table", cfg.Table), slog.String("queue", cfg.QueueName), slog.Int64("id", r.Row.ID),
		slog.String("dead_letter", cfg.DeadLetter)}
	var culprit dialects.Culprit
	if cfg.Culprit != nil {
		culprit = cfg.Culprit(err)
	}
	refused := "it"
	switch {
	case culprit.Constraint != "":
		attrs = append(attrs, slog.String("constraint", culprit.Constraint))
		refused = "its constraint " + culprit.Constraint
	case culprit.Column != "":
		attrs = append(attrs, slog.String("column", culprit.Column))
		refused = "its column " + culprit.Column
	}
	if r.Event != "" {
		where = "dead_letter event"
	}
	attrs = append(attrs, slog.Any("error", err), slog.String("fix", fmt.Sprintf(
		"make the %s %s take the rows of %s (%s refused row %d: see error); then %s", where, cfg.DeadLetter, cfg.Table, refused, r.Row.ID,
		deadLetterRetryFix(cfg))))
	cfg.Log.Error("rowactor: a row's move to its dead letter failed; the row stays in the queue table, is not delivered again, "+
		"and is set aside at its next claim", attrs...)
}

// deadLetterRetryFix says how an operator returns a row set aside after its failed move,
// by where its next claim will set it aside.
func deadLetterRetryFix(cfg *Config) string {
	switch {
	case cfg.Rules.HasRetryAfter:
		return "set the row's retry_after column (Table.RetryAfter) to NULL: it is parked there, and is delivered again (and moved at its next failure)"
	case cfg.Form == dialects.FormLease:
		return "set the row's locked_until column (Table.LockedUntil) to NULL: it is parked there, and is delivered again (and moved at its next failure)"
	}
	return "restart the subscription: it passes over the row until the process restarts (a retry_after column would park such rows instead)"
}
