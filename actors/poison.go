package actors

import (
	"log/slog"

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
		attrs = append(attrs, slog.String("fix", setAsideFix(sa.Way, cfg.DeadLetter)))
		if sa.Way == claimer.NotSetAside {
			cfg.Log.Error("rowactor: a row cannot be worked on its data and could not be set aside; its claim tries again", attrs...)
			continue
		}
		n++
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
			"a dead letter (MaxAttempts with DeadLetterGroup or DeadLetterTable) or a retry_after column would set such rows aside for good"
	}
	return "correct the row's data or delete the row, or give the subscription a dead letter (MaxAttempts with DeadLetterGroup or DeadLetterTable)"
}

// notePoison tells the claimers of a row whose settlement failed on its data (FaultData):
// its next claim sets it aside instead of delivering it again. A batched settlement's
// failure names no row, and is left alone.
func (s *Subscription) notePoison(r Result) {
	cfg := &s.cfg
	if r.Err == nil || cfg.Classify == nil || cfg.Classify(r.Err) != dialects.FaultData {
		return
	}
	if s.batcher != nil && settler.Batchable(dialects.Step{Kind: r.Step, Event: r.Event}) {
		return
	}
	s.poison.Suspect(r.Row.ID, r.Err)
	cfg.Log.Warn("rowactor: a settlement failed on the row's data; the row is set aside at its next claim",
		slog.String("table", cfg.Table), slog.Int64("id", r.Row.ID), slog.String("step", r.Step.String()), slog.Any("error", r.Err))
}
