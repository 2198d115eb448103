package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// FIFO groups join the conformance table, in the forms that serve them.
func withFIFO(t *rowactor.Table) { t.FIFO = true }

var fifoForms = []rowactor.Form{rowactor.FormRowLock, rowactor.FormLease}

// fifoRun drains one group with Workers(4) on two brokers (two processes, as far as the
// table can tell), recording the order rows were handled in and the most handled at once.
type fifoRun struct {
	mu    sync.Mutex
	order []int64
	p     peak
}

func (r *fifoRun) handler(outcome func(d *rowactor.Delivery) rowactor.Outcome) rowactor.Handler {
	return func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		r.p.enter()
		defer r.p.leave()
		r.mu.Lock()
		r.order = append(r.order, d.ID())
		r.mu.Unlock()
		time.Sleep(10 * time.Millisecond) // long enough for a second delivery to overlap, were one handed out
		return outcome(d)
	}
}

func (r *fifoRun) handled() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order)
}

func (r *fifoRun) start(h *harness, outcome func(d *rowactor.Delivery) rowactor.Outcome, opts ...rowactor.SubscribeOption) *rowactor.Broker {
	h.t.Helper()
	b1, b2 := h.broker(), h.second()
	opts = append([]rowactor.SubscribeOption{rowactor.Workers(4)}, opts...)
	h.subscribe(b1, r.handler(outcome), opts...)
	h.subscribe(b2, r.handler(outcome), opts...)
	return b1
}

// processedInOrder fails unless every row of ids is processed, in that order by the
// table's processed_at.
func processedInOrder(t *testing.T, h *harness, ids []int64) {
	t.Helper()
	var prev *time.Time
	for _, id := range ids {
		st := h.row(id)
		if !st.exists || st.processedAt == nil || st.lockedUntil != nil {
			t.Fatalf("row %d: %+v, want processed and unleased", id, st)
		}
		if prev != nil && st.processedAt.Before(*prev) {
			t.Fatalf("row %d processed at %v, before the row ahead of it (%v)", id, st.processedAt, prev)
		}
		prev = st.processedAt
	}
}

var fifoScenarios = []scenario{
	{name: "fifo group rows are handled one at a time in id order across two brokers", forms: fifoForms,
		shapes: []tableShape{withFIFO, withProcessedAt},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			var r fifoRun
			b := r.start(h, func(*rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
			ids := h.publish(b, 12)
			for _, s := range h.waitSettled(len(ids)) {
				if s.Err != nil || s.Step != "ack" {
					t.Fatalf("settlement %+v", s)
				}
			}
			h.quiet(200 * time.Millisecond)
			if m := r.p.max.Load(); m != 1 {
				t.Fatalf("%d rows of one FIFO group handled at once, want 1", m)
			}
			if got := r.handled(); !slices.Equal(got, ids) {
				t.Fatalf("handled in order %v, published %v", got, ids)
			}
			processedInOrder(t, h, ids)
			for _, id := range ids {
				if st := h.row(id); st.attempt != attemptColumn(form, 1, 0) {
					t.Fatalf("row %d delivered more than once: %+v", id, st)
				}
			}
		}},
	{name: "fifo group rows are handled one at a time in id order in transactional mode", forms: fifoForms,
		shapes: []tableShape{withFIFO, withProcessedAt},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			var r fifoRun
			b := r.start(h, func(*rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }, rowactor.Transactional())
			ids := h.publish(b, 6)
			for _, s := range h.waitSettled(len(ids)) {
				if s.Err != nil || s.Step != "ack" {
					t.Fatalf("settlement %+v", s)
				}
			}
			if m := r.p.max.Load(); m != 1 {
				t.Fatalf("%d rows of one FIFO group handled at once, want 1", m)
			}
			if got := r.handled(); !slices.Equal(got, ids) {
				t.Fatalf("handled in order %v, published %v", got, ids)
			}
			processedInOrder(t, h, ids)
		}},
	{name: "fifo row that enters ahead of the head in work waits for it", forms: fifoForms,
		shapes: []tableShape{withFIFO, withProcessedAt},
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			var r fifoRun
			started, release := make(chan struct{}), make(chan struct{})
			b := r.start(h, func(d *rowactor.Delivery) rowactor.Outcome {
				if string(d.Payload()) == "a" {
					close(started)
					<-release
				}
				return rowactor.Ack()
			})
			ctx := context.Background()
			// The row ahead takes a lower id than a's and enters the group only once a is in
			// work: published in a transaction begun before a, or, with SQLite's single
			// writer (ids in commit order), moved in from another group (as a requeue does).
			var ahead int64
			var enter func()
			if hasForm(h.drv.forms, rowactor.FormRowLock) {
				tx, commit, rollback := h.drv.begin(t, h.d)
				defer func() { _ = rollback() }()
				id, err := b.PublishTx(ctx, tx, h.table, h.queue, []byte("b"))
				if err != nil {
					t.Fatal(err)
				}
				ahead, enter = id, func() {
					if err := commit(); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				id, err := b.Publish(ctx, h.table, "parked", []byte("b"))
				if err != nil {
					t.Fatal(err)
				}
				ahead, enter = id, func() {
					h.exec(fmt.Sprintf("UPDATE %s SET grp = ? WHERE id = ?", h.table.Name), h.queue, ahead)
				}
			}
			a, err := b.Publish(ctx, h.table, h.queue, []byte("a"))
			if err != nil {
				t.Fatal(err)
			}
			if ahead >= a {
				t.Fatalf("row %d has no lower id than the head %d", ahead, a)
			}
			select {
			case <-started:
			case <-time.After(15 * time.Second):
				t.Fatal("the head was never handled")
			}
			enter()
			time.Sleep(400 * time.Millisecond) // several claims by both brokers
			if got := r.handled(); !slices.Equal(got, []int64{a}) {
				t.Fatalf("handled %v while row %d was in work", got, a)
			}
			if st := h.row(ahead); st.processedAt != nil || st.lockedUntil != nil {
				t.Fatalf("the row ahead was taken while the head was in work: %+v", st)
			}
			close(release)
			h.waitSettled(2)
			if got := r.handled(); !slices.Equal(got, []int64{a, ahead}) {
				t.Fatalf("handled in order %v, want %v", got, []int64{a, ahead})
			}
			processedInOrder(t, h, []int64{a, ahead})
		}},
	{name: "fifo retry after keeps the head ahead of the rows behind it", forms: fifoForms,
		shapes: []tableShape{withFIFO, withProcessedAt},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			var r fifoRun
			b := r.start(h, func(d *rowactor.Delivery) rowactor.Outcome {
				if string(d.Payload()) == "job-0" && d.Attempt() == 1 { // the first row published
					return rowactor.RetryAfter(200 * time.Millisecond)
				}
				return rowactor.Ack()
			})
			ids := h.publish(b, 3)
			for _, s := range h.waitSettled(4) {
				if s.Err != nil {
					t.Fatalf("settlement %+v", s)
				}
			}
			h.quiet(200 * time.Millisecond)
			if got, want := r.handled(), append([]int64{ids[0]}, ids...); !slices.Equal(got, want) {
				t.Fatalf("handled in order %v, want %v", got, want)
			}
			if m := r.p.max.Load(); m != 1 {
				t.Fatalf("%d rows of one FIFO group handled at once, want 1", m)
			}
			processedInOrder(t, h, ids)
			if st := h.row(ids[0]); st.retryAfter == nil || st.attempt != attemptColumn(form, 2, 1) {
				t.Fatalf("the retried head: %+v", st)
			}
			if st := h.row(ids[1]); st.retryAfter != nil || st.attempt != attemptColumn(form, 1, 0) {
				t.Fatalf("a row behind the head: %+v", st)
			}
		}},
	{name: "fifo failing head moves to the dead letter and the group goes on", forms: fifoForms,
		shapes: []tableShape{withFIFO, withProcessedAt},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			var r fifoRun
			b := r.start(h, func(d *rowactor.Delivery) rowactor.Outcome {
				if string(d.Payload()) == "job-0" { // the first row published
					return rowactor.Retry()
				}
				return rowactor.Ack()
			}, rowactor.MaxAttempts(2), rowactor.DeadLetterGroup("dead"))
			ids := h.publish(b, 3)
			settled := h.waitSettled(4)
			// By attempt, not by arrival: the hook's calls for two deliveries of one row
			// may cross (the retry's report can come after the next delivery's).
			slices.SortStableFunc(settled, func(a, b rowactor.Settlement) int { return a.Attempt - b.Attempt })
			steps := map[int64][]string{}
			for _, s := range settled {
				if s.Err != nil {
					t.Fatalf("settlement %+v", s)
				}
				steps[s.ID] = append(steps[s.ID], s.Step)
			}
			h.quiet(200 * time.Millisecond)
			if got := steps[ids[0]]; !slices.Equal(got, []string{"retry", "dead_letter"}) {
				t.Fatalf("the failing head settled %v", got)
			}
			if got, want := r.handled(), []int64{ids[0], ids[0], ids[1], ids[2]}; !slices.Equal(got, want) {
				t.Fatalf("handled in order %v, want %v", got, want)
			}
			if m := r.p.max.Load(); m != 1 {
				t.Fatalf("%d rows of one FIFO group handled at once, want 1", m)
			}
			if st := h.row(ids[0]); !st.exists || st.group != "dead" || st.processedAt != nil || st.lockedUntil != nil ||
				st.attempt != attemptColumn(form, 2, 1) {
				t.Fatalf("the dead-lettered head: %+v", st)
			}
			processedInOrder(t, h, ids[1:])
		}},
	{name: "fifo is refused in the advisory form", forms: []rowactor.Form{rowactor.FormAdvisory}, shapes: []tableShape{withFIFO},
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			b := h.broker()
			_, err := b.Subscribe(context.Background(), h.table, h.queue,
				func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
			var ce *rowactor.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, rowactor.ErrConfig) {
				t.Fatalf("Subscribe: %v, want a *ConfigError", err)
			}
			if ce.Option != "Table.FIFO" || !strings.Contains(ce.Fix, "put the group into the advisory key") {
				t.Fatalf("refusal %v", err)
			}
		}},
}
