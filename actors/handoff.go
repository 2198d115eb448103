package actors

import (
	"context"
	"errors"
	"log/slog"
	"math"

	"github.com/rowactor/rowactor/claimer"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/settler"
)

// Claims are handed from the claimers to the subscription actor through the handoff, not
// by the message alone: a stopping actor drops the messages still in its mailbox once its
// children have stopped, so a claim that returned as Shutdown began would leave its rows
// held (a row lock claim's transaction idle on a pool connection, an advisory session
// with its key, a lease with its attempt spent). Every answer is recorded here before it
// is sent; the subscription actor takes it when the message arrives, and whatever is left
// when the actor has stopped is released here. Invariant: every claim started is either
// delivered or released, whatever the timing of Shutdown.

// handoff records a claimer's answer before it is sent; false (the subscription stopped)
// means the answer's rows were released here and the answer must not be sent.
func (s *Subscription) handoff(m *claimer.Claimed) bool {
	s.handMu.Lock()
	if !s.handClosed {
		if s.inHand == nil {
			s.inHand = make(map[*claimer.Claimed]struct{})
		}
		s.inHand[m] = struct{}{}
		s.handMu.Unlock()
		return true
	}
	s.handMu.Unlock()
	s.releaseClaimed(m)
	return false
}

// takeClaimed takes an answer out of the handoff for the subscription actor; false means
// the stop released it already.
func (s *Subscription) takeClaimed(m *claimer.Claimed) bool {
	s.handMu.Lock()
	defer s.handMu.Unlock()
	if _, ok := s.inHand[m]; !ok {
		return false
	}
	delete(s.inHand, m)
	return true
}

// closeHandoff refuses later answers and releases those never taken: the subscription
// actor has stopped, and its claimers with it.
func (s *Subscription) closeHandoff() {
	s.handMu.Lock()
	s.handClosed = true
	left := s.inHand
	s.inHand = nil
	s.handMu.Unlock()
	for m := range left {
		s.releaseClaimed(m)
	}
}

// releaseClaimed gives back the rows of an answer nobody will deliver, each by its form's
// rule for a row whose handler never started (their claims' attempts given back), on
// statements the stop does not cut short (each bounded by the settle timeout), and
// reports each as released.
func (s *Subscription) releaseClaimed(m *claimer.Claimed) {
	cfg := &s.cfg
	base := context.WithoutCancel(cfg.ctx)
	if m.Batch != nil {
		ctx, cancel := context.WithTimeout(base, cfg.settleTimeout)
		err := m.Batch.Rollback(ctx)
		cancel()
		for _, row := range m.Batch.Rows() {
			s.released.Add(1)
			s.report(Result{Row: row, Step: dialects.StepRelease, Released: true, Err: settler.ErrClosed})
		}
		s.warnRelease(0, err)
	}
	for _, cl := range m.Claims {
		d := &delivery{sub: s, claim: cl}
		r := d.giveBack(base) // logs what it could not give back
		r.Err = errors.Join(settler.ErrClosed, r.Err)
		if r.Released {
			s.released.Add(1)
		}
		if r.closed {
			s.closed.Add(1)
		}
		s.report(r)
	}
}

func (s *Subscription) warnRelease(id int64, err error) {
	if err != nil {
		s.cfg.Log.Warn("rowactor: could not release a row claimed as the subscription stopped; it returns by its form's rule",
			slog.String("table", s.cfg.Table), slog.Int64("id", id), slog.Any("error", err))
	}
}

// newShare returns the subscription's share of its pool's connection budget; a dialect
// with no budget (no connection held per row, or an unbounded pool) gets one of its own
// that never runs out.
func newShare(b *dialects.Budget, wake func()) *dialects.BudgetShare {
	if b == nil {
		b = dialects.NewBudget(math.MaxInt)
	}
	return b.Share(wake)
}
