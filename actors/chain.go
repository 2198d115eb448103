package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/rowactor/rowactor/claimer"
	"github.com/rowactor/rowactor/dialects"
)

// A row lock delivery holds its claim transaction, and its connection, until it settles;
// a worker it frees as its handler returns then waits for a claim on another connection:
// BEGIN and the claim, a round trip, after the settlement's statement and COMMIT, another.
// Where the dialect can (dialects.ChainingClaim: PostgreSQL), the settling delivery makes
// that claim itself, in its settlement's round trip on its own connection: one round
// trip a row instead of two, and no claim transaction of its own.
//
// The subscription actor still decides every claim, and counts it as it counts a
// claimer's. A delivery that can chain says so as it frees its worker (chainFreeMsg),
// and waits. The subscription, handling that message, sends the delivery
// the first claim request it makes for a free worker, in place of a claimer, or soloMsg
// when it makes none (a pause, a drain, a stop), when the queue ran short (probing: an
// empty chained claim would cost a ROLLBACK more than settling alone), or when another
// subscription on the pool waits for a connection (BudgetShare.Keeps). The delivery
// settles, claiming in the same round trip if it got a request, and answers the request
// as a claimer would: through the handoff, with a Claimed marked Chained (its sender is
// no claimer to count idle or failed).
//
// So a chaining worker is given back with its settlement, and its next row, as a FIFO
// or transactional delivery's is: a settlement that waits (a trigger, another session's
// lock) keeps its worker waiting, and no other. Its claim does not count against the
// claims in flight (chainsInFlight), so the other workers' claims, one at a time while
// probing, go on meanwhile.
//
// What it must not break:
//   - A row has one end: the claim runs only once the settlement committed (the server
//     skips the rest of a pipeline after a failure), and a row it claims is the
//     subscription's as a claimer's is, vetted for poison and handed off (a stopped
//     subscription releases it).
//   - Every claim request is answered. A delivery that waits for the decision is sent a
//     request or soloMsg in the same handling of its chainFreeMsg. One that got a
//     request answers it whatever its settlement did: when the chained claim did not run
//     (the settlement failed, a Cancel or a release took another way), it claims on a
//     connection of its own, as a claimer would (claimer.Chained).
//   - The budget is never overdrawn, and every subscription on the pool makes progress:
//     the chained claim takes the settling row's connection, not another (the settlement
//     does not give it back, settledMsg connPassed); a row it claims keeps it, and an
//     answer without one gives it back; and no connection passes so while another
//     share waits in the budget's queue.
//   - A free worker gets a due row within a poll: the request is the claim the
//     subscription would have sent a claimer at that moment, for the same worker, and
//     a chained claim held up by its settlement holds up no other claim.

// chainClaim is a settling delivery's claim for its freed worker.
type chainClaim struct {
	// req is the subscription's request; nil while the delivery waits for it.
	req   *claimer.Request
	start time.Time
	// ran says the settlement's pipeline claimed: next is the row (nil: none was due),
	// or err why the claim failed.
	ran  bool
	next dialects.LockedClaim
	err  error
}

// chainFreeMsg is a workerFreeMsg from a delivery that waits to hear whether it claims
// the worker's next row as it settles: a claim request, or soloMsg. A type of its own,
// not a field: a message of one pointer goes into an interface without an allocation.
type chainFreeMsg struct{ d *delivery }

func (chainFreeMsg) IgnoreDeadLetterLogging() {}

// soloMsg tells a delivery that offered to claim for its freed worker that no claim is
// wanted: it settles alone.
type soloMsg struct{}

func (soloMsg) IgnoreDeadLetterLogging() {}

// chains says whether the delivery offers to claim its freed worker's next row as it
// settles: a row lock claim the dialect can chain, outside transactional mode (whose
// claim lends its transaction), FIFO groups and WorkersByKey (which claim one at a time,
// in order), not after a panic, and only in a subscription of several workers.
//
// With one worker, a claim on another connection runs beside the settlement, the claim's
// statement while the settlement's COMMIT waits for its flush to disk: chained, it waits
// for that flush, and the worker's next row comes later (PostgreSQL, instant handler,
// alternating runs: 3,074 against 2,653 rows/s, 2,860 against 2,851). With several,
// the server's CPU is what the rows share, and one round trip a row instead of two
// leaves more of it to them (8 workers: 3,923 against 4,201 rows/s in one run, 4,916
// against 4,036 and 4,650 against 3,822 in two others; 111–146 µs of client CPU a row
// against 146–159).
func (d *delivery) chains() bool {
	cfg := &d.sub.cfg
	if cfg.Form != dialects.FormRowLock || cfg.Transactional || cfg.FIFO || cfg.KeyOf != nil ||
		cfg.BatchHandler != nil || d.panic != nil || !d.sub.severalWorkers.Load() {
		return false
	}
	_, ok := d.claim.Locked.(dialects.ChainingClaim)
	return ok
}

// onClaimRequest takes the subscription's claim for the worker the delivery freed: it
// settles, claiming in the same round trip, and answers.
func (d *delivery) onClaimRequest(c actor.Context, req *claimer.Request) {
	if ch := d.chain; ch != nil && ch.req == nil && !d.settled {
		ch.req, ch.start = req, time.Now()
		d.settleHandled(c)
		return
	}
	// Settled already (a stop came first, and gave the connection back): the request is
	// answered all the same, with no row and no connection.
	m := &claimer.Claimed{Limit: req.Limit, Wakes: req.Wakes, Chained: true}
	if h := d.sub.claimCfg.Handoff; h == nil || h(m) {
		c.Request(c.Parent(), m)
	}
}

// onSolo settles the delivery alone: the subscription made no claim for its worker.
func (d *delivery) onSolo(c actor.Context) {
	if d.chain != nil && d.chain.req == nil && !d.settled {
		d.chain = nil
		d.settleHandled(c)
	}
}

// answerChain answers the subscription's claim request, if the delivery got one: with
// the row its settlement claimed, or a claim of its own when that did not run.
func (d *delivery) answerChain(c actor.Context) {
	ch := d.chain
	if ch == nil || ch.req == nil {
		return
	}
	d.chain = nil
	d.connPassed = true
	cfg := d.sub.claimCfg
	m := claimer.Chained(cfg, ch.req, ch.start, ch.ran, ch.next, ch.err)
	if cfg.Handoff == nil || cfg.Handoff(m) {
		c.Request(c.Parent(), m)
	}
}
