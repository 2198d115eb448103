package claimer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// Poison rows: a row the claim took but must not deliver, because its data cannot be read
// (dialects.Row.Fault) or because its last settlement failed on its data (Poison.Suspect),
// is set aside by the claimer, on what its claim holds (the lease token, the row lock,
// the key), and reported in Claimed.SetAside; the rows claimed beside it are delivered.
//
// A row is set aside the first of these ways that works:
//
//  1. moved to the subscription's dead letter (DeadLettered), when it has one;
//  2. parked with retry_after = dialects.SetAsideUntil (ParkedRetryAfter), when the table
//     has a retry_after column: no claim takes it until an operator clears it;
//  3. lease form: its lease moved to dialects.SetAsideUntil (ParkedLease), so no claim
//     takes it until locked_until is cleared;
//     advisory and row lock forms: skipped in memory by this subscription's later claims
//     (Skipped): the advisory claimer passes over its candidate, a row lock queue
//     (dialects.SkipQueue) over its id, until the process restarts.
//
// In the lease and advisory forms a way that fails leaves the row held, and the next way
// is tried at once. In the row lock form a failed statement ends the claim transaction:
// the row returns, and its next claim tries the next way. A batch's rows set aside are
// settled by their way's step in the batch's own commit.

// Way is how a row was set aside.
type Way uint8

const (
	// NotSetAside: every way failed (Claimed.SetAside's Err says why). The row stays as
	// claimed: its lease runs out, its claim transaction was rolled back, its key unlocked.
	NotSetAside Way = iota
	// DeadLettered: moved to the subscription's dead letter (group or table).
	DeadLettered
	// ParkedRetryAfter: retry_after = dialects.SetAsideUntil.
	ParkedRetryAfter
	// ParkedLease: locked_until = dialects.SetAsideUntil.
	ParkedLease
	// Skipped: this subscription's claims pass over it until the process restarts.
	Skipped
)

func (w Way) String() string {
	switch w {
	case DeadLettered:
		return "dead_letter"
	case ParkedRetryAfter:
		return "parked_retry_after"
	case ParkedLease:
		return "parked_lease"
	case Skipped:
		return "skipped"
	}
	return "not_set_aside"
}

// SetAside is a row a claim set aside instead of delivering it.
type SetAside struct {
	// Row is the claimed row as far as it could be read (its ID at least).
	Row dialects.Row
	// Cause is why: the row's data could not be read (a *dialects.RowDataError), or its
	// last settlement failed on its data.
	Cause error
	// Way is how it was set aside; for a batch's row, how it will be with the batch's
	// commit.
	Way Way
	// Err holds the failures of the ways tried before Way (all of them for NotSetAside).
	Err error
	// Announced says the row is set aside because its dead-letter move failed, which was
	// logged as an error when it failed (Poison.DeadLetterFailed).
	Announced bool
}

// Poison is a subscription's record of the rows it sets aside, shared by its claimers
// (and told by its deliveries of settlements that failed on a row's data).
type Poison struct {
	// DeadLetter: the subscription has a dead letter (group or table) to move rows to.
	DeadLetter bool
	// DeadLetterEvent: the subscription replaced the dead_letter settlement with an event
	// of its own, which the move then runs.
	DeadLetterEvent bool
	// RetryAfter: the table has a retry_after column to park rows in.
	RetryAfter bool
	// Classify names a batch settlement's fault (nil: every failure is FaultUnknown).
	Classify func(error) dialects.Fault

	mu sync.Mutex
	// suspects are rows to set aside at their next claim, with the ways already tried.
	suspects map[int64]suspect
	// skipped are the advisory rows set aside in memory, passed over by the claimer.
	skipped map[int64]struct{}
	// settling are the rows whose settlement runs now (Settling), each with the channel
	// its waiting claims are told on (made by the first of them).
	settling map[int64]chan struct{}
}

type suspect struct {
	cause error
	tried map[Way]bool
	// announced: the suspect's dead-letter move failed, and that was logged.
	announced bool
}

// maxSuspects bounds the rows remembered for their next claim (a row settled elsewhere is
// never claimed here again, and would stay in the book).
const maxSuspects = 10000

// Suspect records that row id's settlement failed on its data (cause): its next claim
// sets it aside instead of delivering it again.
func (p *Poison) Suspect(id int64, cause error) { p.tried(id, cause, NotSetAside) }

// DeadLetterFailed records that row id's move to its dead letter failed (cause) in a way
// that does not pass by itself (a constraint, a trigger, a missing table: not a lost
// connection or a deadlock), and that the failure was logged: its next claim sets it
// aside without delivering it again and without trying the move again (parked, or
// skipped), so a row whose dead letter refuses it never comes back to fail at once.
func (p *Poison) DeadLetterFailed(id int64, cause error) {
	p.tried(id, cause, DeadLettered)
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.suspects[id]; ok {
		s.announced = true
		p.suspects[id] = s
	}
}

// announced says row id is a suspect whose failed dead-letter move was logged.
func (p *Poison) announced(id int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.suspects[id].announced
}

// tried records row id as a suspect, with way among the ways that failed for it.
func (p *Poison) tried(id int64, cause error, way Way) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.suspects == nil {
		p.suspects = map[int64]suspect{}
	}
	s, ok := p.suspects[id]
	if !ok {
		if len(p.suspects) >= maxSuspects {
			return
		}
		if cause == nil {
			cause = errSuspect
		}
		s = suspect{cause: cause, tried: map[Way]bool{}}
	}
	if way != NotSetAside {
		s.tried[way] = true
	}
	p.suspects[id] = s
}

// failed records that way failed for row id with err: a data fault rules the way out for
// the row's next claim; another failure (a lost connection) leaves it to be tried again.
func (p *Poison) failed(id int64, cause error, way Way, err error) {
	if p.Classify != nil && p.Classify(err) == dialects.FaultData {
		p.tried(id, cause, way)
		return
	}
	p.tried(id, cause, NotSetAside)
}

// settled records how a row was set aside: set aside, it is forgotten (and, Skipped by
// the advisory claimer, passed over from now on); set aside no way, it stays a suspect.
func (p *Poison) settled(id int64, cause error, way Way) {
	if way == NotSetAside {
		p.tried(id, cause, NotSetAside)
		return
	}
	p.done(id, way)
}

// Settling records that row id's settlement starts, in a form whose failed settlement
// gives the row back (rolls back its claim, unlocks its key) before the delivery notes
// why it failed (Suspect, DeadLetterFailed). A claim that takes the row in between waits
// for Settled, so it sees the note: without the wait, a row whose dead-letter move failed
// on its data would be delivered again instead of set aside.
func (p *Poison) Settling(id int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.settling == nil {
		p.settling = map[int64]chan struct{}{}
	}
	p.settling[id] = nil
}

// Settled ends what Settling started, once the settlement's failure was noted.
func (p *Poison) Settled(id int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ch := p.settling[id]; ch != nil {
		close(ch)
	}
	delete(p.settling, id)
}

// poisoned says why a claimed row must be set aside; nil when it must not. A row whose
// earlier settlement here still runs is decided once that settlement was noted, or when
// ctx ends.
func (p *Poison) poisoned(ctx context.Context, r dialects.Row) error {
	if r.Fault != nil {
		return r.Fault
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if ch, ok := p.settling[r.ID]; ok {
		if ch == nil {
			ch = make(chan struct{})
			p.settling[r.ID] = ch
		}
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		p.mu.Lock()
	}
	if s, ok := p.suspects[r.ID]; ok {
		return s.cause
	}
	return nil
}

// ways lists the ways left to set row id aside in form, in order.
func (p *Poison) ways(id int64, form dialects.Form) []Way {
	p.mu.Lock()
	tried := p.suspects[id].tried
	p.mu.Unlock()
	var ws []Way
	add := func(w Way) {
		if !tried[w] {
			ws = append(ws, w)
		}
	}
	if p.DeadLetter {
		add(DeadLettered)
	}
	if p.RetryAfter {
		add(ParkedRetryAfter)
	}
	if form == dialects.FormLease {
		add(ParkedLease)
	} else {
		add(Skipped)
	}
	return ws
}

// done forgets a row set aside (or given up on).
func (p *Poison) done(id int64, way Way) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.suspects, id)
	if way == Skipped {
		if p.skipped == nil {
			p.skipped = map[int64]struct{}{}
		}
		p.skipped[id] = struct{}{}
	}
}

// isSkipped says whether the advisory claimer passes over row id.
func (p *Poison) isSkipped(id int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.skipped[id]
	return ok
}

// skips is how many rows the advisory claimer passes over, by which it widens its scan.
func (p *Poison) skips() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.skipped)
}

// step is the settlement that sets a row aside way (DeadLettered or ParkedRetryAfter).
func (p *Poison) step(way Way, r dialects.Row, cause error, now time.Time) dialects.Step {
	if way == DeadLettered {
		step := dialects.Step{Kind: dialects.StepDeadLetter, Now: now, Attempt: r.Attempt, Error: cause.Error()}
		if p.DeadLetterEvent {
			step.Event = dialects.EventDeadLetter
		}
		return step
	}
	return dialects.Step{Kind: dialects.StepRetryAfter, Now: now, At: dialects.SetAsideUntil}
}

var (
	errLeaseGone = errors.New("the row no longer holds the claim's lease")
	errSuspect   = errors.New("the row's last settlement failed on its data")
	errNoWay     = errors.New("the queue cannot skip rows, the subscription has no dead letter, and the table no retry_after column")
)

// setAside records a row set aside, for Claimed.SetAside.
func (c *claimer) setAside(sa SetAside) { c.aside = append(c.aside, sa) }

// asideLease sets a leased row aside if it must be, and reports whether it was poisoned.
// Every way runs fenced by the claim's token; a row set aside no way keeps its lease until
// it runs out.
func (c *claimer) asideLease(q dialects.LeaseQueue, r dialects.Row) bool {
	p := c.cfg.Poison
	cause := p.poisoned(c.ctx, r)
	if cause == nil {
		return false
	}
	ctx := c.ctx
	held := dialects.Lease{ID: r.ID, Token: r.Token}
	sa := SetAside{Row: r, Cause: cause, Announced: p.announced(r.ID)}
	var errs []error
	for _, way := range p.ways(r.ID, dialects.FormLease) {
		var (
			ok  bool
			err error
		)
		if way == ParkedLease {
			var ids []int64
			ids, err = q.ExtendLeases(ctx, dialects.SetAsideUntil, []dialects.Lease{held})
			ok = len(ids) == 1
		} else {
			ok, err = q.SettleLease(ctx, p.step(way, r, cause, c.cfg.Now()), held)
		}
		if err == nil && !ok {
			errs = append(errs, fmt.Errorf("%s: %w", way, errLeaseGone))
			break // the row is not this claim's any more
		}
		if err == nil {
			sa.Way = way
			break
		}
		errs = append(errs, fmt.Errorf("%s: %w", way, err))
		p.failed(r.ID, cause, way, err)
	}
	sa.Err = errors.Join(errs...)
	p.settled(r.ID, cause, sa.Way)
	c.setAside(sa)
	return true
}

// asideTaken sets an advisory row aside, on the session holding its key, if it must be,
// and reports whether it was poisoned; the key is unlocked either way.
func (c *claimer) asideTaken(s dialects.Session, r dialects.Row) bool {
	p := c.cfg.Poison
	cause := p.poisoned(c.ctx, r)
	if cause == nil {
		return false
	}
	ctx := c.ctx
	sa := SetAside{Row: r, Cause: cause, Announced: p.announced(r.ID)}
	var errs []error
	for _, way := range p.ways(r.ID, dialects.FormAdvisory) {
		if way == Skipped {
			sa.Way = way
			break
		}
		if err := s.Settle(ctx, p.step(way, r, cause, c.cfg.Now()), r.ID); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", way, err))
			p.failed(r.ID, cause, way, err)
			continue
		}
		sa.Way = way
		break
	}
	if _, err := s.Unlock(ctx); err != nil {
		errs = append(errs, fmt.Errorf("unlock: %w", err))
	}
	sa.Err = errors.Join(errs...)
	p.settled(r.ID, cause, sa.Way)
	c.setAside(sa)
	return true
}

// asideLocked sets a row lock claim's row aside if it must be, and reports whether it was
// poisoned. The claim ends either way. A way whose statement fails rolls the claim back:
// the row returns, and its next claim tries the next way.
func (c *claimer) asideLocked(lc dialects.LockedClaim) bool {
	p := c.cfg.Poison
	r := lc.Row()
	cause := p.poisoned(c.ctx, r)
	if cause == nil {
		return false
	}
	ctx := c.ctx
	sa := SetAside{Row: r, Cause: cause, Announced: p.announced(r.ID)}
	ways := p.ways(r.ID, dialects.FormRowLock)
	if len(ways) == 0 {
		ways = []Way{NotSetAside}
	}
	switch way := ways[0]; way {
	case DeadLettered, ParkedRetryAfter:
		if err := lc.Settle(ctx, p.step(way, r, cause, c.cfg.Now())); err != nil {
			sa.Err = fmt.Errorf("%s: %w", way, err)
			p.failed(r.ID, cause, way, err)
			c.setAside(sa)
			return true
		}
		sa.Way = way
	default:
		sq, ok := c.cfg.Queue.(dialects.SkipQueue)
		if ok {
			sq.Skip(r.ID)
			sa.Way = Skipped
		} else {
			sa.Err = errNoWay
		}
		if err := lc.Rollback(ctx); err != nil {
			sa.Err = errors.Join(sa.Err, fmt.Errorf("rollback: %w", err))
		}
	}
	p.done(r.ID, NotSetAside) // the row lock queue itself skips it
	c.setAside(sa)
	return true
}

// asideBatch sets a batch's poisoned rows aside with its commit: the batch handed over
// holds the other rows, and its settlement adds each poisoned row's step. A batch of
// poisoned rows only is settled at once, and none is returned.
func (c *claimer) asideBatch(b dialects.LockedBatch) (dialects.LockedBatch, error) {
	p := c.cfg.Poison
	rows := b.Rows()
	pb := &poisonedBatch{LockedBatch: b, p: p, all: len(rows)}
	now := c.cfg.Now()
	for i, r := range rows {
		cause := p.poisoned(c.ctx, r)
		if cause == nil {
			pb.rows = append(pb.rows, r)
			pb.index = append(pb.index, i)
			continue
		}
		sa := SetAside{Row: r, Cause: cause, Announced: p.announced(r.ID)}
		ways := p.ways(r.ID, dialects.FormRowLock)
		step := dialects.Step{Kind: dialects.StepRelease, Now: now}
		switch {
		case len(ways) > 0 && ways[0] != Skipped:
			sa.Way, step = ways[0], p.step(ways[0], r, cause, now)
		default:
			if sq, ok := c.cfg.Queue.(dialects.SkipQueue); ok {
				sq.Skip(r.ID)
				sa.Way = Skipped
			} else {
				sa.Err = errNoWay
			}
		}
		pb.aside = append(pb.aside, asideStep{index: i, id: r.ID, cause: cause, way: sa.Way, step: step})
		p.done(r.ID, NotSetAside)
		c.setAside(sa)
	}
	if len(pb.aside) == 0 {
		return b, nil
	}
	if len(pb.rows) == 0 {
		if err := pb.Settle(c.ctx, nil); err != nil {
			return nil, fmt.Errorf("claim batch: set aside: %w", err)
		}
		return nil, nil
	}
	return pb, nil
}

// poisonedBatch is a batch claim whose poisoned rows are set aside with its commit.
type poisonedBatch struct {
	dialects.LockedBatch
	p     *Poison
	all   int
	rows  []dialects.Row // the rows handed over
	index []int          // their places in the claim
	aside []asideStep
}

type asideStep struct {
	index int
	id    int64
	cause error
	way   Way
	step  dialects.Step
}

func (b *poisonedBatch) Rows() []dialects.Row { return b.rows }

// Settle settles the rows handed over by steps and the rows set aside by their ways'
// steps, in the claim transaction, in one commit. When it fails on a row's data, the ways
// of the rows set aside count as tried: their next claim tries the next.
func (b *poisonedBatch) Settle(ctx context.Context, steps []dialects.Step) error {
	if len(steps) != len(b.rows) {
		_ = b.LockedBatch.Rollback(ctx)
		return fmt.Errorf("settle batch: %d steps for %d rows", len(steps), len(b.rows))
	}
	full := make([]dialects.Step, b.all)
	for i, at := range b.index {
		full[at] = steps[i]
	}
	for _, a := range b.aside {
		full[a.index] = a.step
	}
	err := b.LockedBatch.Settle(ctx, full)
	if err != nil && b.p.Classify != nil && b.p.Classify(err) == dialects.FaultData {
		for _, a := range b.aside {
			if a.way != Skipped && a.way != NotSetAside {
				b.p.tried(a.id, a.cause, a.way)
			}
		}
	}
	return err
}

// maxSkipScan bounds how many more candidates an advisory claim reads for the rows set
// aside in memory.
const maxSkipScan = 1000
