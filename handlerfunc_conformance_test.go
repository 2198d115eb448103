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

// Func and JSON handlers over every (database, form, transactional), run by
// TestOutcomeConformance: what the function returns settles the row as the Outcome it
// stands for, checked on the table's rows.
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
	{name: "Cancel ends the row as Broker.Cancel does, and DeadLetter moves it to its dead letter at once", shapes: []tableShape{withError, withProcessedAt},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b := h.broker()
			ids := h.publish(b, 3)
			byOutcome, byBroker, dead := ids[0], ids[1], ids[2]
			const reason = "the customer closed the account"
			h.subscribe(b, cancelHandler(h, byOutcome, byBroker, reason), rowactor.MaxAttempts(10), rowactor.DeadLetterGroup("dead"))
			got := map[int64]rowactor.Settlement{}
			for _, s := range h.waitSettled(3) {
				got[s.ID] = s
			}
			for _, id := range []int64{byOutcome, byBroker} {
				if s := got[id]; s.Step != "ack" || s.Err != nil || s.Outcome.String() != "cancel" {
					t.Fatalf("row %d: settlement %+v, want a cancel ending it (ack)", id, s)
				}
				st := h.row(id)
				if st.group != h.row(byOutcome).group || st.group == "dead" || st.processedAt == nil || st.lockedUntil != nil ||
					errText(st) != dialects.CancelledPrefix+reason {
					t.Fatalf("cancelled row %d %+v, error %q: want it processed, its reason after %q, in no dead letter", id, st, errText(st), dialects.CancelledPrefix)
				}
				if j, err := b.Inspect(context.Background(), h.table, id); err != nil || j.State != rowactor.JobCancelled {
					t.Fatalf("Inspect(%d): %v, %v; want cancelled", id, j.State, err)
				}
			}
			if s := got[dead]; s.Step != "dead_letter" || s.Outcome.String() != "dead_letter" || s.Err != nil || !errors.Is(s.HandlerErr, errUndecodable) {
				t.Fatalf("settlement %+v, want a dead-letter move on the first attempt", s)
			}
			if st := h.row(dead); st.group != "dead" || errText(st) != errUndecodable.Error() || st.processedAt != nil || st.lockedUntil != nil {
				t.Fatalf("dead-lettered row %+v, error %q", st, errText(st))
			}
			checkCancelledStats(t, h)
			h.wantKept(map[string]int{"cancelled": 0})
		}},
	{name: "without processed_at, Cancel deletes the row as Broker.Cancel does; without a dead letter, DeadLetter drops it", shapes: []tableShape{withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b := h.broker()
			ids := h.publish(b, 3)
			const reason = "not wanted"
			h.subscribe(b, cancelHandler(h, ids[0], ids[1], reason))
			for _, s := range h.waitSettled(3) {
				if s.Step != "ack" || s.Err != nil {
					t.Fatalf("settlement %+v, want the row ended (ack)", s)
				}
			}
			for _, id := range ids {
				if st := h.row(id); st.exists {
					t.Fatalf("row %d %+v still exists", id, st)
				}
			}
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
	t.Parallel()
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

var errUndecodable = errors.New("the payload does not decode")

// cancelHandler cancels row byOutcome with the outcome Cancel, row byBroker with
// Broker.Cancel from its own handler, and sends any other row to its dead letter.
func cancelHandler(h *harness, byOutcome, byBroker int64, reason string) rowactor.Handler {
	return rowactor.Func(func(ctx context.Context, d *rowactor.Delivery) error {
		h.note(ctx, d, "cancelled")
		switch d.ID() {
		case byOutcome:
			return rowactor.Cancel(errors.New(reason))
		case byBroker:
			if err := d.Broker().Cancel(ctx, h.table, d.ID(), reason); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			<-ctx.Done()
			return nil // the row ends as cancelled whatever the handler returns
		}
		return rowactor.DeadLetter(errUndecodable)
	})
}

// checkCancelledStats checks that Stats counts the two cancelled rows apart from the
// processed ones, and leaves their reason out of the most frequent errors.
func checkCancelledStats(t *testing.T, h *harness) {
	t.Helper()
	stats, err := h.d.(dialects.Admin).Stats(context.Background(), h.table, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var cancelled, processed int64
	for _, g := range stats {
		cancelled, processed = cancelled+g.Cancelled, processed+g.Processed
		for _, e := range g.Errors {
			if strings.HasPrefix(e.Error, dialects.CancelledPrefix) {
				t.Errorf("Stats lists a cancellation's reason among the errors of group %q: %+v", g.Group, g.Errors)
			}
		}
	}
	if cancelled != 2 || processed != 0 {
		t.Errorf("Stats counts %d cancelled, %d processed; want 2, 0: %+v", cancelled, processed, stats)
	}
}
