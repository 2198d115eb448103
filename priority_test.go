package rowactor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

func withPriority(t *rowactor.Table) { t.Priority = "priority" }

func init() {
	scenarios = append(scenarios,
		scenario{
			name:   "rows of a lower priority number are claimed first: ten urgent rows published behind 1,000 queued ones run next",
			shapes: []tableShape{withPriority},
			run:    priorityScenario,
		},
		scenario{
			name:   "with priorities the claim reads the claim index in order, without a sort",
			forms:  []rowactor.Form{rowactor.FormLease},
			shapes: []tableShape{withPriority, withProcessedAt},
			run:    priorityIndexScenario,
		},
		scenario{
			name: "a publish with a priority into a table without the column is refused before anything is written",
			run: func(t *testing.T, h *harness, _ rowactor.Form) {
				b := h.broker()
				var ce *rowactor.ConfigError
				for _, n := range []int{3, 0} { // 0 too: the caller asked for a priority
					_, err := b.Publish(context.Background(), h.table, h.queue, []byte("x"), rowactor.Priority(n))
					if !errors.As(err, &ce) || ce.Option != "Priority" || !strings.Contains(err.Error(), "Table.Priority") {
						t.Fatalf("Publish with Priority(%d) on a table without the column: %v", n, err)
					}
				}
				if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != 0 {
					t.Fatalf("%d rows written", n)
				}
				// FIFO groups run in id order, which a priority would break.
				fifo := h.table
				fifo.Name, fifo.FIFO, fifo.Priority = fifo.Name+"_fifo", true, "priority"
				if _, err := rowactor.Schema(h.d, fifo); !errors.As(err, &ce) || ce.Option != "Table.Priority" {
					t.Fatalf("Schema of a FIFO table with priorities: %v", err)
				}
			},
		},
	)
}

// priorityScenario: 1,000 rows of priority 5 queued; the worker holds the first (the
// handler waits for the test), and whatever else the subscription took in hand settles in
// (its lease room). One worker: handlers start one after another in the order the claims
// handed the rows out (with two, one handler's goroutine can be descheduled while the
// other runs on, and start order would no longer be claim order). Then ten rows are published with the default priority 0 and the
// handlers let go. Only the rows already in hand may start before the ten: every claim
// after the publish takes the urgent rows first. The urgent rows then read priority 0 in
// the table, the others 5.
func priorityScenario(t *testing.T, h *harness, form rowactor.Form) {
	const low, high, workers = 1000, 10, 1
	for first := 0; first < low; first += 100 {
		vals, args := make([]string, 0, 100), make([]any, 0, 200)
		for range 100 {
			vals = append(vals, "(?, ?, 5)")
			args = append(args, []byte("low"), h.queue)
		}
		h.exec(fmt.Sprintf("INSERT INTO %s (payload, grp, priority) VALUES %s", h.table.Name, strings.Join(vals, ", ")), args...)
	}
	b := h.broker()
	gate := make(chan struct{})
	var mu sync.Mutex
	var order []string // "low" or "high", in start order
	started := make(chan struct{}, low+high)
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		mu.Lock()
		order = append(order, fmt.Sprintf("%s%d", d.Payload(), d.ID()))
		mu.Unlock()
		started <- struct{}{}
		<-gate
		return rowactor.Ack()
	}, rowactor.Workers(workers))
	for range workers {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the workers did not start")
		}
	}
	time.Sleep(500 * time.Millisecond) // the subscription fills what it holds in hand, then waits
	inHand := workers
	if form == rowactor.FormLease {
		inHand = h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE locked_until > ?", h.table.Name), h.drv.timeValue(time.Now()))
	}
	// One transaction, so that no claim sees some of the urgent rows and not the others.
	tx, commit, _ := h.drv.begin(t, h.d)
	for range high {
		if _, err := b.PublishTx(context.Background(), tx, h.table, h.queue, []byte("high")); err != nil {
			t.Fatal(err)
		}
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	close(gate)
	deadline := time.After(30 * time.Second)
	for {
		mu.Lock()
		seen, lowBefore, lastHigh := 0, 0, -1
		for i, p := range order {
			if strings.HasPrefix(p, "high") {
				seen++
				lastHigh = i
			}
		}
		if seen == high {
			for _, p := range order[:lastHigh] {
				if strings.HasPrefix(p, "low") {
					lowBefore++
				}
			}
		}
		mu.Unlock()
		if seen == high {
			if lowBefore > inHand {
				t.Fatalf("%d low rows started before the last urgent one, with %d in hand when they were published: claims did not take the urgent rows first (start order %v)", lowBefore, inHand, order[:lastHigh+1])
			}
			break
		}
		select {
		case <-deadline:
			t.Fatalf("%d of %d urgent rows started in 30 s", seen, high)
		case <-time.After(20 * time.Millisecond):
		}
	}
	// The urgent rows were written with priority 0 (the default) and are acked (deleted).
	for end := time.Now().Add(15 * time.Second); ; {
		n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE priority = 0", h.table.Name))
		if n == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d urgent rows left 15 s after they started", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE priority NOT IN (0, 5)", h.table.Name)); n != 0 {
		t.Fatalf("%d rows of another priority", n)
	}
}

// explainRows runs an EXPLAIN on a database/sql pool and joins its rows' columns as text.
func explainRows(t *testing.T, db *sql.DB, query string, args ...any) string {
	t.Helper()
	rows, err := db.Query(query, args...)
	if err != nil {
		t.Fatalf("%q: %v", query, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		dest := make([]any, len(cols))
		for i := range vals {
			dest[i] = &vals[i]
		}
		if err := rows.Scan(dest...); err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, v := range vals {
			parts = append(parts, v.String)
		}
		lines = append(lines, strings.Join(parts, " | "))
	}
	return strings.Join(lines, "\n")
}

// priorityIndexScenario: with 20,000 rows of mixed priorities (some finished), the claim's
// read (its group, due, unfinished, in priority then id order) follows the index Schema
// renders instead of sorting the group's rows.
func priorityIndexScenario(t *testing.T, h *harness, _ rowactor.Form) {
	for first := 0; first < 20000; first += 500 {
		vals, args := make([]string, 0, 500), make([]any, 0, 1000)
		for i := range 500 {
			vals = append(vals, fmt.Sprintf("(?, ?, %d)", (first+i)%5))
			args = append(args, []byte("x"), []string{h.queue, "other"}[(first+i)%2])
		}
		h.exec(fmt.Sprintf("INSERT INTO %s (payload, grp, priority) VALUES %s", h.table.Name, strings.Join(vals, ", ")), args...)
	}
	h.exec(fmt.Sprintf("UPDATE %s SET processed_at = ? WHERE id %% 3 = 0", h.table.Name), h.drv.timeValue(time.Now()))
	now := h.drv.timeValue(time.Now())
	q := fmt.Sprintf("SELECT id FROM %s WHERE grp = ? AND (retry_after IS NULL OR retry_after <= ?) AND processed_at IS NULL"+
		" AND (locked_until IS NULL OR locked_until <= ?) ORDER BY priority, id LIMIT 8", h.table.Name)
	if sorts, plan := h.drv.sorts(t, h.d, h.table.Name, q, h.queue, now, now); sorts {
		t.Fatalf("the claim's read sorts the group's rows instead of reading the claim index in order:\n%s", plan)
	}
}
