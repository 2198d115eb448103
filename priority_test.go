package rowactor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
)

func withPriority(t *rowactor.Table) { t.Priority = "priority" }

var priorityScenarios = []scenario{
	{
		name:   "rows of a lower priority number are claimed first: ten urgent rows published behind 1,000 queued ones run next",
		shapes: []tableShape{withPriority},
		run:    priorityScenario,
	},
	{
		name:   "with priorities the claim reads the claim index in order, without a sort",
		forms:  []rowactor.Form{rowactor.FormLease},
		shapes: []tableShape{withPriority, withProcessedAt},
		run:    priorityIndexScenario,
	},
	{
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
	receiveN(t, started, workers, 10*time.Second, "a handler's start")
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

// nullablePriorityTable creates h's table as Schema renders it, but with a nullable
// priority column, as a hand-written table (or one the column was added to) may have it.
func nullablePriorityTable(t *testing.T, h *harness) {
	t.Helper()
	switch h.drv.name {
	case "postgres":
		h.exec(fmt.Sprintf("ALTER TABLE %s ALTER COLUMN priority DROP NOT NULL", h.table.Name))
	case "mysql":
		h.exec(fmt.Sprintf("ALTER TABLE %s MODIFY priority INT NULL DEFAULT 0", h.table.Name))
	case "sqlite":
		// No ALTER COLUMN: make the table again.
		h.exec("DROP TABLE " + h.table.Name)
		ddl, err := rowactor.Schema(h.d, h.table)
		if err != nil {
			t.Fatal(err)
		}
		ddl = strings.Replace(ddl, "INTEGER NOT NULL DEFAULT 0", "INTEGER", 1)
		for _, stmt := range strings.Split(ddl, ";\n") {
			if strings.TrimSpace(stmt) != "" {
				h.exec(stmt)
			}
		}
	default:
		t.Fatalf("no nullable priority DDL for %s", h.drv.name)
	}
}

// TestPriorityNullRowIsDeliveredInEveryForm: a row whose priority is NULL (a hand-written
// table's nullable column, a row another program inserted) is a row like any other: every
// form on every database delivers it, never sets it aside as unreadable or dead-letters it.
func TestPriorityNullRowIsDeliveredInEveryForm(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			t.Run(fmt.Sprintf("%s/%s", drv.name, form), func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, drv, form, withPriority)
				nullablePriorityTable(t, h)
				// ids 1..4 in insert order
				for _, p := range []string{"5", "NULL", "0", "-3"} {
					h.exec(fmt.Sprintf("INSERT INTO %s (payload, grp, priority) VALUES (?, ?, %s)", h.table.Name, p), []byte("p"+p), h.queue)
				}
				b := h.broker()
				var mu sync.Mutex
				var order []string
				h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
					mu.Lock()
					order = append(order, string(d.Payload()))
					mu.Unlock()
					return rowactor.Ack()
				}, append([]rowactor.SubscribeOption{rowactor.Workers(1), rowactor.MaxAttempts(3), rowactor.DeadLetterGroup("dead")}, leaseOptions(form, 5*time.Second)...)...)
				got := h.waitSettled(4)
				for _, s := range got {
					if s.Err != nil || s.Step != "ack" {
						t.Errorf("settlement %+v", s)
					}
				}
				mu.Lock()
				defer mu.Unlock()
				t.Logf("order %v", order)
				if len(order) != 4 {
					t.Fatalf("handled %v, want the four rows\nlogs:\n%s", order, h.logs.String())
				}
				// The rows with a priority keep their order around the NULL one, which sorts
				// as the database sorts NULLs (PostgreSQL last, MySQL and SQLite first).
				var ranked []string
				for _, p := range order {
					if p != "pNULL" {
						ranked = append(ranked, p)
					}
				}
				if want := "[p-3 p0 p5]"; fmt.Sprint(ranked) != want {
					t.Errorf("claim order %v, want %s around the NULL row", order, want)
				}
			})
		}
	}
}

// TestPriorityOutOfRangeIsRefused: a priority the column cannot hold is an error, never a
// different priority stored in its place; one it can hold is stored as given.
func TestPriorityOutOfRangeIsRefused(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease, withPriority)
			b := h.broker()
			for _, p := range []int{math.MaxInt32, math.MinInt32, math.MaxInt32 + 1, math.MinInt32 - 1, math.MaxInt64, math.MinInt64} {
				id, err := b.Publish(context.Background(), h.table, h.queue, []byte("x"), rowactor.Priority(p))
				if err != nil {
					// The refusal names the column, its range and the fix, before
					// anything is written.
					if !strings.Contains(err.Error(), "does not fit the priority column") || !strings.Contains(err.Error(), "widen the column") {
						t.Errorf("Priority(%d): %v; want the column's range and the fix", p, err)
					}
					continue
				}
				if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE id = ? AND priority = ?", h.table.Name), id, p); n != 1 {
					t.Errorf("Priority(%d) returned no error, and row %d does not hold that priority", p, id)
				}
			}
			if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE priority IN (?, ?)", h.table.Name), math.MaxInt32, math.MinInt32); n != 2 {
				t.Errorf("%d rows hold the int32 bounds, want 2 (both fit every database's column)", n)
			}
		})
	}
}

// TestPriorityOutOfRangeRefusedOnANonStrictMySQLSession: on a MySQL session without
// strict mode the server stores an out-of-range value clamped, with a warning: the publish
// must still not report success for a priority it did not store.
func TestPriorityOutOfRangeRefusedOnANonStrictMySQLSession(t *testing.T) {
	t.Parallel()
	drv := driverNamed(t, "mysql")
	h := newHarness(t, drv, rowactor.FormLease, withPriority)
	d, err := mysql.Open(context.Background(), mysqlDSN()+"&sql_mode=%27NO_ENGINE_SUBSTITUTION%27")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	b := h.brokerOn(d)
	p := math.MaxInt32 + 10
	id, err := b.Publish(context.Background(), h.table, h.queue, []byte("x"), rowactor.Priority(p))
	if err != nil {
		t.Logf("Priority(%d): %v", p, err)
		return
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE id = ? AND priority = ?", h.table.Name), id, p); n != 1 {
		t.Fatalf("Priority(%d) returned no error, and row %d does not hold that priority", p, id)
	}
}
