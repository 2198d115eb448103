package main

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
)

// summary is one system's line for one database and worker count.
type summary struct {
	Suite   string  `json:"suite"`
	DB      string  `json:"db"`
	System  string  `json:"system"`
	Workers int     `json:"workers"`
	Rows    int     `json:"rows"`
	Rounds  int     `json:"rounds"`
	Median  float64 `json:"msgs_per_s_median"`
	Min     float64 `json:"msgs_per_s_min"`
	Max     float64 `json:"msgs_per_s_max"`
	// Handled is the median rate up to the last handler call, settlement of the
	// last messages left out.
	Handled float64  `json:"msgs_per_s_to_last_handler_median"`
	Allocs  float64  `json:"allocs_per_msg"`
	CPU     float64  `json:"cpu_us_per_msg"`
	Stmts   *float64 `json:"statements_per_msg,omitempty"`
}

// ratioLine compares each rowactor form with the peer at one worker count: the median
// over the rounds of (rowactor msgs/s ÷ peer msgs/s), taken within each round, since the
// rounds pair the systems in time. Target is the goal for this line, if any.
type ratioLine struct {
	Suite   string             `json:"suite"`
	DB      string             `json:"db"`
	Workers int                `json:"workers"`
	Peer    string             `json:"peer"`
	Ratios  map[string]float64 `json:"ratios_rowactor_over_peer"`
	Target  *targetResult      `json:"target,omitempty"`
}

type targetResult struct {
	System string  `json:"system"`
	Want   float64 `json:"at_least"`
	Met    bool    `json:"met"`
}

// targets are issue #8's goals: rowactor's lease form at least 5x River on PostgreSQL at
// 8 workers, and at least 2x goqite on SQLite at 1 and 8 workers.
var targets = map[string]map[int]float64{
	"postgres": {8: 5},
	"sqlite":   {1: 2, 8: 2},
}

func report(out *json.Encoder, cfg config, tg *target, workers int, results map[string][]result) error {
	for _, c := range tg.contenders {
		rs := results[c.system]
		rates := mapSlice(rs, result.rate)
		s := summary{
			Suite: "peers", DB: tg.db, System: c.system, Workers: workers, Rows: cfg.rows, Rounds: cfg.rounds,
			Median: roundTo(median(rates), 0), Min: roundTo(slices.Min(rates), 0), Max: roundTo(slices.Max(rates), 0),
			Handled: roundTo(median(mapSlice(rs, result.handledRate)), 0),
			Allocs:  roundTo(median(mapSlice(rs, result.allocsPerMsg)), 1),
			CPU:     roundTo(median(mapSlice(rs, result.cpuPerMsg)), 1),
		}
		if rs[0].stmts >= 0 {
			v := roundTo(median(mapSlice(rs, result.stmtsPerMsg)), 2)
			s.Stmts = &v
		}
		if err := out.Encode(s); err != nil {
			return err
		}
	}
	line := ratioLine{Suite: "peers", DB: tg.db, Workers: workers, Peer: tg.peer, Ratios: map[string]float64{}}
	peer := results[tg.peer]
	for _, c := range tg.contenders {
		if !strings.HasPrefix(c.system, "rowactor") {
			continue
		}
		rs := results[c.system]
		ratios := make([]float64, len(rs))
		for i := range rs {
			ratios[i] = rs[i].rate() / peer[i].rate()
		}
		line.Ratios[c.system] = roundTo(median(ratios), 2)
	}
	if want, ok := targets[tg.db][workers]; ok {
		got := line.Ratios["rowactor-lease"]
		line.Target = &targetResult{System: "rowactor-lease", Want: want, Met: got >= want}
	}
	return out.Encode(line)
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func roundTo(x float64, places int) float64 {
	p := math.Pow10(places)
	return math.Round(x*p) / p
}

func mapSlice[T, U any](xs []T, f func(T) U) []U {
	out := make([]U, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}
