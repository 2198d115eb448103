package actors

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// ProbeFunc tells which of groups have a row a claim could take at now (see
// dialects.DueProber); the answer has len(groups) entries.
type ProbeFunc func(ctx context.Context, groups []string, now time.Time) ([]bool, error)

// IdlePoll polls the idle subscriptions of one table together: one probe statement per
// poll interval for all of them, where each would otherwise run a claim of its own every
// interval. A subscription waits in it from a claim that came back short until the probe
// finds its group due; it is then ticked, as its own poll would, and claims.
//
// Invariant kept: a free worker gets a due row within a poll. A subscription waits here
// from the moment its claim came back short, and every interval the probe asks about
// every waiting subscription, so a row that becomes due is seen by the next probe, at
// most an interval later. The probe may answer "due" when no claim takes a row (a row
// held under another process's row lock): that costs one empty claim, as a poll did. A
// probe that fails ticks every waiting subscription, which then claims as it would have
// without the probe (and meets the failure in its claim's own error handling).
type IdlePoll struct {
	probe    ProbeFunc
	interval time.Duration
	now      func() time.Time
	log      *slog.Logger
	table    string

	mu      sync.Mutex
	waiting map[*Subscription]waiter
	armed   bool // a round is scheduled or running
	// next is when the scheduled round runs (zero while one runs).
	next time.Time
	// hurryUntil: until then rounds come every hurryInterval (Hurry).
	hurryUntil time.Time
	timer      *time.Timer
	closed     bool
	ctx        context.Context
	cancel     context.CancelFunc
	// rounds counts the rounds scheduled or running: Close waits for them, so that no
	// goroutine of the poll outlives it.
	rounds sync.WaitGroup
}

// NewIdlePoll returns the idle poll of table, probing every interval.
func NewIdlePoll(table string, interval time.Duration, now func() time.Time, log *slog.Logger, probe ProbeFunc) *IdlePoll {
	ctx, cancel := context.WithCancel(context.Background())
	return &IdlePoll{probe: probe, interval: interval, now: now, log: log, table: table,
		waiting: map[*Subscription]waiter{}, ctx: ctx, cancel: cancel}
}

// waiter is a waiting subscription's group and its actor (the subscription's own pid
// field is written by Start after the actor runs, so the actor hands in its Self).
type waiter struct {
	group string
	pid   *actor.PID
}

// wait makes s, whose actor is pid, wait for the probe to find group due.
func (p *IdlePoll) wait(s *Subscription, pid *actor.PID, group string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.waiting[s] = waiter{group: group, pid: pid}
	if !p.armed {
		p.armed = true
		p.rounds.Add(1)
		d := p.delay(p.interval)
		p.next = time.Now().Add(d)
		p.timer = time.AfterFunc(d, p.round)
	}
}

// HurryInterval is how often the probe runs while it hurries.
const HurryInterval = 10 * time.Millisecond

// Hurry makes the probe run every HurryInterval for the next window, then at its own
// interval again. A PublishTx calls it: its row becomes visible when the caller
// commits, which no notification tells this process on a database without NOTIFY, and
// a commit soon after is then seen within HurryInterval instead of a poll interval.
// The probe is one statement for every waiting subscription of the table, and it ticks
// none whose group has no due row, so hurrying costs one small query per interval.
func (p *IdlePoll) Hurry(window time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	until := time.Now().Add(window)
	if until.After(p.hurryUntil) {
		p.hurryUntil = until
	}
	soon := time.Now().Add(HurryInterval)
	if p.armed && !p.next.IsZero() && p.next.After(soon) && p.timer.Stop() {
		// The scheduled round comes sooner; its count in rounds carries over.
		p.next = soon
		p.timer.Reset(HurryInterval)
	}
}

// delay is how long to wait before the next round, d when not hurrying. Called under mu.
func (p *IdlePoll) delay(d time.Duration) time.Duration {
	if time.Now().Before(p.hurryUntil) {
		return min(d, HurryInterval)
	}
	return d
}

// leave stops s waiting (it stops).
func (p *IdlePoll) leave(s *Subscription) {
	p.mu.Lock()
	delete(p.waiting, s)
	p.mu.Unlock()
}

// numWaiting is how many subscriptions wait for the probe.
func (p *IdlePoll) numWaiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waiting)
}

// round probes once for every waiting subscription and ticks those whose group is due.
func (p *IdlePoll) round() {
	defer p.rounds.Done()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.next = time.Time{}
	subs := make([]*Subscription, 0, len(p.waiting))
	groups := make([]string, 0, len(p.waiting))
	for s, w := range p.waiting {
		subs = append(subs, s)
		groups = append(groups, w.group)
	}
	p.mu.Unlock()

	start := time.Now()
	ctx, cancel := context.WithTimeout(p.ctx, max(p.interval, time.Second))
	due, err := p.probe(ctx, groups, p.now())
	cancel()
	if err == nil && len(due) != len(groups) {
		err = errProbeAnswer
	}
	if err != nil && p.ctx.Err() == nil {
		p.log.Debug("rowactor: the idle probe failed; its subscriptions claim instead", slog.String("table", p.table),
			slog.Int("subscriptions", len(subs)), slog.Any("error", err))
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	for i, s := range subs {
		if err != nil || due[i] {
			if w, ok := p.waiting[s]; ok {
				delete(p.waiting, s)
				s.sys.Root.Send(w.pid, tickMsg{})
			}
		}
	}
	if len(p.waiting) == 0 || p.closed {
		p.armed = false
		return
	}
	p.rounds.Add(1)
	d := p.delay(max(p.interval-time.Since(start), 0))
	p.next = time.Now().Add(d)
	p.timer = time.AfterFunc(d, p.round)
}

// Close stops probing and waits for a probe in progress; the subscriptions stopped first.
func (p *IdlePoll) Close() {
	p.mu.Lock()
	p.closed = true
	if p.timer != nil && p.timer.Stop() {
		p.rounds.Done() // that round will not run
	}
	p.cancel()
	p.mu.Unlock()
	p.rounds.Wait()
}

var errProbeAnswer = errors.New("rowactor: the idle probe answered for a different number of queues")
