package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

func withDeadAt(t *rowactor.Table) { t.DeadAt = "dead_at" }

func init() {
	scenarios = append(scenarios,
		scenario{
			name:   "retention of a dead-letter group deletes the rows that died before keep, by the dead_at a real move wrote and a requeue cleared",
			shapes: []tableShape{withDeadAt, withProcessedAt},
			run:    deadLetterRetentionScenario,
		},
		scenario{
			name:   "retention of a dead-letter group reads the index Schema renders in order, and the claim still reads its own",
			forms:  []rowactor.Form{rowactor.FormLease},
			shapes: []tableShape{withDeadAt},
			run:    deadLetterIndexScenario,
		})
}

func deadLetterRetentionScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	// A real dead-letter move: a handler on another broker fails past MaxAttempts.
	worker := h.second()
	h.subscribe(worker, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Retry() },
		rowactor.MaxAttempts(1), rowactor.DeadLetterGroup("dead"))
	start := time.Now()
	died := h.publish(worker, 2)
	for _, s := range h.waitSettled(2) {
		if s.Step != "dead_letter" || s.Err != nil {
			t.Fatalf("settlement %+v, want a dead letter", s)
		}
	}
	end := time.Now()
	if _, err := worker.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	diedBetween := func(id int64, from, to time.Time) bool {
		return h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE id = ? AND grp = 'dead' AND dead_at >= ? AND dead_at <= ?", h.table.Name),
			id, h.drv.timeValue(from), h.drv.timeValue(to)) == 1
	}
	for _, id := range died {
		if !diedBetween(id, start.Add(-time.Second), end.Add(time.Second)) {
			t.Fatalf("the move of row %d into the dead-letter group did not write its time of death", id)
		}
	}
	// A requeue clears it: the row is live again.
	requeued := died[1]
	if n, err := h.d.(dialects.Admin).Requeue(ctx, dialects.RequeueSpec{Table: h.table, FromGroup: "dead", ToGroup: h.queue,
		IDs: []int64{requeued}}, nil); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	if h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE id = ? AND grp = ? AND dead_at IS NULL", h.table.Name), requeued, h.queue) != 1 {
		t.Fatal("the requeued row kept its time of death")
	}

	b := h.broker()
	deadRow := func(at time.Time) int64 {
		id, err := b.Publish(ctx, h.table, "dead", []byte("dead"))
		if err != nil {
			t.Fatal(err)
		}
		if !at.IsZero() {
			h.exec(fmt.Sprintf("UPDATE %s SET dead_at = ? WHERE id = ?", h.table.Name), h.drv.timeValue(at), id)
		}
		return id
	}
	long := time.Now().Add(-2 * time.Hour)
	h.exec(fmt.Sprintf("UPDATE %s SET dead_at = ? WHERE id = ?", h.table.Name), h.drv.timeValue(long), died[0])
	old := []int64{died[0], deadRow(long), deadRow(long), deadRow(long)}
	kept := map[string][]int64{
		"died since keep": {deadRow(time.Now())},
		"dead_at NULL":    {deadRow(time.Time{})},
		"queued":          append(h.publish(b, 2), requeued),
	}
	opts := []rowactor.RetainOption{rowactor.RetainEvery(50 * time.Millisecond), rowactor.RetainBatch(2)}
	r, err := b.RetainDeadLetters(ctx, h.table, "dead", time.Hour, opts...)
	if err != nil {
		t.Fatal(err)
	}
	// The table's finished rows are retained apart, under a lock of their own.
	finished, err := b.Retain(ctx, h.table, time.Hour, opts...)
	if err != nil {
		t.Fatalf("Retain beside RetainDeadLetters: %v", err)
	}
	waitUntil(t, "the old dead letters to go and be counted", func() bool {
		for _, id := range old {
			if h.row(id).exists {
				return false
			}
		}
		return r.Deleted() >= int64(len(old))
	})
	if r.Deleted() != int64(len(old)) || finished.Deleted() != 0 {
		t.Fatalf("deleted %d dead letters and %d finished rows, want %d and 0", r.Deleted(), finished.Deleted(), len(old))
	}
	for what, ids := range kept {
		for _, id := range ids {
			if !h.row(id).exists {
				t.Fatalf("row %d (%s) was deleted", id, what)
			}
		}
	}

	var ce *rowactor.ConfigError
	refused := func(what, option string, err error) {
		t.Helper()
		if !errors.As(err, &ce) || ce.Option != option || ce.Fix == "" {
			t.Fatalf("%s: %v, want a *ConfigError naming %s and its fix", what, err, option)
		}
	}
	_, err = b.RetainDeadLetters(ctx, h.table, "dead", 2*time.Hour)
	refused("a second retention of the group on one broker", "RetainDeadLetters", err)
	noDeadAt, noGroup := h.table, h.table
	noDeadAt.DeadAt, noGroup.Group = "", ""
	_, err = b.RetainDeadLetters(ctx, noDeadAt, "dead", time.Hour)
	refused("a table without dead_at", "Table.DeadAt", err)
	_, err = b.RetainDeadLetters(ctx, noGroup, "dead", time.Hour)
	refused("a table without a group", "Table.Group", err)
	_, err = b.RetainDeadLetters(ctx, h.table, "", time.Hour)
	refused("no group", "RetainDeadLetters", err)
	_, err = b.RetainDeadLetters(ctx, h.table, "dead", 0)
	refused("keep 0", "RetainDeadLetters", err)
	other, err := b.RetainDeadLetters(ctx, h.table, "dead2", time.Hour)
	if err != nil {
		t.Fatalf("a retention of another group of the table: %v", err)
	}
	other.Stop()

	r.Stop()
	if r.Leading() {
		t.Fatal("a stopped retention still leads")
	}
	if _, err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.RetainDeadLetters(ctx, h.table, "dead", time.Hour); !errors.Is(err, rowactor.ErrClosed) {
		t.Fatalf("RetainDeadLetters after Shutdown: %v", err)
	}
}

// deadLetterIndexScenario: with 20,000 rows, most of them live, a batch of a dead-letter
// group's retention (its group, died before the cutoff, not leased past it, oldest deaths
// first) follows the (group, dead_at) index Schema renders instead of sorting; and the
// claim's read still follows the claim index.
func deadLetterIndexScenario(t *testing.T, h *harness, _ rowactor.Form) {
	base := time.Now().Add(-48 * time.Hour)
	for first := 0; first < 20000; first += 500 {
		vals, args := make([]string, 0, 500), make([]any, 0, 1000)
		for i := range 500 {
			n := first + i
			if n%10 == 0 {
				vals = append(vals, "(?, ?, ?)")
				args = append(args, []byte("x"), []string{"dead", "dead2"}[n%20/10], h.drv.timeValue(base.Add(time.Duration(n)*time.Second)))
				continue
			}
			vals = append(vals, "(?, ?, NULL)")
			args = append(args, []byte("x"), h.queue)
		}
		h.exec(fmt.Sprintf("INSERT INTO %s (payload, grp, dead_at) VALUES %s", h.table.Name, strings.Join(vals, ", ")), args...)
	}
	cutoff := h.drv.timeValue(time.Now().Add(-time.Hour))
	q := fmt.Sprintf("SELECT id FROM %s WHERE grp = ? AND dead_at < ? AND (locked_until IS NULL OR locked_until < ?) ORDER BY dead_at LIMIT 8",
		h.table.Name)
	if sorts, plan := h.drv.sorts(t, h.d, h.table.Name, q, "dead", cutoff, cutoff); sorts {
		t.Fatalf("a retention batch sorts the group's dead rows instead of reading the dead-letter index in order:\n%s", plan)
	}
	now := h.drv.timeValue(time.Now())
	claim := fmt.Sprintf("SELECT id FROM %s WHERE grp = ? AND (retry_after IS NULL OR retry_after <= ?)"+
		" AND (locked_until IS NULL OR locked_until <= ?) ORDER BY id LIMIT 8", h.table.Name)
	if sorts, plan := h.drv.sorts(t, h.d, h.table.Name, claim, h.queue, now, now); sorts {
		t.Fatalf("the claim's read sorts the group's rows instead of reading the claim index in order:\n%s", plan)
	}
}
