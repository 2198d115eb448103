package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// check is one check's violations in a scenario: how many, and the first few.
type check struct {
	Count    int      `json:"count"`
	Examples []string `json:"examples,omitempty"`
	// NA marks a check that does not apply to the scenario (tx outside the deadlock fault).
	NA bool `json:"na,omitempty"`
}

func (c *check) add(limit int, format string, args ...any) {
	c.Count++
	if len(c.Examples) < limit {
		c.Examples = append(c.Examples, fmt.Sprintf(format, args...))
	}
}

func (c check) String() string {
	if c.NA {
		return "—"
	}
	return fmt.Sprint(c.Count)
}

// analysis is what the checks need beside the history.
type analysis struct {
	t0       int64 // the scenario's start, for printing times
	examples int
	forms    []string // per subscription
	workers  []int    // per subscription
	// connCap > 0 (several subscriptions on one small pool): a consumer's handlers that
	// hold a pool connection (connSub) cannot exceed it.
	connCap   int
	connSub   []bool
	lease     time.Duration
	poll      time.Duration
	slack     time.Duration
	exclude   time.Duration
	published map[rowKey]int64 // when each row's publishing transaction had committed
	kinds     map[rowKey]string
	left      map[rowKey]leftRow // rows in the tables at the end
	queue     string
	deadGroup string // the poison fault's dead-letter group, "" when none
	nodlq     bool   // poison rows retry forever: they stay
	killedAt  map[int]int64
	// sessionKills: when each consumer's sessions were killed.
	sessionKills map[int][]int64
	// windows excluded from check (e): faults and starts, [a, b].
	excluded []interval
	// excludedFor: windows excluded from check (e) for one consumer (its database node
	// was down, and its claimer's reconnect backoff after).
	excludedFor map[int][]interval
	endNS       int64 // when the drain ended and the consumers were told to stop
}

// checkA: a settlement reported successful was made by the row's current holder. A
// delivery's successful settlement is a violation when a later claim of the row had
// started before the settlement could have run: before the settlement's report for a
// step that ends the row (ack, drop, dead letter: after its commit no claim can find the
// row), before the handler returned for any other step (its statement runs after the
// handler, and only its commit lets the row be claimed again). "Later claim": a higher
// attempt (lease and advisory count one per claim; equal attempts by start), a later
// start in the row lock form (where a claim spends no attempt, so handler starts stand in
// for claim order: a later starter whose own claim a fault may have taken, staleByFault,
// may hold the older claim and is not counted).
func checkA(h *history, an *analysis) check {
	var c check
	for _, k := range h.order {
		ds := h.rows[k]
		for _, d := range ds {
			s := d.settle
			if !s.ok() {
				continue
			}
			bound := d.end
			if terminal(s.step) || bound == 0 {
				bound = s.t
			}
			for _, e := range ds {
				if e == d {
					continue
				}
				later := e.attempt > d.attempt || (e.attempt == d.attempt && e.start > d.start)
				if an.forms[k.sub] == "rowlock" {
					later = e.start > d.start
				}
				if later && e.start < bound && an.forms[k.sub] == "rowlock" && staleByFault(h, an, e) {
					// A row lock claim spends no attempt, so handler starts stand in for
					// claim order; E may have been claimed first and lost its lock to a
					// fault before its handler started. Not counted.
					continue
				}
				if later && e.start < bound {
					c.add(an.examples, "row %s: consumer %d attempt %d settled %s ok at %s (handler %s–%s), but consumer %d attempt %d had started at %s",
						k, d.cons, d.attempt, s.step, secs(s.t, an.t0), secs(d.start, an.t0), secs(d.end, an.t0), e.cons, e.attempt, secs(e.start, an.t0))
					break
				}
			}
		}
	}
	return c
}

// checkB: two handler runs of one row overlap only when the earlier one's claim was lost
// by a fault: its settlement reported lease lost (and, in the lease form, the later run
// started at least a lease less the slack after it, so the lease can have run out), or
// its process was SIGKILLed, or its sessions were killed after it started, or Shutdown
// released it; and in every case the earlier one's settlement did not take effect.
func checkB(h *history, an *analysis) check {
	var c check
	for _, k := range h.order {
		ds := h.rows[k]
		for i, d := range ds {
			end := d.end
			if end == 0 {
				switch {
				case an.killedAt[d.cons] > 0:
					end = an.killedAt[d.cons]
				case d.settle != nil:
					end = d.settle.t
				default:
					end = h.cons[d.cons].last
				}
			}
			for _, e := range ds[i+1:] {
				if e.start >= end {
					break
				}
				if why := overlapExcuse(h, an, k, d, e); why != "" {
					c.add(an.examples, "row %s: consumer %d attempt %d ran %s–%s (settled: %s) and consumer %d attempt %d started at %s: %s",
						k, d.cons, d.attempt, secs(d.start, an.t0), secs(end, an.t0), settleText(d.settle), e.cons, e.attempt, secs(e.start, an.t0), why)
				}
			}
		}
	}
	return c
}

// staleByFault reports a delivery whose claim a fault may have taken before or while its
// handler ran: it did not settle successfully, and its process was SIGKILLed, or its
// sessions were killed between its start (less the slack) and its end or settlement, or
// its consumer began Shutdown while it ran.
func staleByFault(h *history, an *analysis, e *delivery) bool {
	if e.settle.ok() {
		return false
	}
	end := e.end
	if e.settle != nil && e.settle.t > end {
		end = e.settle.t
	}
	if end == 0 {
		end = h.cons[e.cons].last
	}
	if an.killedAt[e.cons] > 0 {
		return true
	}
	for _, t := range an.sessionKills[e.cons] {
		if t >= e.start-int64(an.slack) && t <= end {
			return true
		}
	}
	ch := h.cons[e.cons]
	return ch.shutdownAt > 0 && ch.shutdownAt <= end
}

// txEndedText is dialects.ErrTxEnded's text, as a consumer's settlement line carries it.
var txEndedText = dialects.ErrTxEnded.Error()

// overlapExcuse returns "" when the overlap of d by e is explained, else why not.
func overlapExcuse(h *history, an *analysis, k rowKey, d, e *delivery) string {
	s := d.settle
	if an.forms[k.sub] == "rowlock" && staleByFault(h, an, e) {
		// Handler starts stand in for claim order in the row lock form: the later
		// starter may hold the older claim, lost to a fault (see checkA).
		return ""
	}
	if an.forms[k.sub] == "advisory" && e.attempt < d.attempt && staleByFault(h, an, e) {
		// The advisory take counts the attempt, so e's claim came first: its session
		// was killed (releasing the key) before its handler started, d took the row
		// meanwhile, and e's settlement did not take effect.
		return ""
	}
	if s.ok() {
		return "the earlier run's " + s.step + " then took effect"
	}
	if kt := an.killedAt[d.cons]; kt > 0 && (s == nil || kt <= e.start) {
		return ""
	}
	for _, t := range an.sessionKills[d.cons] {
		if t >= d.start-int64(an.slack) && t <= e.start {
			return ""
		}
	}
	ch := h.cons[d.cons]
	if ch.shutdownAt > 0 && ch.shutdownAt <= e.start && (s == nil || s.class == "closed" || s.released) {
		return ""
	}
	if s != nil && s.class == "error" && strings.Contains(s.err, txEndedText) {
		// The database ended the earlier run's transaction (a deadlock): its row lock or
		// its key's transaction went with it, so the row was free; the settlement said
		// so and changed nothing, like a lost lease.
		return ""
	}
	if s != nil && s.class == "leaselost" {
		if an.forms[k.sub] == "lease" && e.start-d.start < int64(an.lease-an.slack) {
			return fmt.Sprintf("lease lost, but the later run started %s after the earlier one, before a lease (%v) could run out", ms(e.start-d.start), an.lease)
		}
		return ""
	}
	if s == nil {
		return "the earlier run was never settled, and no fault explains the overlap"
	}
	return "no lease lost, kill or shutdown explains it"
}

func settleText(s *settlement) string {
	if s == nil {
		return "none"
	}
	if s.class == "ok" {
		return s.step + " ok"
	}
	return s.step + " " + s.class
}

// cTally is check (c) and the counts that go with it.
type cTally struct {
	check
	handled, unrecorded, sigkill, commitUnknown, misreported, redelivered, deliveries int
	deadLettered, poisonDeliveries                                                    int
	leaseLost, settleErrors                                                           int
}

// checkC: every published row settled exactly once (one successful ack, drop or dead
// letter), none lost. A row that left the queue with no successful terminal settlement
// recorded is explained only by a fault that hit its delivery's settlement (see
// unrecordedCause); poison rows without a dead letter must stay in the queue unsettled;
// with one they must end in the dead-letter group.
func checkC(h *history, an *analysis) cTally {
	var t cTally
	for _, c := range h.cons {
		for _, s := range c.settlements {
			if s.class == "leaselost" {
				t.leaseLost++
			}
			if s.class == "error" {
				t.settleErrors++
			}
		}
	}
	keys := make([]rowKey, 0, len(an.published))
	for k := range an.published {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].sub != keys[j].sub {
			return keys[i].sub < keys[j].sub
		}
		return keys[i].id < keys[j].id
	})
	for _, k := range keys {
		ds := h.rows[k]
		t.deliveries += len(ds)
		t.redelivered += max(0, len(ds)-1)
		poison := an.kinds[k] == kindPoison
		if poison {
			t.poisonDeliveries += len(ds)
		}
		var ok []*delivery
		for _, d := range ds {
			if d.settle.ok() && terminal(d.settle.step) {
				ok = append(ok, d)
			}
		}
		l, inTable := an.left[k]
		dead := inTable && an.deadGroup != "" && l.group == an.deadGroup
		queued := inTable && !dead
		if dead {
			t.deadLettered++
		}
		switch {
		case an.kinds[k] == kindKeyPanic:
			// Its key function panics before a worker is chosen: no handler may run it,
			// nothing may settle it, and it stays queued (set aside or released again).
			if len(ds) > 0 || len(ok) > 0 || !queued {
				t.add(an.examples, "row %s, whose key function panics: %d handler runs, %d successful terminal settlements, in the queue %v (want 0, 0, true)", k, len(ds), len(ok), queued)
			}
		case len(ok) > 1:
			var who []string
			for _, d := range ok {
				who = append(who, fmt.Sprintf("consumer %d attempt %d %s at %s", d.cons, d.attempt, d.settle.step, secs(d.settle.t, an.t0)))
			}
			t.add(an.examples, "row %s settled %d times: %s", k, len(ok), strings.Join(who, "; "))
		case poison && an.nodlq:
			if len(ok) == 1 || !queued {
				t.add(an.examples, "poison row %s (no dead letter) left the queue: %d successful terminal settlements, in table %v", k, len(ok), inTable)
			}
		case len(ok) == 1:
			t.handled++
			step := ok[0].settle.step
			switch {
			case queued:
				t.add(an.examples, "row %s: %s reported ok (consumer %d attempt %d) but the row is still in the queue", k, step, ok[0].cons, ok[0].attempt)
			case step == "dead_letter" && !dead:
				t.add(an.examples, "row %s: dead letter reported ok but the row is not in the dead-letter group", k)
			case poison && an.deadGroup != "" && step != "dead_letter":
				t.add(an.examples, "poison row %s ended by %s, not in its dead letter", k, step)
			case !poison && dead:
				t.add(an.examples, "row %s (not poison) is in the dead-letter group", k)
			}
		case queued:
			t.add(an.examples, "LOST: row %s still in the queue at the end; delivered %d times%s", k, len(ds), lastDelivery(ds, an))
		default:
			switch why := unrecordedCause(ds, an.killedAt); why {
			case "misreported":
				t.misreported++
			case "commit unknown":
				t.commitUnknown++
			case "sigkill":
				t.sigkill++
			default:
				t.add(an.examples, "LOST: row %s left the queue with no successful settlement recorded and no fault to explain it; delivered %d times%s", k, len(ds), lastDelivery(ds, an))
				continue
			}
			t.unrecorded++
			if poison && an.deadGroup != "" && !dead {
				t.add(an.examples, "poison row %s left the queue but is not in its dead letter", k)
			}
		}
	}
	return t
}

func lastDelivery(ds []*delivery, an *analysis) string {
	if len(ds) == 0 {
		return ""
	}
	d := ds[len(ds)-1]
	return fmt.Sprintf("; the last by consumer %d attempt %d at %s, settled: %s", d.cons, d.attempt, secs(d.start, an.t0), settleText(d.settle))
}

// ackUnlockOnly reports an ack whose only error is the advisory unlock after it (the ack
// itself committed): settler.Advisory's errors read "settle ack of row N" for the
// statement and "unlock key of row N" for the unlock.
func ackUnlockOnly(s *settlement) bool {
	return !strings.Contains(s.err, "settle "+s.step+" of row") && strings.Contains(s.err, "unlock key of row")
}

// unrecordedCause explains a row that left the queue with no successful terminal
// settlement recorded, or returns "". A delivery may have ended the row if its terminal
// settlement reported an error (the session was killed mid-commit: the server may have
// committed before the client heard back, which MariaDB often does) or if it has no
// settlement and its consumer was SIGKILLed (after the commit, before the hook wrote its
// line). The candidate with the latest claim (highest attempt, then latest start) is taken.
func unrecordedCause(ds []*delivery, killedAt map[int]int64) string {
	best, bestAttempt, bestStart := "", -1, int64(-1)
	for _, d := range ds {
		s := d.settle
		cause := ""
		switch {
		case s == nil && killedAt[d.cons] > 0:
			cause = "sigkill"
		case s == nil || s.class != "error" || !terminal(s.step):
			continue
		case ackUnlockOnly(s):
			return "misreported"
		default:
			cause = "commit unknown"
		}
		if d.attempt > bestAttempt || (d.attempt == bestAttempt && d.start > bestStart) {
			best, bestAttempt, bestStart = cause, d.attempt, d.start
		}
	}
	return best
}

// ---- check (e): idle workers

// eStats goes with check (e): rows that waited through an idle interval for poll + slack
// or more, and the idle intervals' total length.
type eStats struct {
	rows int
	idle int64
}

type interval struct{ a, b int64 }

// freeIntervals turns busy intervals into the maximal intervals of [from, to] where fewer
// than capacity of them overlap.
func freeIntervals(busy []interval, capacity int, from, to int64) []interval {
	type ev struct {
		t int64
		d int
	}
	evs := make([]ev, 0, 2*len(busy))
	for _, b := range busy {
		evs = append(evs, ev{b.a, +1}, ev{b.b, -1})
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].t != evs[j].t {
			return evs[i].t < evs[j].t
		}
		return evs[i].d < evs[j].d // ends first
	})
	var out []interval
	n, at := 0, from
	emit := func(a, b int64) {
		a, b = max(a, from), min(b, to)
		if b > a {
			out = append(out, interval{a, b})
		}
	}
	for _, e := range evs {
		was := n < capacity
		n += e.d
		is := n < capacity
		switch {
		case was && !is:
			emit(at, e.t)
		case !was && is:
			at = e.t
		}
	}
	if n < capacity {
		emit(at, to)
	}
	return out
}

// intersect returns the intersection of two sorted lists of disjoint intervals.
func intersect(x, y []interval) []interval {
	var out []interval
	for i, j := 0, 0; i < len(x) && j < len(y); {
		a, b := max(x[i].a, y[j].a), min(x[i].b, y[j].b)
		if b > a {
			out = append(out, interval{a, b})
		}
		if x[i].b < y[j].b {
			i++
		} else {
			j++
		}
	}
	return out
}

// subtract removes the (possibly overlapping, unsorted) intervals cut from x.
func subtract(x []interval, cut []interval) []interval {
	cut = append([]interval(nil), cut...)
	sort.Slice(cut, func(i, j int) bool { return cut[i].a < cut[j].a })
	out := x
	for _, c := range cut {
		var next []interval
		for _, v := range out {
			if c.b <= v.a || c.a >= v.b {
				next = append(next, v)
				continue
			}
			if c.a > v.a {
				next = append(next, interval{v.a, c.a})
			}
			if c.b < v.b {
				next = append(next, interval{c.b, v.b})
			}
		}
		out = next
	}
	return out
}

// checkE: no worker idles longer than a poll interval (plus the slack) while rows are
// due.
//
// A row is due from its publishing commit, or from the report of a settlement that
// returned it to the queue (a successful retry or release); after any other end (a lost
// lease, an error, a kill) its due time is unknown and it is left out until its next
// start. It waits from its due time until its next handler start (rows still queued at the
// end: until the drain ended); only waits longer than poll + slack count.
//
// Workers are not visible in the history, so each consumer's subscription is replayed as
// Workers slots: a handler takes a slot at its start and frees it when its settlement was
// reported (else at its end), and each start takes the slot that has been free the
// longest. That is the attribution most favourable to the consumer: a slot that still
// stayed free for poll + slack without a break, while some row of the subscription
// waited, outside the excluded windows (and, in the shared-pool fault, while the
// consumer's connection-holding handlers were fewer than the pool less one), is an idle
// worker that no claim latency explains. Excluded: until the consumer's ready line plus
// the exclusion; from its Shutdown or kill on; while its process did not run (its "p"
// lines, plus poll + slack); around every kill and shutdown fault. Each consumer's idle
// pieces are merged: one violation per idle interval.
func checkE(h *history, an *analysis) (c check, st eStats) {
	thresh := int64(an.poll + an.slack)
	nsubs := len(an.workers)

	// When some row of each subscription waited, and each row's waits.
	type wait struct {
		row       rowKey
		due, upto int64
	}
	waits := make([][]wait, nsubs)
	keys := make([]rowKey, 0, len(an.published))
	for k := range an.published {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].sub != keys[j].sub {
			return keys[i].sub < keys[j].sub
		}
		return keys[i].id < keys[j].id
	})
	for _, k := range keys {
		if k.sub >= nsubs || an.kinds[k] == kindKeyPanic {
			continue // a row whose key function panics is never work a worker could take
		}
		due := an.published[k]
		for _, d := range h.rows[k] {
			if due > 0 && d.start > due {
				waits[k.sub] = append(waits[k.sub], wait{k, due, d.start})
			}
			due = 0
			if s := d.settle; s.ok() && (s.step == "retry" || s.step == "release") {
				due = s.t
			}
		}
		if l, ok := an.left[k]; ok && due > 0 && due < an.endNS && (an.deadGroup == "" || l.group != an.deadGroup) {
			waits[k.sub] = append(waits[k.sub], wait{k, due, an.endNS})
		}
	}
	waiting := make([][]interval, nsubs)
	for sub, ws := range waits {
		sort.Slice(ws, func(i, j int) bool { return ws[i].due < ws[j].due })
		var u []interval
		for _, w := range ws {
			if w.upto-w.due < thresh {
				continue // only a row that waited longer than poll + slack counts
			}
			if n := len(u); n > 0 && w.due <= u[n-1].b {
				u[n-1].b = max(u[n-1].b, w.upto)
				continue
			}
			u = append(u, interval{w.due, w.upto})
		}
		waiting[sub] = u
	}

	type piece struct {
		interval
		sub int
	}
	pieces := map[int][]piece{}
	for n, ch := range h.cons {
		if ch.ready == 0 {
			continue
		}
		from := ch.ready + int64(an.exclude)
		to := an.endNS
		for _, t := range []int64{ch.shutdownAt, an.killedAt[n]} {
			if t > 0 && t < to {
				to = t
			}
		}
		if to <= from {
			continue
		}
		var stalls []interval
		for _, p := range ch.pauses {
			stalls = append(stalls, interval{p.a, p.b + thresh})
		}
		eligible := subtract(subtract(subtract([]interval{{from, to}}, an.excluded), an.excludedFor[n]), stalls)
		type ev struct {
			t     int64
			start bool
		}
		evs := make([][]ev, nsubs)
		var conns []interval
		for _, d := range ch.deliveries {
			if d.sub >= nsubs {
				continue
			}
			end := d.end
			if d.settle != nil && d.settle.t > end {
				end = d.settle.t
			}
			if end == 0 {
				end = to
			}
			evs[d.sub] = append(evs[d.sub], ev{d.start, true}, ev{end, false})
			if an.connCap > 0 && an.connSub[d.sub] {
				conns = append(conns, interval{d.start, end})
			}
		}
		var connFree []interval
		if an.connCap > 0 {
			connFree = freeIntervals(conns, an.connCap, from, to)
		}
		for sub := range nsubs {
			es := evs[sub]
			sort.Slice(es, func(i, j int) bool {
				if es[i].t != es[j].t {
					return es[i].t < es[j].t
				}
				return !es[i].start // a slot freed at t can be taken at t
			})
			freeSince := make([]int64, an.workers[sub]) // FIFO of free slots
			for i := range freeSince {
				freeSince[i] = ch.ready
			}
			var gaps []interval
			for _, e := range es {
				if e.start {
					if len(freeSince) == 0 {
						continue // more in work than Workers: not ours to judge here
					}
					gaps = append(gaps, interval{freeSince[0], e.t})
					freeSince = freeSince[1:]
				} else {
					freeSince = append(freeSince, e.t)
				}
			}
			for _, f := range freeSince {
				gaps = append(gaps, interval{f, to})
			}
			for _, g := range gaps {
				if g.b-g.a < thresh {
					continue
				}
				idle := intersect(intersect([]interval{g}, eligible), waiting[sub])
				if an.connCap > 0 && an.connSub[sub] {
					idle = intersect(idle, connFree)
				}
				for _, x := range idle {
					if x.b-x.a >= thresh {
						pieces[n] = append(pieces[n], piece{x, sub})
					}
				}
			}
		}
	}

	consumers := make([]int, 0, len(pieces))
	for n := range pieces {
		consumers = append(consumers, n)
	}
	sort.Ints(consumers)
	var all []interval
	for _, n := range consumers {
		ps := pieces[n]
		sort.Slice(ps, func(i, j int) bool { return ps[i].a < ps[j].a })
		for i := 0; i < len(ps); {
			cur, sub := ps[i].interval, ps[i].sub
			for i++; i < len(ps) && ps[i].a <= cur.b; i++ {
				cur.b = max(cur.b, ps[i].b)
			}
			all = append(all, cur)
			st.idle += cur.b - cur.a
			example := ""
			for _, w := range waits[sub] {
				if w.due <= cur.a && w.upto >= cur.b {
					example = fmt.Sprintf("; e.g. row %s due at %s waited %s", w.row, secs(w.due, an.t0), ms(w.upto-w.due))
					break
				}
			}
			c.add(an.examples, "consumer %d had a worker free %s–%s (%s) while rows of subscription %d were due%s",
				n, secs(cur.a, an.t0), secs(cur.b, an.t0), ms(cur.b-cur.a), sub, example)
		}
	}
	// Rows that waited through an idle interval of at least poll + slack.
	sort.Slice(all, func(i, j int) bool { return all[i].a < all[j].a })
	merged := mergeAll(all)
	for _, ws := range waits {
		for _, w := range ws {
			for _, x := range intersect([]interval{{w.due, w.upto}}, merged) {
				if x.b-x.a >= thresh {
					st.rows++
					break
				}
			}
		}
	}
	return c, st
}

// mergeAll merges sorted, possibly overlapping intervals.
func mergeAll(xs []interval) []interval {
	var out []interval
	for _, x := range xs {
		if n := len(out); n > 0 && x.a <= out[n-1].b {
			out[n-1].b = max(out[n-1].b, x.b)
			continue
		}
		out = append(out, x)
	}
	return out
}
