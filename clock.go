package rowactor

import (
	"context"
	"errors"
	"time"
)

// Clock is the time a broker goes by, given with WithClock. Every time rowactor writes or
// compares in the table comes from Now: due times of RetryAfter, Snooze and After,
// leases, retention's cutoff, periodic runs, and the now of Inspect and job control. The
// database's own clock is never read. Timers, and durations that only measure, such as
// latency and handler time, keep to the machine's time.
//
// A clock that can jump, such as rowactortest.Clock, also has
//
//	Advanced() <-chan struct{}
//
// returning a channel closed at its next jump. The broker's subscriptions then claim at
// once, and its periodic jobs look for runs due at the new time.
type Clock interface {
	Now() time.Time
}

// advancingClock is a Clock that tells its jumps.
type advancingClock interface {
	Clock
	Advanced() <-chan struct{}
}

// WithClock makes the broker go by c instead of time.Now; see Clock. It is meant for
// tests that move time forward past a RetryAfter or to a periodic job's next run. Jump
// while no handler runs, since a jump past a lease's end makes its row claimable at once.
// A nil c, or a nil pointer, makes New fail.
func WithClock(c Clock) Option {
	return func(cfg *brokerConfig) {
		if c == nil || isNilPointer(c) {
			cfg.clockErr = errors.New("rowactor: WithClock needs a clock (e.g. rowactortest.NewClock()); got nil: leave WithClock out to go by the machine's clock")
			return
		}
		cfg.now, cfg.clock, cfg.clockErr = c.Now, c, nil
	}
}

// advanced is a channel closed at the broker's clock's next jump, nil when its clock
// does not jump.
func (b *Broker) advanced() <-chan struct{} {
	if b.clock == nil {
		return nil
	}
	return b.clock.Advanced()
}

// followClock wakes every subscription of the broker at each jump of its clock.
func (b *Broker) followClock(c advancingClock) {
	ctx, cancel := context.WithCancel(context.Background())
	b.stopClock, b.clockDone = cancel, make(chan struct{})
	go func() {
		defer close(b.clockDone)
		for {
			select {
			case <-ctx.Done():
				return
			case <-c.Advanced():
				b.wakeNotified("", "")
			}
		}
	}()
}
