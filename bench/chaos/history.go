package main

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// The history: what every consumer recorded (consumer.go describes the file format),
// parsed and merged by row.

// delivery is one handler run: a "d" line, its "h" line, and the settlement paired with it.
type delivery struct {
	cons    int
	seq     int64
	sub     int
	id      int64
	attempt int
	start   int64
	end     int64 // the handler returned; 0 when there is no "h" line
	outcome string
	herr    string // the handler's own statement error (deadlock fault), "" when none
	settle  *settlement
}

// settlement is one WithOnSettled call ("S" line).
type settlement struct {
	cons     int
	sub      int
	id       int64
	attempt  int
	t        int64
	step     string
	released bool
	class    string // ok, leaselost, closed, error
	err      string
	d        *delivery // the delivery it settled; nil when none matches (a row released before its handler started)
}

func (s *settlement) ok() bool { return s != nil && s.class == "ok" }

// terminal reports a step that ends the row: no later claim can find it.
func terminal(step string) bool { return step == "ack" || step == "drop" || step == "dead_letter" }

// consHist is one consumer's file.
type consHist struct {
	n            int
	ready        int64 // "r": subscribed
	shutdownAt   int64 // "q": Shutdown called
	shutdownKind string
	stuckAtStop  int   // "q" stuck=<n>: stuck handlers in work when Shutdown was called
	xAt          int64 // "x": Shutdown returned
	xLine        string
	last         int64 // the latest time in the file
	deliveries   []*delivery
	settlements  []*settlement
	startRetries int
	pauses       []interval // "p": the process did not run
	truncated    bool
	bad          []string
}

type rowKey struct {
	sub int
	id  int64
}

func (k rowKey) String() string { return fmt.Sprintf("%d/%d", k.sub, k.id) }

// parseConsumer reads consumer n's file. A missing file is an empty history.
func parseConsumer(path string, n int) (*consHist, error) {
	h := &consHist{n: n}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return h, nil
	}
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(data), "\n")
	if last := lines[len(lines)-1]; last != "" {
		h.truncated = true // a line cut by SIGKILL
	}
	lines = lines[:len(lines)-1]
	type pkey struct {
		sub     int
		id      int64
		attempt int
	}
	pending := map[pkey][]*delivery{}
	bySeq := map[int64]*delivery{}
	seen := func(ns int64) {
		if ns > h.last {
			h.last = ns
		}
	}
	for _, line := range lines {
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		bad := func() { h.bad = append(h.bad, line) }
		switch f[0] {
		case "s":
			h.startRetries++
		case "p":
			if len(f) < 3 {
				bad()
				continue
			}
			h.pauses = append(h.pauses, interval{atoi64(f[1]), atoi64(f[2])})
		case "r":
			if len(f) < 2 {
				bad()
				continue
			}
			h.ready = atoi64(f[1])
			seen(h.ready)
		case "q":
			if len(f) < 3 {
				bad()
				continue
			}
			h.shutdownAt, h.shutdownKind = atoi64(f[1]), f[2]
			for _, kv := range f[3:] {
				if v, ok := strings.CutPrefix(kv, "stuck="); ok {
					h.stuckAtStop = atoi(v)
				}
			}
			seen(h.shutdownAt)
		case "x":
			if len(f) < 2 {
				bad()
				continue
			}
			h.xAt, h.xLine = atoi64(f[1]), strings.Join(f[2:], " ")
			seen(h.xAt)
		case "d":
			if len(f) != 6 {
				bad()
				continue
			}
			d := &delivery{cons: n, seq: atoi64(f[1]), sub: atoi(f[2]), id: atoi64(f[3]), attempt: atoi(f[4]), start: atoi64(f[5])}
			h.deliveries = append(h.deliveries, d)
			bySeq[d.seq] = d
			k := pkey{d.sub, d.id, d.attempt}
			pending[k] = append(pending[k], d)
			seen(d.start)
		case "h":
			if len(f) < 4 {
				bad()
				continue
			}
			d := bySeq[atoi64(f[1])]
			if d == nil {
				bad()
				continue
			}
			d.end, d.outcome = atoi64(f[2]), f[3]
			if len(f) > 4 && f[4] != "-" {
				d.herr = strings.Join(f[4:], " ")
			}
			seen(d.end)
		case "S":
			// S <sub> <id> <attempt> <ns> <step> <released> <class> <err...>
			if len(f) < 9 {
				bad()
				continue
			}
			s := &settlement{cons: n, sub: atoi(f[1]), id: atoi64(f[2]), attempt: atoi(f[3]), t: atoi64(f[4]), step: f[5],
				released: f[6] == "true", class: f[7]}
			if f[8] != "-" {
				s.err = strings.Join(f[8:], " ")
			}
			// The oldest unsettled delivery of this row and attempt in this process: a
			// process settles one claim's delivery at a time per attempt.
			k := pkey{s.sub, s.id, s.attempt}
			if q := pending[k]; len(q) > 0 {
				s.d, pending[k] = q[0], q[1:]
				q[0].settle = s
			}
			h.settlements = append(h.settlements, s)
			seen(s.t)
		default:
			bad()
		}
	}
	// A settlement may come before its delivery's "d" line: Shutdown can release a row
	// whose handler goroutine was scheduled but had not written its line yet.
	early := map[pkey][]*settlement{}
	for _, s := range h.settlements {
		if s.d == nil {
			k := pkey{s.sub, s.id, s.attempt}
			early[k] = append(early[k], s)
		}
	}
	for k, q := range pending {
		for _, d := range q {
			if e := early[k]; len(e) > 0 {
				e[0].d, d.settle, early[k] = d, e[0], e[1:]
			}
		}
	}
	return h, nil
}

func atoi(s string) int        { n, _ := strconv.Atoi(s); return n }
func atoi64(s string) int64    { n, _ := strconv.ParseInt(s, 10, 64); return n }
func ms(ns int64) string       { return fmt.Sprintf("%.0fms", float64(ns)/1e6) }
func secs(ns, t0 int64) string { return fmt.Sprintf("%.3fs", float64(ns-t0)/1e9) }

// history is every consumer's file, merged by row.
type history struct {
	cons  map[int]*consHist
	rows  map[rowKey][]*delivery // by start time
	order []rowKey
}

func mergeHistory(cons map[int]*consHist) *history {
	h := &history{cons: cons, rows: map[rowKey][]*delivery{}}
	for _, c := range cons {
		for _, d := range c.deliveries {
			k := rowKey{d.sub, d.id}
			if _, ok := h.rows[k]; !ok {
				h.order = append(h.order, k)
			}
			h.rows[k] = append(h.rows[k], d)
		}
	}
	for _, ds := range h.rows {
		sort.Slice(ds, func(i, j int) bool { return ds[i].start < ds[j].start })
	}
	sort.Slice(h.order, func(i, j int) bool {
		if h.order[i].sub != h.order[j].sub {
			return h.order[i].sub < h.order[j].sub
		}
		return h.order[i].id < h.order[j].id
	})
	return h
}
