package main

import (
	"strings"
	"testing"
)

// TestNodeKillExplainsRedeliveries: the nodekill check accepts a row handled twice only
// when its earlier run was in work on the killed node, or was settled with a reported
// failure while the cluster was not whole; a silent redelivery, a redelivery after a
// successful settlement, or a failure outside the outage is a violation.
func TestNodeKillExplainsRedeliveries(t *testing.T) {
	const s = int64(1e9) // one second in the history's nanoseconds
	nk := &nodeKill{node: 1, at: 10 * s, evicted: 14 * s, back: 30 * s, consumers: []int{2}}
	run := func(cons int, start, end int64, class string) *delivery {
		d := &delivery{cons: cons, sub: 0, attempt: 1, start: start, end: end, outcome: "ack"}
		if class != "" {
			d.settle = &settlement{cons: cons, t: end, step: "ack", class: class, d: d}
		}
		return d
	}
	last := func(cons int, start int64) *delivery { return run(cons, start, start+s/10, "ok") }
	cases := []struct {
		name  string
		first *delivery
		want  string // "" when explained, else a part of the violation
	}{
		{"in work on the killed node", run(2, 9*s, 0, ""), ""},
		{"lease lost in the stall", run(3, 9*s, 13*s, "leaselost"), ""},
		// CI, 2026-12-05: a claim that waited in the stall came back with its lease spent;
		// its run started after the eviction and lost its lease.
		{"lease lost by a run started after the eviction", run(3, 15*s, 17*s, "leaselost"), ""},
		{"settlement error during the outage", run(3, 20*s, 21*s, "error"), ""},
		{"acked, then handled again", run(3, 15*s, 16*s, "ok"), "settlement: ack ok"},
		{"never settled", run(3, 15*s, 16*s, ""), "settlement: none"},
		{"lease lost after the node was back", run(3, 31*s, 33*s, "leaselost"), "settlement: ack leaselost"},
		{"lease lost before the kill", run(3, 2*s, 5*s, "leaselost"), "settlement: ack leaselost"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := rowKey{0, 1}
			// A row of the dead node's consumer, in work at the kill, keeps the check's
			// "the fault met a delivery" condition true in every case.
			inWork := rowKey{0, 2}
			h := &history{rows: map[rowKey][]*delivery{
				k:      {tc.first, last(1, 40*s)},
				inWork: {run(2, 9*s, 0, ""), last(1, 40*s)},
			}, order: []rowKey{k, inWork}}
			var r result
			c := checkNodeKill(h, nk, &r, 10)
			got := strings.Join(c.Examples, "; ")
			if tc.want == "" && c.Count != 0 {
				t.Fatalf("violations %q, want none", got)
			}
			if tc.want != "" && (c.Count == 0 || !strings.Contains(got, tc.want)) {
				t.Fatalf("violations %q, want one saying %q", got, tc.want)
			}
		})
	}
}
