package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// A lease is (row, token), never the row alone: a delivery whose lease ran out while it
// ran, and whose row the same process claimed again, settles nothing, whatever it
// answers and whenever it answers it.
var staleLeaseScenarios = []scenario{
	staleAnswerScenario("ack", rowactor.Ack(), false),
	staleAnswerScenario("retry", rowactor.Retry(), false),
	staleAnswerScenario("ack beside the current delivery's ack", rowactor.Ack(), true),
	{
		name:  "a lease whose ack waits for a batch is renewed until the batch commits",
		forms: []rowactor.Form{rowactor.FormLease},
		run:   waitingAckRenewedScenario,
	},
}

// staleAnswerScenario is the scenario of a stale delivery that answers late (outcome), or
// at the same moment as the current delivery (together).
func staleAnswerScenario(name string, late rowactor.Outcome, together bool) scenario {
	return scenario{
		name:  "a stale delivery's " + name + " after its row was claimed again in the same process changes nothing",
		forms: []rowactor.Form{rowactor.FormLease},
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			staleLeaseScenario(t, h, late, together)
		},
	}
}

func staleLeaseScenario(t *testing.T, h *harness, late rowactor.Outcome, together bool) {
	b := h.broker()
	first, second := make(chan struct{}), make(chan struct{})
	started := make(chan int, 4)
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- d.Attempt()
		switch d.Attempt() {
		case 1:
			<-first
			return late
		case 2:
			<-second
			return rowactor.Ack()
		}
		return rowactor.Ack() // a third delivery: the stale settlement freed the row
	}, rowactor.Workers(3))
	id := h.publish(b, 1)[0]
	if a := <-started; a != 1 {
		t.Fatalf("first delivery attempt %d", a)
	}
	// The renewer lagged and the lease ran out: the row is claimable again, and this
	// process claims it while the first delivery still runs.
	h.exec(fmt.Sprintf("UPDATE %s SET locked_until = ? WHERE id = ?", h.table.Name), h.drv.timeValue(time.Now().Add(-time.Minute)), id)
	select {
	case a := <-started:
		if a != 2 {
			t.Fatalf("second delivery attempt %d, want 2", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the row was not claimed again after its lease ran out")
	}
	current := h.row(id)
	if !current.exists || current.lockedUntil == nil || current.lockedUntil.Before(time.Now()) || current.attempt != 3 {
		t.Fatalf("row under the second claim: %+v", current)
	}
	if together {
		close(first)
		close(second)
		var stale, fresh *rowactor.Settlement
		for _, s := range h.waitSettled(2) {
			if s.Attempt == 1 {
				stale = &s
			} else {
				fresh = &s
			}
		}
		if stale == nil || fresh == nil {
			t.Fatal("settlements not one per delivery")
		}
		if !errors.Is(stale.Err, rowactor.ErrLeaseLost) {
			t.Fatalf("stale delivery's settlement: %+v, want ErrLeaseLost", *stale)
		}
		if fresh.Err != nil || fresh.Step != "ack" {
			t.Fatalf("current delivery's settlement: %+v", *fresh)
		}
		if h.row(id).exists {
			t.Fatal("the row outlived the current delivery's ack")
		}
		return
	}
	close(first)
	s := h.waitSettled(1)[0]
	if s.Attempt != 1 || !errors.Is(s.Err, rowactor.ErrLeaseLost) {
		t.Fatalf("stale delivery's settlement %+v, want attempt 1 and ErrLeaseLost", s)
	}
	// The row still belongs to the second claim: same token, same attempt, and its lease
	// is still renewed (the stale settlement must not have taken it out of the book).
	if st := h.row(id); !st.exists || st.attempt != current.attempt || st.lockedUntil == nil || st.lockedUntil.Before(*current.lockedUntil) {
		t.Fatalf("row after the stale settlement: %+v, want it held as %+v", st, current)
	}
	select {
	case a := <-started:
		t.Fatalf("a delivery of attempt %d ran beside the current one", a)
	case <-time.After(300 * time.Millisecond):
	}
	close(second)
	if s := h.waitSettled(1)[0]; s.Attempt != 2 || s.Err != nil || s.Step != "ack" {
		t.Fatalf("current delivery's settlement %+v", s)
	}
	if h.row(id).exists {
		t.Fatal("row still exists after the current delivery's ack")
	}
}

// waitingAckRenewedScenario: one row's ack is held up by another session's row lock for
// three leases, while the other row's ack goes through. The held row's lease cannot be
// renewed while the session holds it (busy, not lost): where the waiting ack keeps its
// place in the lock's queue (MariaDB), another broker polling the table never gets the
// row; where it does not (PostgreSQL: a claim may find the row free between the lock's
// end and the waiting ack's wake-up), the row is settled once either way: by the ack, or
// by the other broker, the ack then reporting its lease lost.
func waitingAckRenewedScenario(t *testing.T, h *harness, _ rowactor.Form) {
	if !hasForm(h.drv.forms, rowactor.FormRowLock) {
		t.Skip("one writer per database: a session that holds up the batch holds up the renewer too")
	}
	b := h.broker()
	ids := h.publish(b, 2)
	blocked := ids[0] // ids[1] acks while blocked's batch waits
	started, locked := make(chan struct{}), make(chan struct{})
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if d.ID() == blocked {
			close(started)
			<-locked
		} else {
			<-locked
			time.Sleep(300 * time.Millisecond) // after the blocked batch began
		}
		return rowactor.Ack()
	}, rowactor.Workers(2), rowactor.Lease(time.Second))
	<-started
	tx, commit, rollback := h.drv.begin(t, h.d)
	defer func() { _ = rollback() }()
	if err := h.drv.txExec(context.Background(), tx, fmt.Sprintf("UPDATE %s SET payload = payload WHERE id = ?", h.table.Name), blocked); err != nil {
		t.Fatalf("lock the first row: %v", err)
	}
	var other atomic.Int64
	h.subscribe(h.second(), func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		other.Add(1)
		return rowactor.Ack()
	}, rowactor.Lease(time.Second), rowactor.PollInterval(20*time.Millisecond))
	close(locked)
	time.Sleep(3 * time.Second) // three leases
	if err := commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	got := h.waitSettled(2)
	if other.Load() > 0 || slices.ContainsFunc(got, func(s rowactor.Settlement) bool { return s.Err != nil }) {
		got = append(got, h.waitSettled(1)...) // the other broker took the held row: its ack too
	}
	lost := 0
	for _, s := range got {
		switch {
		case s.ID == blocked && !h.drv.waiterKeepsPlace && errors.Is(s.Err, rowactor.ErrLeaseLost):
			lost++
		case s.ID != blocked && errors.Is(s.Err, rowactor.ErrLeaseLost):
			// The free row's one-second lease ran out because its extension missed its
			// deadline (half a lease) on a loaded machine: the other broker took it.
			lost++
		case s.Err != nil || s.Step != "ack":
			t.Fatalf("settlement %+v\nlogs:\n%s", s, h.logs.String())
		}
	}
	// A lease the renewer found run out is lost before the other broker claims the row:
	// its delivery there may come a poll later.
	for deadline := time.Now().Add(10 * time.Second); other.Load() < int64(lost) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if n := other.Load(); n != int64(lost) {
		t.Fatalf("the other broker handled %d rows; %d acks found their lease lost", n, lost)
	}
	for _, id := range ids {
		if h.row(id).exists {
			t.Fatalf("row %d outlived its ack", id)
		}
	}
}
