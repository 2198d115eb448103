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
	"github.com/rowactor/rowactor/rowactortest"
)

func withDeadAt(t *rowactor.Table) { t.DeadAt = "dead_at" }

var retainDeadScenarios = []scenario{
	{
		name:   "retention of a dead-letter group deletes the rows that died before keep, by the dead_at a real move wrote and a requeue cleared",
		shapes: []tableShape{withDeadAt, withProcessedAt},
		run:    deadLetterRetentionScenario,
	},
	{
		name:   "retention of a dead-letter group reads the index Schema renders in order, and the claim still reads its own",
		forms:  []rowactor.Form{rowactor.FormLease},
		shapes: []tableShape{withDeadAt},
		run:    deadLetterIndexScenario,
	},
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

var deadAtFromClockScenarios = []scenario{
	{
		name:   "a dead-letter move into a group writes dead_at from the broker's clock",
		shapes: []tableShape{withDeadAt, withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			deadAtFromClock(t, h, form, false, false)
		},
	},
	{
		name:   "a dead-letter move into a table writes dead_at from the broker's clock",
		shapes: []tableShape{withDeadAt, withError, withoutGroup},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			deadAtFromClock(t, h, form, true, false)
		},
	},
	{
		name:   "a FIFO group's dead-letter move writes dead_at from the broker's clock",
		forms:  []rowactor.Form{rowactor.FormRowLock, rowactor.FormLease},
		shapes: []tableShape{withDeadAt, withError, func(t *rowactor.Table) { t.FIFO = true }},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			deadAtFromClock(t, h, form, false, false)
		},
	},
	{
		name:   "a batch's dead-letter move writes dead_at from the broker's clock",
		forms:  rowLockOnly,
		shapes: []tableShape{withDeadAt, withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			if h.tx {
				t.Skip("batch handlers are never transactional")
			}
			deadAtFromClock(t, h, form, false, true)
		},
	},
}

// TestDeadLetterMoveWritesDeadAtFromTheBrokersClock proves every dead-letter move (to a
// group or a table, FIFO or batch) stamps dead_at with the broker's clock.
func TestDeadLetterMoveWritesDeadAtFromTheBrokersClock(t *testing.T) {
	t.Parallel()
	runModeMatrix(t, deadAtFromClockScenarios)
}

// deadAtFromClock: a broker whose clock runs three hours ahead moves two rows to its dead
// letter (a Retry at MaxAttempts(1)); each dead row's dead_at is the clock's time, not
// the machine's (nor the database's).
func deadAtFromClock(t *testing.T, h *harness, form rowactor.Form, toTable, batch bool) {
	clock := rowactortest.NewClock()
	clock.Advance(3 * time.Hour)
	b := h.broker(rowactor.WithClock(clock))
	dead := h.table
	opts := []rowactor.SubscribeOption{rowactor.MaxAttempts(1)}
	if toTable {
		dead.Name = h.table.Name + "_dead"
		h.createTable(dead)
		opts = append(opts, rowactor.DeadLetterTable(dead.Name))
	} else {
		opts = append(opts, rowactor.DeadLetterGroup("dead"))
	}
	opts = append(opts, leaseOptions(form, time.Minute)...)
	start := clock.Now()
	ids := h.publish(b, 2)
	if batch {
		h.subscribeBatch(b, 2, func(_ context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
			out := make([]rowactor.Outcome, len(ds))
			for i := range out {
				out[i] = rowactor.Retry()
			}
			return out
		}, opts...)
	} else {
		h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Retry() }, opts...)
	}
	for _, s := range h.waitSettled(2) {
		if s.Step != "dead_letter" || s.Err != nil {
			t.Fatalf("settlement %+v, want a dead letter\nlogs:\n%s", s, h.logs.String())
		}
	}
	end := clock.Now()
	for _, id := range ids {
		n := h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE id = ? AND dead_at >= ? AND dead_at <= ?", dead.Name),
			id, h.drv.timeValue(start.Add(-time.Second)), h.drv.timeValue(end.Add(time.Second)))
		if n != 1 {
			null := h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE id = ? AND dead_at IS NULL", dead.Name), id)
			t.Fatalf("row %d moved to the dead letter %s: dead_at not within the clock's [%v, %v] (NULL: %v)", id, dead.Name, start, end, null == 1)
		}
	}
}

var deadLetterRetentionInWorkScenarios = []scenario{
	{
		name:   "retention of a dead-letter group leaves a row a subscription of the group holds, in every form",
		shapes: []tableShape{withDeadAt},
		run:    deadLetterRetentionInWorkScenario,
	},
}

// TestDeadLetterRetentionLeavesARowItsGroupHoldsInWork proves a dead-letter group's retention
// never deletes a dead row that a subscription of that group holds in work.
func TestDeadLetterRetentionLeavesARowItsGroupHoldsInWork(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			for _, sc := range deadLetterRetentionInWorkScenarios {
				t.Run(fmt.Sprintf("%s/%s/%s", drv.name, form, sc.name), func(t *testing.T) {
					t.Parallel()
					sc.run(t, newHarness(t, drv, form, sc.shapes...), form)
				})
			}
		}
	}
}

// deadLetterRetentionInWorkScenario: a subscription consumes the dead-letter group (an
// operator's tool looking at each dead letter) and holds an old dead row in work; the
// group's retention must not delete that row under its handler.
func deadLetterRetentionInWorkScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	h.queue = "dead"
	id := h.publish(b, 1)[0]
	h.exec(fmt.Sprintf("UPDATE %s SET dead_at = ? WHERE id = ?", h.table.Name), h.drv.timeValue(time.Now().Add(-2*time.Hour)), id)
	started, release := make(chan struct{}, 1), make(chan struct{})
	defer close(release)
	sub := h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return rowactor.Retry()
	}, leaseOptions(form, time.Minute)...)
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatalf("the dead row was not delivered\nlogs:\n%s", h.logs.String())
	}
	// Another old dead row, which nobody holds, goes.
	if err := sub.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	free := h.publish(b, 1)[0]
	h.exec(fmt.Sprintf("UPDATE %s SET dead_at = ? WHERE id = ?", h.table.Name), h.drv.timeValue(time.Now().Add(-2*time.Hour)), free)
	r, err := b.RetainDeadLetters(ctx, h.table, "dead", time.Hour, rowactor.RetainEvery(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the free old dead row to go", func() bool { return !h.row(free).exists })
	time.Sleep(300 * time.Millisecond) // a few more rounds
	if !h.row(id).exists {
		t.Fatalf("the retention deleted row %d while a subscription of its group held it in work (%d deleted)", id, r.Deleted())
	}
}
