package actors

import (
	"slices"
	"time"
)

// roomSizer sizes the rows a lease-form subscription holds beyond its workers when the
// service did not fix it (Prefetch): enough to keep every worker busy while one claim is
// on its way, and no more. By Little's law the workers finish workers/work rows per unit
// of time, so a claim that takes claim to come back must find that many rows in hand:
//
//	room = ceil(workers × max(claim, roomFloor) / work), at most roomMax
//
// An instant handler (work of microseconds) gets claims of many rows, one statement and
// one commit for all of them; a 100 ms handler gets room for one row, so the subscription
// holds Workers plus one and leaves the rest of a backlog to the other consumers
// (invariant: a consumer does not hoard rows it cannot start within one claim's latency,
// or roomFloor when claims are quicker; prefetch_test.go).
type roomSizer struct {
	// claims are the last claims' round trips; the quickest of them is the claim latency
	// the room covers. Slower claims are those that opened a connection first (tens of
	// milliseconds, seen on PostgreSQL) or queued behind other work: covering them would
	// hold rows against the usual case, and holding too few costs a worker a short wait
	// while holding too many starves other consumers.
	claims [8]time.Duration
	next   int
	// work is a moving average of how long deliveries kept their workers (0 until one
	// did): the handling rate is what it is on average, outliers included. last is the
	// latest delivery's: the room follows the slower of the two, so handlers that turn
	// slow shrink it at their first return rather than after the average caught up.
	work, last time.Duration
	// gen counts the times the queue ran dry: a delivery claimed before the latest says
	// nothing of the rows that come after it (ranDry).
	gen uint64
	// claim is the quickest of claims.
	claim time.Duration
}

// roomFloor is the least claim latency the room covers. A claim on SQLite comes back in
// about 0.1 ms, so a room covering only that made claims of a few rows, each a statement
// and a commit: the runtime then spent more on claims than on handling (#32). Covering
// 2 ms makes claims of tens of rows when handlers take microseconds, and changes nothing
// for handlers of 10 ms or more (a room of one or two rows).
const roomFloor = 2 * time.Millisecond

// roomMax bounds the measured room: a stalled claim (seconds) or a handler that does
// nothing must not make a subscription lease thousands of rows. It is a settlement batch
// and a half (batchMax): claims of about 100 rows when handlers take microseconds.
// Measured on lease drains at 8 workers (alternating runs, 50,000–200,000 rows): 192
// against 128 took SQLite from 59,000–69,000 to 69,000–77,000 msgs/s and MariaDB from
// 16,500 to 19,300; at 256 or 512, or with settlement batches of 256, claims grew so
// large that workers waited for them, and SQLite slowed again.
const roomMax = batchMax + batchMax/2

// claimed records a claim's round trip.
func (r *roomSizer) claimed(took time.Duration) {
	r.claims[r.next%len(r.claims)] = max(took, time.Nanosecond)
	r.next++
	r.claim = slices.Min(r.claims[:min(r.next, len(r.claims))])
}

// freed records how long a delivery kept its worker (0: it did not run to its end, and
// says nothing of the handler's speed); gen is the generation it was started in.
func (r *roomSizer) freed(took time.Duration, gen uint64) {
	if gen != r.gen {
		return
	}
	if took > 0 {
		r.last = took
	}
	switch {
	case took <= 0:
	case r.work <= 0:
		r.work = took
	default:
		r.work += (took - r.work) / 8
	}
}

// ranDry forgets the handling time when a claim found the queue short: the rows that come
// next (after a pause, a quiet spell) may be of another kind, so the room starts again
// from none and is measured on them alone (deliveries started before, still finishing,
// are not counted), rather than sized by handlers that ran long ago (invariant: fast
// rows drained earlier do not make a subscription hoard slow ones).
func (r *roomSizer) ranDry() { r.work, r.last, r.gen = 0, 0, r.gen+1 }

// size is the room for workers workers: none until a claim and a delivery were measured.
func (r *roomSizer) size(workers int) int {
	work := max(r.work, r.last)
	if r.claim <= 0 || work <= 0 {
		return 0
	}
	n := (int64(workers)*int64(max(r.claim, roomFloor)) + int64(work) - 1) / int64(work)
	return int(min(n, roomMax))
}

// covers reports whether rows waiting for a worker keep the workers busy for at least one
// claim's round trip: a claim sent now would come back before they ran out, so it can
// wait for more free room and take more rows in one statement.
func (r *roomSizer) covers(waiting, workers int) bool {
	work := max(r.work, r.last)
	if r.claim <= 0 || work <= 0 || waiting == 0 {
		return false
	}
	return int64(waiting)*int64(work) >= int64(workers)*int64(r.claim)
}
