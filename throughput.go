package rowactor

import (
	"sync"
	"time"

	"github.com/rowactor/rowactor/actors"
	"github.com/rowactor/rowactor/dialects"
)

// ThroughputMinutes is how many minutes of settlements a broker keeps counts of.
const ThroughputMinutes = 60

// ThroughputMinute is one minute of a queue's settlements in this broker.
type ThroughputMinute struct {
	// Minute is the minute's start, in the broker's clock.
	Minute time.Time
	// Handled counts the deliveries settled by an outcome without an error, such as an
	// Ack, a Retry or an event of the handler's. Failed counts those whose handler failed
	// or panicked, by Fail, an outcome WithError or a panic, however they were settled.
	// Rows released unsettled, and settlements that did not take effect, are counted in
	// neither.
	Handled, Failed int64
}

// Throughput counts the settlements of queue of table t by this broker's subscriptions,
// per minute, over the last ThroughputMinutes minutes. It returns one entry per minute,
// oldest first, minutes without a settlement included as zeros. A queue this broker never
// settled a row of reads as zeros. It reads counters the broker keeps in memory, a few
// hundred bytes per queue, never the database.
func (b *Broker) Throughput(t Table, queue string) []ThroughputMinute {
	return b.throughput.minutes(throughputKey{t.Name, queue}, b.now())
}

// Subscriptions are the broker's running subscriptions, in the order they started.
func (b *Broker) Subscriptions() []*Subscription {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*Subscription(nil), b.subs...)
}

type throughputKey struct{ table, queue string }

// throughput keeps per-minute settlement counts per queue in a ring of
// ThroughputMinutes slots, each stamped with its minute so a slot left from an hour ago
// reads as empty.
type throughput struct {
	mu    sync.Mutex
	rings map[throughputKey]*[ThroughputMinutes]ThroughputMinute
}

// note counts one settlement at now.
func (c *throughput) note(k throughputKey, r actors.Result, now time.Time) {
	if r.Err != nil || r.Released || r.Step == dialects.StepRelease {
		return
	}
	minute := now.Truncate(time.Minute)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rings == nil {
		c.rings = map[throughputKey]*[ThroughputMinutes]ThroughputMinute{}
	}
	ring := c.rings[k]
	if ring == nil {
		ring = new([ThroughputMinutes]ThroughputMinute)
		c.rings[k] = ring
	}
	slot := &ring[slotOf(minute)]
	if !slot.Minute.Equal(minute) {
		*slot = ThroughputMinute{Minute: minute}
	}
	if r.Outcome.Err != nil || r.Panic != nil {
		slot.Failed++
	} else {
		slot.Handled++
	}
}

// minutes reads the ring of k for the hour up to now.
func (c *throughput) minutes(k throughputKey, now time.Time) []ThroughputMinute {
	last := now.Truncate(time.Minute)
	out := make([]ThroughputMinute, ThroughputMinutes)
	c.mu.Lock()
	defer c.mu.Unlock()
	ring := c.rings[k]
	for i := range out {
		m := last.Add(-time.Duration(ThroughputMinutes-1-i) * time.Minute)
		out[i] = ThroughputMinute{Minute: m}
		if ring != nil && ring[slotOf(m)].Minute.Equal(m) {
			out[i] = ring[slotOf(m)]
		}
	}
	return out
}

func slotOf(minute time.Time) int {
	return int((minute.Unix() / 60) % ThroughputMinutes)
}
