package rowactor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/rowactortest"
)

// Review 18: adversarial tests of dead_at and the retention of dead-letter groups.

var review18DeadAtScenarios = []scenario{
	{
		name:   "review18: a dead-letter move into a group writes dead_at from the broker's clock",
		shapes: []tableShape{withDeadAt, withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			review18DeadAt(t, h, form, false, false)
		},
	},
	{
		name:   "review18: a dead-letter move into a table writes dead_at from the broker's clock",
		shapes: []tableShape{withDeadAt, withError, withoutGroup},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			review18DeadAt(t, h, form, true, false)
		},
	},
	{
		name:   "review18: a FIFO group's dead-letter move writes dead_at from the broker's clock",
		forms:  []rowactor.Form{rowactor.FormRowLock, rowactor.FormLease},
		shapes: []tableShape{withDeadAt, withError, func(t *rowactor.Table) { t.FIFO = true }},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			review18DeadAt(t, h, form, false, false)
		},
	},
	{
		name:   "review18: a batch's dead-letter move writes dead_at from the broker's clock",
		forms:  rowLockOnly,
		shapes: []tableShape{withDeadAt, withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			if h.tx {
				t.Skip("batch handlers are never transactional")
			}
			review18DeadAt(t, h, form, false, true)
		},
	},
}

func TestReview18DeadAt(t *testing.T) { runModeMatrix(t, review18DeadAtScenarios) }

// review18DeadAt: a broker whose clock runs three hours ahead moves two rows to its dead
// letter (a Retry at MaxAttempts(1)); each dead row's dead_at is the clock's time, not
// the machine's (nor the database's).
func review18DeadAt(t *testing.T, h *harness, form rowactor.Form, toTable, batch bool) {
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

var review18RetainScenarios = []scenario{
	{
		name:   "review18: retention of a dead-letter group leaves a row a subscription of the group holds, in every form",
		shapes: []tableShape{withDeadAt},
		run:    review18RetainInWorkScenario,
	},
}

func TestReview18Retain(t *testing.T) {
	for _, drv := range drivers {
		for _, form := range drv.forms {
			for _, sc := range review18RetainScenarios {
				t.Run(fmt.Sprintf("%s/%s/%s", drv.name, form, sc.name), func(t *testing.T) {
					t.Parallel()
					sc.run(t, newHarness(t, drv, form, sc.shapes...), form)
				})
			}
		}
	}
}

// review18RetainInWorkScenario: a subscription consumes the dead-letter group (an
// operator's tool looking at each dead letter) and holds an old dead row in work; the
// group's retention must not delete that row under its handler.
func review18RetainInWorkScenario(t *testing.T, h *harness, form rowactor.Form) {
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
