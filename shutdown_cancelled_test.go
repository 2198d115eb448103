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

var shutdownCancelledScenarios = []scenario{
	{
		name: "shutdown with a context already cancelled under a busy queue leaves no row held",
		run:  cancelledShutdownScenario,
	},
	{
		name: "a handler cut off by Shutdown reads ErrClosed as its cause, and the hook and the report agree its row was released",
		run:  handlerCutOffScenario,
	},
}

// cancelledShutdownScenario: a service stopping on a signal calls Shutdown with a context
// that has already ended, while claims are in flight. Every claim started must be
// delivered or released: afterwards a fresh broker drains every row left at once (a row
// lock left open, a key left locked or a lease left standing would hold its row back for
// the lease or forever), and no key stays locked.
//
// One exception is told to the service: a lease whose settlement Shutdown cut when its
// context ended (a slow ack under load) stays until it runs out, and its settlement says
// so (an error, not released). Such a row must have that report; a lease standing with
// none is a claim the shutdowns leaked. The rounds' leases are two seconds, so those rows
// come back within the drain's wait.
func cancelledShutdownScenario(t *testing.T, h *harness, form rowactor.Form) {
	const rounds, rows = 5, 60
	ids := h.publish(h.broker(rowactor.WithPollOnly()), rows)
	var handled atomic.Int64
	for range rounds {
		b := h.second()
		h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome {
			time.Sleep(time.Millisecond)
			handled.Add(1)
			return rowactor.Ack()
		}, append(leaseOptions(form, 2*time.Second), rowactor.Workers(4), rowactor.PollInterval(5*time.Millisecond))...)
		start := handled.Load()
		waitFor(t, func() bool { return handled.Load() > start || handled.Load() >= rows })
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := b.Shutdown(ctx); err != nil && !strings.Contains(err.Error(), "context canceled") {
			t.Fatalf("Shutdown: %v", err)
		}
	}
	// Everything left must be claimable at once, but for leases whose cut settlement
	// said so.
	// A cut release may be reported a moment after Shutdown returned (its context had
	// ended): a leased row gets 3 s for its report; a leaked claim never has one.
	cut := map[int64]bool{}
	drain := func() {
		for drained := false; !drained; {
			select {
			case st := <-h.settled:
				cut[st.ID] = cut[st.ID] || st.Err != nil && !st.Released
			default:
				drained = true
			}
		}
	}
	if form == rowactor.FormLease {
		now := time.Now()
		for _, id := range ids {
			for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				drain()
				st := h.row(id)
				if !st.exists || st.lockedUntil == nil || !st.lockedUntil.After(now) || cut[id] {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("row %d is leased until %v after the shutdowns, and no settlement said it was cut: a claim the shutdowns leaked\nlogs:\n%s",
						id, st.lockedUntil, h.logs.String())
				}
			}
		}
	}
	drain()
	left := h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s", h.table.Name))
	var drained atomic.Int64
	h.subscribe(h.second(), func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		drained.Add(1)
		return rowactor.Ack()
	}, rowactor.Workers(4), rowactor.PollInterval(20*time.Millisecond))
	deadline := time.Now().Add(10 * time.Second)
	for h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s", h.table.Name)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rows left after the shutdowns could not be claimed in 10 s (held by a claim the shutdowns leaked)\nlogs:\n%s",
				h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s", h.table.Name)), left, h.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if h.drv.keyLocked != nil && form == rowactor.FormAdvisory {
		// The draining broker lets each key go just after its row's delete commits, so
		// a key may read locked a moment after the table reads empty; one the shutdowns
		// leaked stays locked.
		for _, id := range ids {
			key := strings.ReplaceAll(h.table.AdvisoryKey, "{id}", fmt.Sprint(id))
			for deadline := time.Now().Add(5 * time.Second); h.drv.keyLocked(t, h.d, key); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("key %s still locked 5 s after its row was drained", key)
				}
			}
		}
	}
}

// handlerCutOffScenario: a handler still running when Shutdown's context ends reads
// ErrClosed as its context's cause, a sentinel it can test as ErrCancelled is for Cancel;
// the hook reports the row released, the report counts it, and the table holds the row
// free to be claimed again: no lease standing, no key or row lock held.
func handlerCutOffScenario(t *testing.T, h *harness, form rowactor.Form) {
	b := h.broker()
	causes := make(chan error, 1)
	started := make(chan struct{})
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		close(started)
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return rowactor.Ack() // too late: the row was released
	})
	id := h.publish(b, 1)[0]
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	rep, err := b.Shutdown(ctx)
	if !errors.Is(err, rowactor.ErrNotDrained) || rep.Released != 1 || rep.Drained {
		t.Fatalf("Shutdown: %+v, %v; want 1 row released, not drained", rep, err)
	}
	if cause := <-causes; !errors.Is(cause, rowactor.ErrClosed) {
		t.Fatalf("the handler's context.Cause at shutdown is %v, want ErrClosed", cause)
	}
	s := h.waitSettled(1)[0]
	if s.ID != id || s.Step != "release" || !s.Released || !errors.Is(s.Err, rowactor.ErrClosed) {
		t.Fatalf("settlement %+v, want the row released with ErrClosed", s)
	}
	if st := h.row(id); !st.exists || st.lockedUntil != nil {
		t.Fatalf("row after Shutdown %+v, want it in the table, its lease cleared", st)
	}
	// Free to be claimed again at once: a row lock or a key still held would hold it back.
	h.subscribe(h.second(), func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	if s := h.waitSettled(1)[0]; s.ID != id || s.Err != nil {
		t.Fatalf("settlement after Shutdown %+v, want row %d acked", s, id)
	}
}
