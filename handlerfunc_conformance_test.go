package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// Func and JSON handlers over every (database, form, transactional), run by
// TestOutcomeConformance: what the function returns settles the row as the Outcome it
// stands for, checked on the table's rows.
func init() { outcomeScenarios = append(outcomeScenarios, funcScenarios...) }

type order struct {
	ID    int    `json:"id"`
	Email string `json:"email"`
}

var funcScenarios = []scenario{
	{name: "a Func handler acks on nil, fails on an error and settles by an Outcome returned as an error", shapes: []tableShape{withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b := h.broker()
			ids := h.publish(b, 3)
			acked, failed, snoozed := ids[0], ids[1], ids[2]
			h.subscribe(b, rowactor.Func(func(ctx context.Context, d *rowactor.Delivery) error {
				h.note(ctx, d, fmt.Sprint("row-", d.ID()))
				switch d.ID() {
				case failed:
					return fmt.Errorf("send: %w", errBoom)
				case snoozed:
					return fmt.Errorf("the mailbox is full: %w", rowactor.Snooze(time.Hour))
				}
				return nil
			}), rowactor.Workers(3), rowactor.RetryPolicy(func(int, error) time.Duration { return time.Hour }))
			before := time.Now()
			for _, s := range h.waitSettled(3) {
				want := map[int64]string{acked: "ack", failed: "retry_after", snoozed: "snooze"}[s.ID]
				if s.Step != want || s.Err != nil {
					t.Fatalf("settlement %+v, want %s", s, want)
				}
				if s.ID == failed && (s.Outcome.String() != "fail" || !errors.Is(s.HandlerErr, errBoom)) {
					t.Fatalf("the failed row's settlement %+v, want a fail carrying the handler's error", s)
				}
			}
			if h.row(acked).exists {
				t.Fatal("the row whose handler returned nil is still in the table")
			}
			st := h.row(failed)
			within(t, st.retryAfter, before.Add(time.Hour), time.Minute)
			if st.attempt != attemptColumn(form, 1, 1) || errText(st) != "send: "+errBoom.Error() {
				t.Fatalf("failed row %+v, error %q", st, errText(st))
			}
			st = h.row(snoozed)
			within(t, st.retryAfter, before.Add(time.Hour), time.Minute)
			if st.attempt != 1 || st.lockedUntil != nil {
				t.Fatalf("snoozed row %+v: the attempt must not be spent", st)
			}
			h.wantKept(map[string]int{fmt.Sprint("row-", acked): 1, fmt.Sprint("row-", failed): 0, fmt.Sprint("row-", snoozed): 0})
		}},
	{name: "Cancel moves the row to its dead letter at once, or drops it without one", shapes: []tableShape{withError, withProcessedAt},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b := h.broker()
			ids := h.publish(b, 1)
			cancelled := errors.New("the customer closed the account")
			h.subscribe(b, rowactor.Func(func(ctx context.Context, d *rowactor.Delivery) error {
				h.note(ctx, d, "cancelled")
				return rowactor.Cancel(cancelled)
			}), rowactor.MaxAttempts(10), rowactor.DeadLetterGroup("dead"))
			s := h.waitSettled(1)[0]
			if s.Step != "dead_letter" || s.Err != nil || s.Outcome.String() != "cancel" || !errors.Is(s.HandlerErr, cancelled) {
				t.Fatalf("settlement %+v, want a dead-letter move on the first attempt", s)
			}
			if st := h.row(ids[0]); st.group != "dead" || errText(st) != cancelled.Error() || st.lockedUntil != nil {
				t.Fatalf("cancelled row %+v, error %q", st, errText(st))
			}

			// Without a dead letter the row is dropped: gone, or kept processed with its
			// reason where the table has processed_at.
			h2 := newHarness(t, h.drv, form, withError, withProcessedAt)
			h2.tx, h2.sideTable = h.tx, h.sideTable
			b2 := h2.broker()
			id := h2.publish(b2, 1)[0]
			h2.subscribe(b2, rowactor.Func(func(context.Context, *rowactor.Delivery) error { return rowactor.Cancel(cancelled) }))
			if s := h2.waitSettled(1)[0]; s.Step != "ack" || s.Outcome.String() != "cancel" || s.Err != nil {
				t.Fatalf("settlement without a dead letter %+v, want the row dropped", s)
			}
			if st := h2.row(id); st.processedAt == nil || errText(st) != cancelled.Error() {
				t.Fatalf("dropped row %+v, error %q: want it processed with its reason", st, errText(st))
			}
			h.wantKept(map[string]int{"cancelled": 0})
		}},
	{name: "a JSON handler gets the typed message, and a payload that does not decode goes to the dead letter at once", shapes: []tableShape{withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b := h.broker()
			ctx := context.Background()
			good, err := rowactor.PublishJSON(ctx, b, h.table, h.queue, order{ID: 7, Email: "a@example.com"})
			if err != nil {
				t.Fatal(err)
			}
			bad, err := b.Publish(ctx, h.table, h.queue, []byte(`{"id": "seven"`))
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan order, 2)
			h.subscribe(b, rowactor.JSON(func(ctx context.Context, d *rowactor.Delivery, o order) error {
				got <- o
				return nil
			}), rowactor.Workers(2), rowactor.MaxAttempts(10), rowactor.DeadLetterGroup("dead"))
			for _, s := range h.waitSettled(2) {
				want := map[int64]string{good: "ack", bad: "dead_letter"}[s.ID]
				if s.Step != want || s.Err != nil {
					t.Fatalf("settlement %+v, want %s", s, want)
				}
			}
			if o := <-got; o != (order{ID: 7, Email: "a@example.com"}) {
				t.Fatalf("the handler got %+v", o)
			}
			if len(got) != 0 {
				t.Fatal("the handler was called for the payload that does not decode")
			}
			st := h.row(bad)
			if st.group != "dead" || !strings.Contains(errText(st), "is not the JSON of a rowactor_test.order") ||
				st.attempt != attemptColumn(form, 1, 0) {
				t.Fatalf("undecodable row %+v, error %q: want it in the dead letter on its first attempt", st, errText(st))
			}
		}},
}

func TestPublishJSONRefusesAValueItCannotEncode(t *testing.T) {
	h := newHarness(t, drivers[0], drivers[0].forms[0])
	b := h.broker()
	_, err := rowactor.PublishJSON(context.Background(), b, h.table, h.queue, map[string]any{"f": func() {}})
	if err == nil || !strings.Contains(err.Error(), "encode a map[string]interface {} as JSON") {
		t.Fatalf("err = %v, want the encoding error named", err)
	}
	if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name); n != 0 {
		t.Fatalf("%d rows published", n)
	}
}
