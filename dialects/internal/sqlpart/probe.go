package sqlpart

import (
	"fmt"

	"github.com/rowactor/rowactor/dialects"
)

// ProbeChunk is how many groups one DueQueues statement asks about: n rounded up to a
// power of two, at most ProbeMax, so that a dialect prepares a handful of statement
// texts however many subscriptions a table has. The dialect pads a chunk by repeating
// its last group.
func ProbeChunk(n int) int {
	c := 1
	for c < n && c < ProbeMax {
		c *= 2
	}
	return c
}

// ReadDue reads a probe of n queues: entry i is true when a row named i. A table without
// groups asked one question (the first entry), whose answer goes in every entry.
func ReadDue(rows dialects.Rows, t dialects.Table, n int) ([]bool, error) {
	due := make([]bool, n)
	for rows.Next() {
		var i int
		if err := rows.Scan(&i); err != nil {
			return nil, err
		}
		if i >= 0 && i < n {
			due[i] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if t.Group == "" && n > 0 {
		for i := range due {
			due[i] = due[0]
		}
	}
	return due, nil
}

// ProbeMax is the most groups one DueQueues statement asks about.
const ProbeMax = 64

// ProbeGroups calls probe for each chunk of groups (ProbeChunk, padded by repeating the
// chunk's last group) and gathers the answers in groups' order.
func ProbeGroups(groups []string, probe func(chunk []string) ([]bool, error)) ([]bool, error) {
	due := make([]bool, 0, len(groups))
	for len(groups) > 0 {
		n := min(len(groups), ProbeMax)
		chunk := make([]string, ProbeChunk(n))
		copy(chunk, groups[:n])
		for i := n; i < len(chunk); i++ {
			chunk[i] = groups[n-1]
		}
		got, err := probe(chunk)
		if err != nil {
			return nil, err
		}
		if len(got) != len(chunk) {
			return nil, fmt.Errorf("rowactor: a due probe answered %d of %d queues", len(got), len(chunk))
		}
		due = append(due, got[:n]...)
		groups = groups[n:]
	}
	return due, nil
}
