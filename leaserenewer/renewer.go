package leaserenewer

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/rowactor/rowactor/dialects"
)

// Config is what a renewer needs.
type Config struct {
	Queue dialects.LeaseQueue
	Book  *Book
	Lease time.Duration
	Now   func() time.Time
	Log   *slog.Logger
	// Ctx bounds every statement; it ends when the subscription is torn down.
	Ctx context.Context
	// Waits, when set, bounds the retries that wait for rows other sessions hold
	// (WaitingExtender) in place of Ctx, and must end when Ctx does: it ends as the
	// subscription begins to stop, which need not wait for them (a wait cut short moves
	// nothing).
	Waits context.Context
	// OnRound, if set, is told of each round's size and the leases it found lost.
	OnRound func(extended, lost int, err error)
	// Dispatcher runs the renewer's mailbox; nil means Proto.Actor's default.
	Dispatcher actor.Dispatcher
}

// tick asks the renewer for a round. It implements actor.IgnoreDeadLetterLogging: a tick
// that arrives after the renewer stopped is expected.
type tick struct{}

func (tick) IgnoreDeadLetterLogging() {}

// RenewNow asks the renewer for a round at once, besides its half-lease rounds: a claim
// came back with less than half a lease left.
type RenewNow struct{}

// IgnoreDeadLetterLogging: a request that arrives after the renewer stopped is expected.
func (RenewNow) IgnoreDeadLetterLogging() {}

// retryBusy asks the renewer to extend again the leases its last round found busy (their
// rows held by another session), and only those.
type retryBusy struct{}

func (retryBusy) IgnoreDeadLetterLogging() {}

// Props returns the props of a renewer actor: every half lease it extends every lease in
// the book in one statement. A round that fails leaves every token as it was; the next
// round tries again.
func Props(cfg Config) *actor.Props {
	var opts []actor.PropsOption
	if cfg.Dispatcher != nil {
		opts = append(opts, actor.WithDispatcher(cfg.Dispatcher))
	}
	return actor.PropsFromProducer(func() actor.Actor { return &renewer{cfg: cfg} }, opts...)
}

type renewer struct {
	cfg     Config
	stopped atomic.Bool
	timer   *time.Timer
	// retry brings a round for leases whose rows another session held, an eighth of a
	// lease after the round that skipped them; nil or fired when none is due.
	retry   *time.Timer
	retryAt time.Time
	// busy are the rows whose leases the last round left busy: a retry extends only
	// them, so a row locked for minutes costs its own retries, not a round of every
	// lease each eighth of a lease.
	busy map[int64]struct{}
}

func (r *renewer) Receive(c actor.Context) {
	switch c.Message().(type) {
	case *actor.Started:
		r.arm(c)
	case tick:
		if r.stopped.Load() {
			return
		}
		r.round(c)
		r.arm(c)
	case RenewNow:
		if !r.stopped.Load() {
			r.round(c)
		}
	case retryBusy:
		if !r.stopped.Load() && len(r.busy) > 0 {
			r.roundOf(c, r.busy)
		}
	case *actor.Stopping, *actor.Restarting:
		r.stopped.Store(true)
		if r.timer != nil {
			r.timer.Stop()
		}
		if r.retry != nil {
			r.retry.Stop()
		}
	}
}

// arm schedules the next round half a lease from now. A plain AfterFunc is used rather than
// Proto.Actor's scheduler, whose cancel races under -race.
func (r *renewer) arm(c actor.Context) {
	sys, self := c.ActorSystem(), c.Self()
	r.timer = time.AfterFunc(r.cfg.Lease/2, func() {
		if !r.stopped.Load() {
			sys.Root.Send(self, tick{})
		}
	})
}

// soon asks for a retry of the busy leases an eighth of a lease from now, unless one is
// already due by then.
func (r *renewer) soon(c actor.Context) {
	at := r.cfg.Now().Add(r.cfg.Lease / 8)
	if r.retry != nil && r.retryAt.After(r.cfg.Now()) {
		return
	}
	sys, self := c.ActorSystem(), c.Self()
	r.retryAt = at
	r.retry = time.AfterFunc(r.cfg.Lease/8, func() {
		if !r.stopped.Load() {
			sys.Root.Send(self, retryBusy{})
		}
	})
}

func (r *renewer) round(c actor.Context) { r.roundOf(c, nil) }

// roundOf extends the live leases of the rows in only, or of every row when only is nil.
func (r *renewer) roundOf(c actor.Context, only map[int64]struct{}) {
	held := r.cfg.Book.beginOf(only)
	if only != nil {
		r.busy = nil // the retry looks at them again; those still busy come back below
	}
	if len(held) == 0 {
		return
	}
	until := Expiry(r.cfg.Now(), r.cfg.Lease)
	var (
		moved   []int64
		err     error
		busyErr *dialects.RowsBusyError
		busy    []int64
	)
	if w, ok := r.cfg.Queue.(dialects.WaitingExtender); ok && only != nil {
		// A retry of leases found busy waits for their rows' locks, an eighth of a lease
		// at most: a lock held a moment (another claim reading the row) is waited out
		// before the lease runs out; one held longer leaves them busy for the next try.
		base := r.cfg.Ctx
		if r.cfg.Waits != nil {
			base = r.cfg.Waits
		}
		ctx, cancel := context.WithTimeout(base, r.cfg.Lease/8)
		moved, err = w.ExtendLeasesWaiting(ctx, until, leases(held))
		timedOut := ctx.Err() != nil && r.cfg.Ctx.Err() == nil
		cancel()
		if errors.As(err, &busyErr) {
			busy, err = busyErr.IDs, nil // the server ended the wait (its own lock timeout)
		} else if err != nil && timedOut {
			// Those not moved are busy still, unless the statement did run.
			moved = append(moved, r.readBack(held, until, moved)...)
			busy, err = dialects.IDs(dialects.Missing(leases(held), moved)), nil
		}
	} else {
		ctx, cancel := context.WithTimeout(r.cfg.Ctx, r.cfg.Lease/2)
		moved, err = r.cfg.Queue.ExtendLeases(ctx, until, leases(held))
		cancel()
		if errors.As(err, &busyErr) {
			busy, err = busyErr.IDs, nil
		} else if err != nil {
			moved = append(moved, r.readBack(held, until, moved)...)
		}
	}
	lost := r.cfg.Book.end(held, until, moved, err != nil, busy)
	if only == nil {
		r.busy = nil // a whole round tells afresh which rows are busy
	}
	for _, id := range busy {
		if r.busy == nil {
			r.busy = make(map[int64]struct{}, len(busy))
		}
		r.busy[id] = struct{}{}
	}
	if len(busy) > 0 {
		// Another session holds those rows: come back for them well before the next
		// round, while their leases still run.
		r.cfg.Log.Debug("rowactor: leases whose rows another session holds wait for a later round",
			slog.Int("leases", len(busy)))
		r.soon(c)
	}
	if err != nil {
		r.cfg.Log.Warn("rowactor: lease extension failed; leases keep their tokens until the next round",
			slog.Int("leases", len(held)), slog.Any("error", err))
	}
	for _, id := range lost {
		r.cfg.Log.Warn("rowactor: a lease was gone when the renewer came; its settlement will not take effect",
			slog.Int64("id", id))
	}
	if r.cfg.OnRound != nil {
		r.cfg.OnRound(len(moved), len(lost), err)
	}
}

// readBack reads back a round that failed, before its leases are given back to their
// deliveries: its statement may have run on the server though its answer never came (the
// context ended with the answer on its way: this process stalled, the network was slow,
// the commit's reply was lost). Believing such a round moved nothing would leave the book
// with tokens the rows no longer hold, and each delivery's settlement would find its lease
// lost. A row that holds the round's token counts as moved only when no other claim can
// have written that value, which two bounds make sure of, each on its own:
//
//   - the round's token is less than a lease after the old one: a claim takes the row only
//     once the old token ended, and writes at least a lease later (every host of the
//     subscription claims with this lease), whatever its clock says;
//   - the read's answer came while the old token still ran by this host's clock: until
//     then no claim on a host whose clock agrees could take the row.
//
// Each lease is judged on its own: one whose old token ran out does not keep the others
// from being confirmed. It returns the ids found so.
func (r *renewer) readBack(held []*Held, until time.Time, moved []int64) []int64 {
	now := r.cfg.Now()
	var (
		ask    []dialects.Lease
		latest time.Time
	)
	old := make(map[int64]time.Time)
	for _, l := range dialects.Missing(leases(held), moved) {
		if !l.Token.After(now) || !until.Before(l.Token.Add(r.cfg.Lease)) {
			continue // an answer could not tell whose the value is
		}
		ask = append(ask, dialects.Lease{ID: l.ID, Token: until})
		old[l.ID] = l.Token
		if l.Token.After(latest) {
			latest = l.Token
		}
	}
	if len(ask) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(r.cfg.Ctx, min(latest.Sub(now), r.cfg.Lease/2))
	found, err := r.cfg.Queue.Holding(ctx, ask)
	cancel()
	if err != nil {
		r.cfg.Log.Debug("rowactor: could not read back a failed lease extension", slog.Any("error", err))
		return nil
	}
	now = r.cfg.Now()
	kept := found[:0]
	for _, id := range found {
		if t, ok := old[id]; ok && t.After(now) {
			kept = append(kept, id)
			delete(old, id) // a row named twice counts once
		}
	}
	return kept
}
