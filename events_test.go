package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// The events of the service's own join the conformance table: each runs over every
// (database, form) it applies to.

// transactionalEventScenarios run with Transactional() over every (database, form).
var transactionalEventScenarios = []scenario{
	{name: "a custom event commits the handler's writes with it", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		s := h.side()
		b := h.broker()
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			h.write(ctx, d, s, fmt.Sprint("parked-", d.ID()))
			return rowactor.Event("park")
		}, rowactor.Transactional(), rowactor.OnEvent("park", "UPDATE "+h.table.Name+" SET grp = 'parked' WHERE id = {id}"))
		id := h.publish(b, 1)[0]
		if st := h.waitSettled(1)[0]; st.Err != nil || st.Event != "park" {
			t.Fatalf("settlement %+v", st)
		}
		if st := h.row(id); st.group != "parked" || h.sideRows(s, fmt.Sprint("parked-", id)) != 1 {
			t.Fatalf("after the custom event: row %+v, handler writes %d; want parked and 1", st, h.sideRows(s, fmt.Sprint("parked-", id)))
		}
	}},
	{name: "an own retry rolls the handler's writes back and records the error", shapes: []tableShape{withProcessedAt}, run: func(t *testing.T, h *harness, form rowactor.Form) {
		h.exec("ALTER TABLE " + h.table.Name + " ADD COLUMN last_error VARCHAR(200)")
		s := h.side()
		b := h.broker()
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			h.write(ctx, d, s, fmt.Sprint("attempt-", d.Attempt()))
			if d.Attempt() == 1 {
				return rowactor.Retry().WithError(errors.New("first try failed"))
			}
			return rowactor.Ack()
		}, rowactor.Transactional(), rowactor.OnEvent("retry", ownRetry(h, form)))
		id := h.publish(b, 1)[0]
		got := h.waitDeliveries(2)
		if got[0].Err != nil || got[0].Event != "retry" || got[1].Err != nil || got[1].Step != "ack" {
			t.Fatalf("settlements %+v", got)
		}
		if h.sideRows(s, "attempt-1") != 0 || h.sideRows(s, "attempt-2") != 1 || !h.lastErrorIs(id, "first try failed") {
			t.Fatalf("writes kept: attempt 1 %d, attempt 2 %d (want 0, 1); error recorded %v", h.sideRows(s, "attempt-1"), h.sideRows(s, "attempt-2"), h.lastErrorIs(id, "first try failed"))
		}
		if st := h.row(id); st.processedAt == nil || st.attempt != attemptColumn(form, 2, 1) {
			t.Fatalf("row %+v", st)
		}
	}},
	{name: "a lost lease rolls back the handler's writes and the own ack", forms: []rowactor.Form{rowactor.FormLease}, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		s := h.side()
		b := h.broker()
		other := time.Now().Add(time.Hour).Truncate(time.Second)
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			// Another claim takes the row before the handler writes (SQLite: the handler's
			// write transaction would keep the other claim out).
			h.exec(fmt.Sprintf("UPDATE %s SET locked_until = ? WHERE id = ?", h.table.Name), h.drv.timeValue(other), d.ID())
			h.write(ctx, d, s, "late")
			return rowactor.Ack()
		}, rowactor.Transactional(), rowactor.OnEvent("ack", "UPDATE "+h.table.Name+" SET grp = 'sent' WHERE id = {id}"))
		id := h.publish(b, 1)[0]
		if st := h.waitSettled(1)[0]; !errors.Is(st.Err, rowactor.ErrLeaseLost) {
			t.Fatalf("settlement %+v, want ErrLeaseLost", st)
		}
		if st := h.row(id); st.group != h.queue || h.sideRows(s, "late") != 0 {
			t.Fatalf("a lost lease's event or writes committed: row %+v, writes %d", st, h.sideRows(s, "late"))
		}
	}},
}

// lastError reads the last_error column the event scenarios add.
func (h *harness) lastErrorIs(id int64, text string) bool {
	h.t.Helper()
	return h.drv.count(h.t, h.d, "SELECT COUNT(*) FROM "+h.table.Name+" WHERE id = ? AND last_error = ?", id, text) == 1
}

// ownRetry is a retry that also records the handler's error. It does what the built-in
// retry of each form does: count the attempt (row lock), clear the lease (lease), nothing
// more (advisory: the take counted, the unlock returns the row).
func ownRetry(h *harness, form rowactor.Form) string {
	set := "last_error = {error}"
	switch form {
	case rowactor.FormRowLock:
		set += ", attempt = attempt + 1"
	case rowactor.FormLease:
		set += ", locked_until = NULL"
	}
	return "UPDATE " + h.table.Name + " SET " + set + " WHERE id = {id}"
}

var eventScenarios = []scenario{
	{name: "an own ack moves the row to a sent group instead of deleting it", run: func(t *testing.T, h *harness, form rowactor.Form) {
		b := h.broker()
		c := newCalls()
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome { c.add(d); return rowactor.Ack() },
			rowactor.Workers(2), rowactor.OnEvent("ack", "UPDATE "+h.table.Name+" SET grp = 'sent' WHERE id = {id}"))
		ids := h.publish(b, 3)
		for _, s := range h.waitSettled(3) {
			if s.Err != nil || s.Step != "ack" || s.Event != "ack" {
				t.Fatalf("settlement %+v", s)
			}
		}
		h.quiet(300 * time.Millisecond) // moved out of the queue: never delivered again
		for _, id := range ids {
			st := h.row(id)
			if !st.exists || st.group != "sent" || st.attempt != attemptColumn(form, 1, 0) {
				t.Fatalf("row %d after the own ack: %+v", id, st)
			}
			if got := c.of(id); len(got) != 1 {
				t.Fatalf("row %d delivered %d times", id, len(got))
			}
		}
	}},
	{name: "an own retry records the handler's error", shapes: []tableShape{withProcessedAt}, run: func(t *testing.T, h *harness, form rowactor.Form) {
		h.exec("ALTER TABLE " + h.table.Name + " ADD COLUMN last_error VARCHAR(200)")
		b := h.broker()
		c := newCalls()
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			c.add(d)
			if d.Attempt() == 1 {
				return rowactor.Retry().WithError(errors.New("smtp: 451 try later"))
			}
			return rowactor.Ack()
		}, rowactor.OnEvent("retry", ownRetry(h, form)))
		id := h.publish(b, 1)[0]
		got := h.waitDeliveries(2)
		if s := got[0]; s.Err != nil || s.Step != "retry" || s.Event != "retry" {
			t.Fatalf("first settlement %+v", s)
		}
		if s := got[1]; s.Err != nil || s.Step != "ack" || s.Event != "" {
			t.Fatalf("second settlement %+v", s)
		}
		st := h.row(id)
		if st.processedAt == nil || st.lockedUntil != nil || st.attempt != attemptColumn(form, 2, 1) {
			t.Fatalf("row after retry and ack: %+v", st)
		}
		if !h.lastErrorIs(id, "smtp: 451 try later") {
			t.Fatal("the own retry did not record the error")
		}
		if a := c.of(id); len(a) != 2 || a[1] != 2 {
			t.Fatalf("attempts %v, want [1 2]", a)
		}
	}},
	{name: "a custom event runs with the handler's values", run: func(t *testing.T, h *harness, form rowactor.Form) {
		b := h.broker()
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			return rowactor.Event("park", "parked-"+string(d.Payload()))
		}, rowactor.OnEvent("park", "UPDATE "+h.table.Name+" SET grp = {arg1} WHERE id = {id}"))
		id := h.publish(b, 1)[0]
		if s := h.waitSettled(1)[0]; s.Err != nil || s.Step != "event" || s.Event != "park" || s.Outcome.Event() != "park" {
			t.Fatalf("settlement %+v", s)
		}
		h.quiet(300 * time.Millisecond)
		if st := h.row(id); !st.exists || st.group != "parked-job-0" {
			t.Fatalf("row after the custom event: %+v", st)
		}
	}},
	{name: "an unknown custom event releases the row with ErrUnknownEvent", run: func(t *testing.T, h *harness, form rowactor.Form) {
		b := h.broker()
		var n atomic.Int64
		h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome {
			if n.Add(1) == 1 {
				return rowactor.Event("nope")
			}
			return rowactor.Ack()
		}, leaseOptions(form, time.Hour)...)
		id := h.publish(b, 1)[0]
		got := h.waitDeliveries(2)
		if got[0].Step == "ack" { // the release's report may arrive after the redelivery's
			got[0], got[1] = got[1], got[0]
		}
		if s := got[0]; !errors.Is(s.Err, rowactor.ErrUnknownEvent) || !s.Released || s.Step != "release" {
			t.Fatalf("first settlement %+v, want a release with ErrUnknownEvent", s)
		}
		// Released at once, not at lease expiry: the second delivery acks it.
		if s := got[1]; s.Err != nil || s.Step != "ack" {
			t.Fatalf("second settlement %+v", s)
		}
		if h.row(id).exists {
			t.Fatal("row still exists")
		}
	}},
	{name: "a late holder's own event does not run and returns ErrLeaseLost", forms: []rowactor.Form{rowactor.FormLease}, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		other := time.Now().Add(time.Hour).Truncate(time.Second)
		h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			h.exec(fmt.Sprintf("UPDATE %s SET locked_until = ?, attempt = attempt + 1 WHERE id = ?", h.table.Name), h.drv.timeValue(other), d.ID())
			return rowactor.Event("park", "parked")
		}, rowactor.OnEvent("park", "UPDATE "+h.table.Name+" SET grp = {arg1} WHERE id = {id}"))
		id := h.publish(b, 1)[0]
		if s := h.waitSettled(1)[0]; !errors.Is(s.Err, rowactor.ErrLeaseLost) {
			t.Fatalf("settlement %+v, want ErrLeaseLost", s)
		}
		st := h.row(id)
		if !st.exists || st.group != h.queue || st.attempt != 3 || st.lockedUntil == nil || !st.lockedUntil.Equal(other) {
			t.Fatalf("row changed by a late holder's event: %+v", st)
		}
	}},
	{name: "an own extend keeps the lease of a long handler", forms: []rowactor.Form{rowactor.FormLease}, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		h.exec("ALTER TABLE " + h.table.Name + " ADD COLUMN extended INTEGER NOT NULL DEFAULT 0")
		b := h.broker()
		var calls atomic.Int64
		handler := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			calls.Add(1)
			time.Sleep(5 * time.Second) // two and a half leases
			return rowactor.Drop()
		}
		extend := rowactor.OnEvent("extend", "UPDATE "+h.table.Name+" SET locked_until = {until}, extended = extended + 1 WHERE id = {id} AND locked_until = {held}")
		// Two-second leases: the renewer's writes keep a margin when the suite's parallel
		// tests load the machine (a one-second lease lapsed once under that load).
		h.subscribe(b, handler, rowactor.Lease(2*time.Second), extend, rowactor.OnEvent("drop", "UPDATE "+h.table.Name+" SET grp = 'dropped', locked_until = NULL WHERE id = {id}"))
		id := h.publish(b, 1)[0]
		waitFor(t, func() bool { return calls.Load() == 1 }) // the first broker holds it
		h.subscribe(h.second(), handler, rowactor.Lease(2*time.Second), rowactor.PollInterval(20*time.Millisecond))
		if s := h.waitSettled(1)[0]; s.Err != nil || s.Event != "drop" {
			t.Fatalf("settlement %+v", s)
		}
		h.quiet(300 * time.Millisecond)
		if n := calls.Load(); n != 1 {
			t.Fatalf("handled %d times, want 1: the own extend did not keep the lease", n)
		}
		if st := h.row(id); !st.exists || st.group != "dropped" || st.lockedUntil != nil {
			t.Fatalf("row after the own drop: %+v", st)
		}
		if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name+" WHERE id = ? AND extended >= 3", id); n != 1 {
			t.Fatal("the own extend ran fewer than 3 times in two and a half leases")
		}
	}},
}

// TestEventsRefusedAtSubscribe: an event that cannot work is refused before anything is
// claimed, naming the event and the fix.
func TestEventsRefusedAtSubscribe(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			b := h.broker()
			ack := func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }
			for _, c := range []struct {
				opts []rowactor.SubscribeOption
				want string
			}{
				{[]rowactor.SubscribeOption{rowactor.OnEvent("ack", "DELETE FROM "+h.table.Name)}, "never names {id}"},
				{[]rowactor.SubscribeOption{rowactor.OnEvent("ack", "UPDATE "+h.table.Name+" SET nope = 1 WHERE id = {id}")}, `OnEvent("ack")`},
				{[]rowactor.SubscribeOption{rowactor.OnEvent("park", "UPDATE "+h.table.Name+" SET grp = {who} WHERE id = {id}")}, "may not name {who}"},
				{[]rowactor.SubscribeOption{rowactor.OnEvent("park", "x {id}"), rowactor.OnEvent("park", "y {id}")}, "given twice"},
				{[]rowactor.SubscribeOption{rowactor.OnEvent("", "DELETE FROM "+h.table.Name+" WHERE id = {id}")}, "letters, digits"},
			} {
				_, err := b.Subscribe(context.Background(), h.table, h.queue, ack, c.opts...)
				var ce *rowactor.ConfigError
				if !errors.As(err, &ce) || !containsAll(err.Error(), c.want, h.table.Name) {
					t.Errorf("Subscribe: %v, want a *ConfigError saying %q", err, c.want)
				}
			}
		})
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
