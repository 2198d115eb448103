package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// event is one parsed line of a consumer's file.
type event struct {
	consumer int
	kind     byte // 'd' delivery, 'a' ack took effect, 'e' any other settlement
	attempt  int
	ns       int64
	step     string
	released bool
	err      string
}

// How a settlement error of an ack reads (settler.Advisory and friends): the statement's
// error starts "settle ack of row N", the unlock's "unlock key of row N"; errors.Join puts
// one after the other.
func ackStatementFailed(e event) bool { return strings.Contains(e.err, "settle ack of row") }
func ackUnlockFailed(e event) bool    { return strings.Contains(e.err, "unlock key of row") }

// tallyFiles counts every published id from the consumers' files and from what is left
// in the table.
//
// A row that left the table with no "a" line is explained, most specific first, by:
//
//   - misreported: an "e" line for the ack whose only error is the unlock after it. The
//     ack statement ran and committed (autocommit, on the key's session); only the
//     pg_advisory_unlock/RELEASE_LOCK after it failed because the session had been killed,
//     and the server released the key with the session anyway. rowactor nevertheless
//     reports the settlement as failed (Settlement.Err != nil).
//   - commit unknown: an "e" line for the ack whose statement or COMMIT failed because the
//     session was killed while it ran: the server may have committed before the client
//     heard back, and here it had.
//   - SIGKILL: the consumer that had the row was SIGKILLed with the delivery unsettled in
//     its file (after the commit, before the hook wrote its line).
//
// Anything else is lost, as is any row still in the table.
func tallyFiles(fl *fleet, published, left []int64, r *result) {
	events := map[int64][]event{}
	for _, c := range fl.all {
		data, err := os.ReadFile(c.out)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && (c.killed || c.stopped) {
				continue // killed or stopped before it opened its file: it claimed nothing
			}
			r.problem("consumer %d: %v", c.n, err)
			continue
		}
		lines := strings.Split(string(data), "\n")
		if last := lines[len(lines)-1]; last != "" && !c.killed {
			r.problem("consumer %d (not killed) left a truncated last line %q", c.n, last)
		}
		lines = lines[:len(lines)-1] // "" after the final newline, or a line cut by SIGKILL
		for _, line := range lines {
			if line == "" || line[0] == 's' || line[0] == 'x' {
				if line != "" && line[0] == 'x' && (!strings.Contains(line, "drained=true") || !strings.Contains(line, "err=<nil>")) {
					r.ShutdownErrors++
					r.problem("note: consumer %d shutdown: %s", c.n, line)
				}
				continue
			}
			e := event{consumer: c.n, kind: line[0]}
			var id int64
			if _, err := fmt.Sscanf(line[1:], "%d %d %d", &id, &e.attempt, &e.ns); err != nil || (e.kind != 'd' && e.kind != 'a' && e.kind != 'e') {
				r.problem("consumer %d: bad line %q", c.n, line)
				continue
			}
			if e.kind == 'e' {
				// e <id> <attempt> <ns> <step> released=<bool> <error>
				f := strings.SplitN(line, " ", 7)
				if len(f) < 6 {
					r.problem("consumer %d: bad line %q", c.n, line)
					continue
				}
				e.step, e.released = f[4], f[5] == "released=true"
				if len(f) == 7 {
					e.err = f[6]
				}
			}
			events[id] = append(events[id], e)
		}
	}
	killed := map[int]bool{}
	for _, c := range fl.all {
		killed[c.n] = c.killed
	}
	inTable := map[int64]bool{}
	for _, id := range left {
		inTable[id] = true
	}
	isPublished := map[int64]bool{}
	for _, id := range published {
		isPublished[id] = true
	}
	r.LeftInTable = len(left)
	var misreportSample, commitSample string
	for id, evs := range events {
		for _, e := range evs {
			if e.kind != 'e' {
				continue
			}
			r.SettleErrors++
			if strings.Contains(e.err, "lease lost") {
				r.LeaseLost++
			}
			if e.step == "ack" && !ackStatementFailed(e) && ackUnlockFailed(e) {
				r.AckMisreported++
				if misreportSample == "" || inTable[id] {
					misreportSample = fmt.Sprintf("row %d, consumer %d: e %d %d %s", id, e.consumer, id, e.attempt, e.err)
				}
			}
		}
	}
	for _, id := range published {
		evs := events[id]
		var acks, deliveries []int
		for _, e := range evs {
			switch e.kind {
			case 'a':
				acks = append(acks, e.consumer)
			case 'd':
				deliveries = append(deliveries, e.consumer)
			}
		}
		r.Redelivered += max(0, len(deliveries)-1)
		switch {
		case len(acks) > 1:
			r.Duplicates++
			r.Handled++
			r.problem("DUPLICATE: row %d acked %d times, by consumers %v (delivered by %v)", id, len(acks), acks, deliveries)
		case len(acks) == 1:
			r.Handled++
			if inTable[id] {
				r.problem("LOST: row %d acked (consumer %v) but still in the table", id, acks)
			}
		case inTable[id]:
			r.Lost++
			r.problem("LOST: row %d still in the table; delivered %d times, by consumers %v", id, len(deliveries), deliveries)
		default:
			switch why := unrecordedCause(evs, killed); why {
			case "misreported":
				r.UnrecordedMisreported++
			case "commit unknown":
				r.UnrecordedCommitUnknown++
				if commitSample == "" {
					commitSample = fmt.Sprintf("row %d: %s", id, lastAckError(evs))
				}
			case "sigkill":
				r.UnrecordedSIGKILL++
			default:
				r.Lost++
				r.problem("LOST: row %d left the table with no ack recorded and no fault to explain it; delivered by consumers %v", id, deliveries)
			}
		}
	}
	r.Unrecorded = r.UnrecordedMisreported + r.UnrecordedCommitUnknown + r.UnrecordedSIGKILL
	for id, evs := range events {
		if !isPublished[id] {
			r.problem("row %d in consumer %d's file was never published by this run", id, evs[0].consumer)
		}
	}
	for _, id := range left {
		if !isPublished[id] {
			r.problem("row %d in the table was never published by this run", id)
		}
	}
	if r.AckMisreported > 0 {
		r.problem("LIBRARY BUG: %d acks took effect (the row is deleted) but reached WithOnSettled with Err != nil, because only the advisory unlock after them failed (settler/settler.go: Advisory joins the unlock error into the settlement's); e.g. %s",
			r.AckMisreported, misreportSample)
	}
	if commitSample != "" {
		r.problem("note: %d rows were deleted by an ack whose COMMIT the client saw fail (session killed mid-commit); e.g. %s", r.UnrecordedCommitUnknown, commitSample)
	}
}

// unrecordedCause explains a row that left the table with no ack line, or returns "".
// Each delivery ("d") is paired with its consumer's next settlement line for the row (a
// file is in the order its process wrote it). A delivery may have deleted the row if its
// settlement is an ack error or missing (its consumer was SIGKILLed). An ack whose only
// error is the unlock certainly deleted it: its DELETE returned success on a session that
// held the key throughout. Otherwise the candidate with the latest claim (the highest
// attempt; the lease and advisory forms count one per claim, then the latest line) is
// taken.
func unrecordedCause(evs []event, killed map[int]bool) string {
	best, bestAttempt, bestNS := "", -1, int64(-1)
	for i, d := range evs {
		if d.kind != 'd' {
			continue
		}
		var settled *event
		for j := i + 1; j < len(evs); j++ {
			if e := evs[j]; e.consumer == d.consumer && e.kind != 'd' {
				settled = &evs[j]
				break
			}
		}
		cause := ""
		switch {
		case settled == nil && killed[d.consumer]:
			cause = "sigkill"
		case settled == nil || settled.kind != 'e' || settled.step != "ack":
			continue
		case !ackStatementFailed(*settled) && ackUnlockFailed(*settled):
			return "misreported"
		case ackStatementFailed(*settled):
			cause = "commit unknown"
		default:
			continue
		}
		if d.attempt > bestAttempt || (d.attempt == bestAttempt && d.ns > bestNS) {
			best, bestAttempt, bestNS = cause, d.attempt, d.ns
		}
	}
	return best
}

func lastAckError(evs []event) string {
	s := ""
	for _, e := range evs {
		if e.kind == 'e' && e.step == "ack" {
			s = fmt.Sprintf("consumer %d, attempt %d: %s", e.consumer, e.attempt, e.err)
		}
	}
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
