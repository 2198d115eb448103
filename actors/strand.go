package actors

import (
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// A subscription claims rows into its measured room (room.go) on the promise that a
// worker takes them within about one claim's round trip. When every worker then takes a
// row that runs long (a slow kind of row among fast ones, a downstream that stalls), the
// rows waiting behind them are stranded: leased to this process, their leases renewed,
// where no other consumer can take them, for as long as the slow handlers run.
//
// So when no worker has freed for strandAfter while rows waited, the rows that waited
// that long go back (released, their attempt returned, as Pause gives them back), and the
// room stays empty until a worker frees: the subscription claims nothing ahead meanwhile,
// and another consumer with a free worker finds the rows at its next claim or poll
// (invariant: a consumer does not hoard rows it cannot start; prefetch_test.go, "rows
// waiting behind workers that all got stuck…"). Workers that keep freeing, however slowly,
// keep their rows: the room shrinks at their first slow return, and the rows claimed
// ahead are handled here. A worker that frees claims again as usual.
//
// A given-back row is out of the backlog and in no book until its release commits, and
// still held: a Cancel that finds it so looks again (givingBack, Claiming). Shutdown's
// report does not count it released: the broker was running when it went back.
//
// Only the measured room strands rows: Prefetch(n) holds its n rows as the service asked,
// and with WorkersByKey rows also wait for their key, not only for a worker.

// strandFloor is the least wait that gives rows back: a garbage collection or a loaded
// machine can hold a fast drain's workers for tens of milliseconds (a hundred and more
// under the race detector on two cores), and giving rows back then only costs statements.
const strandFloor = 250 * time.Millisecond

type strandMsg struct{}

func (strandMsg) IgnoreDeadLetterLogging() {}

// strandsRows reports whether the subscription's waiting rows can be stranded.
func (a *subscriptionActor) strandsRows() bool {
	cfg := &a.s.cfg
	return cfg.AutoPrefetch && cfg.KeyOf == nil && cfg.BatchHandler == nil
}

// strandAfter is how long a row waits for a worker before it is given back: a poll
// interval (the wait another consumer's free worker has for a due row anyway), and at
// least twice the measured handling time, so that workers freeing at their usual pace
// never strand a row.
func (a *subscriptionActor) strandAfter() time.Duration {
	return max(a.s.cfg.Poll, 2*max(a.room.work, a.room.last), strandFloor)
}

// armStrand sets the strand timer, if rows wait and none is set: it looks strandAfter
// from now whether a worker freed meanwhile.
func (a *subscriptionActor) armStrand(c actor.Context) {
	if len(a.backlog) == 0 || a.strandTimer != nil || !a.strandsRows() || a.draining != nil || a.paused || a.stopped.Load() {
		return
	}
	a.strandFreed = a.freed
	sys, self := c.ActorSystem(), c.Self()
	a.strandTimer = time.AfterFunc(a.strandAfter(), func() {
		if !a.stopped.Load() {
			sys.Root.Send(self, strandMsg{})
		}
	})
}

// onStrand gives back the rows that waited strandAfter for a worker when no worker freed
// since the timer was set, and sets the timer again while rows wait.
func (a *subscriptionActor) onStrand(c actor.Context) {
	a.strandTimer = nil
	if a.draining != nil || a.paused || a.stopped.Load() {
		return // the drain or the pause gave the backlog back
	}
	after := a.strandAfter()
	now := time.Now()
	n := 0
	for a.freed == a.strandFreed && n < len(a.backlog) && now.Sub(a.backlog[n].since) >= after {
		n++
	}
	if n > 0 {
		given := 0
		for _, w := range a.backlog[:n] {
			if a.expiredWhileWaiting(c, w) {
				continue // dropped: its lease ran out, the row is due again
			}
			a.s.givingBack.Add(1) // before the row leaves the backlog, where a Cancel looks
			a.spawnDelivery(c, &delivery{sub: a.s, claim: w.claim, releaseOnly: true, handBack: true})
			given++
		}
		clear(a.backlog[:n])
		a.backlog = a.backlog[n:]
		a.stranded = true
		a.s.cfg.Log.Debug("rowactor: rows waiting for a worker were given back: every worker stayed busy",
			slog.String("table", a.s.cfg.Table), slog.String("queue", a.s.cfg.QueueName),
			slog.Int("rows", given), slog.Duration("waited", after), slog.Int("workers", a.workers))
	}
	a.armStrand(c)
}
