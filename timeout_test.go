package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// Timeouts (Timeout, Delivery.SetTimeout) over every (database, form, transactional): a
// handler that honours its context fails at its deadline; one that returns late fails
// whatever it returned; one that ignores its context is abandoned a grace later, its row
// released by the form's rule and its worker freed; SetTimeout moves the deadline.

// withinDur fails unless got lies in [lo, hi].
func withinDur(t *testing.T, what string, got, lo, hi time.Duration) {
	t.Helper()
	if got < lo || got > hi {
		t.Fatalf("%s: %v, want between %v and %v", what, got, lo, hi)
	}
}

// wantFailedLate checks a settlement and its row after a delivery failed by its deadline:
// retried after the policy's hour, its attempt counted, the error column saying why.
func wantFailedLate(t *testing.T, h *harness, form rowactor.Form, s rowactor.Settlement, before time.Time, errHas string) {
	t.Helper()
	if s.Step != "retry_after" || s.Err != nil || s.Outcome.String() != "fail" || !errors.Is(s.HandlerErr, context.DeadlineExceeded) {
		t.Fatalf("settlement %+v, want a Fail wrapping context.DeadlineExceeded", s)
	}
	st := h.row(s.ID)
	within(t, st.retryAfter, before.Add(time.Hour), time.Minute)
	if st.attempt != attemptColumn(form, 1, 1) || st.lockedUntil != nil || !strings.Contains(errText(st), errHas) {
		t.Fatalf("row after the deadline %+v, error %q; want its attempt counted and %q", st, errText(st), errHas)
	}
}

var hourPolicy = rowactor.RetryPolicy(func(int, error) time.Duration { return time.Hour })

var timeoutScenarios = []scenario{
	{name: "a handler that honours its context fails at its deadline with backoff", shapes: []tableShape{withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b := h.broker()
			type seen struct {
				deadline, done time.Duration
				hasDeadline    bool
				err            error
			}
			got := make(chan seen, 1)
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				start := time.Now()
				h.note(ctx, d, "before the deadline")
				dl, ok := ctx.Deadline()
				<-ctx.Done()
				got <- seen{deadline: dl.Sub(start), done: time.Since(start), hasDeadline: ok, err: ctx.Err()}
				return rowactor.Fail(fmt.Errorf("send: %w", ctx.Err()))
			}, rowactor.Timeout(200*time.Millisecond), hourPolicy)
			before := time.Now()
			h.publish(b, 1)
			s := h.waitSettled(1)[0]
			g := <-got
			if !g.hasDeadline || !errors.Is(g.err, context.DeadlineExceeded) {
				t.Fatalf("ctx.Deadline reported %v, ctx.Err %v; want a deadline and DeadlineExceeded", g.hasDeadline, g.err)
			}
			withinDur(t, "ctx.Deadline from the handler's start", g.deadline, 150*time.Millisecond, 200*time.Millisecond)
			withinDur(t, "ctx ended after", g.done, 150*time.Millisecond, time.Second)
			wantFailedLate(t, h, form, s, before, "send: context deadline exceeded") // the handler's own error is kept
			h.wantKept(map[string]int{"before the deadline": 0})
		}},
	{name: "a handler that returns after its deadline fails whatever it returned", shapes: []tableShape{withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b := h.broker()
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				h.note(ctx, d, "late ack")
				time.Sleep(400 * time.Millisecond) // past the deadline, within the grace (1 s)
				return rowactor.Ack()
			}, rowactor.Timeout(150*time.Millisecond), hourPolicy)
			before := time.Now()
			h.publish(b, 1)
			s := h.waitSettled(1)[0]
			wantFailedLate(t, h, form, s, before, "returned ack after its deadline (timeout 150ms): context deadline exceeded")
			h.wantKept(map[string]int{"late ack": 0}) // an Ack returned late is refused, its writes rolled back
		}},
	{name: "a handler past its deadline on its last attempt moves to the dead letter", shapes: []tableShape{withError},
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			b := h.broker()
			h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome {
				time.Sleep(250 * time.Millisecond)
				return rowactor.Ack()
			}, rowactor.Timeout(100*time.Millisecond), rowactor.MaxAttempts(1), rowactor.DeadLetterGroup("dead"))
			id := h.publish(b, 1)[0]
			if s := h.waitSettled(1)[0]; s.Step != "dead_letter" || s.Err != nil || !errors.Is(s.HandlerErr, context.DeadlineExceeded) {
				t.Fatalf("settlement %+v", s)
			}
			if st := h.row(id); st.group != "dead" || !strings.Contains(errText(st), "deadline exceeded") {
				t.Fatalf("row %+v, error %q", st, errText(st))
			}
		}},
	{name: "SetTimeout extends the deadline past the subscription's Timeout",
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			b := h.broker()
			errs := make(chan error, 1)
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				// First, well before the 100 ms deadline: the note's write through the
				// lent transaction may take longer than that under load.
				d.SetTimeout(5 * time.Second)
				dl, ok := ctx.Deadline()
				if left := time.Until(dl); !ok || left < 4*time.Second {
					errs <- fmt.Errorf("ctx.Deadline %v in %v after SetTimeout(5s)", ok, left)
					return rowactor.Ack()
				}
				h.note(ctx, d, "extended")
				time.Sleep(300 * time.Millisecond) // past the subscription's 100 ms
				errs <- ctx.Err()
				return rowactor.Ack()
			}, rowactor.Timeout(100*time.Millisecond))
			h.publish(b, 1)
			if s := h.waitSettled(1)[0]; s.Step != "ack" || s.Err != nil {
				t.Fatalf("settlement %+v", s)
			}
			if err := <-errs; err != nil {
				t.Fatalf("the handler's context: %v", err)
			}
			h.wantKept(map[string]int{"extended": 1})
		}},
	{name: "SetTimeout gives a deadline to a subscription without Timeout", shapes: []tableShape{withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b := h.broker()
			took := make(chan time.Duration, 1)
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				if _, ok := ctx.Deadline(); ok {
					took <- -1
					return rowactor.Ack()
				}
				start := time.Now()
				d.SetTimeout(100 * time.Millisecond)
				<-ctx.Done()
				took <- time.Since(start)
				return rowactor.Retry()
			}, hourPolicy)
			before := time.Now()
			h.publish(b, 1)
			s := h.waitSettled(1)[0]
			withinDur(t, "the context ended after", <-took, 80*time.Millisecond, time.Second)
			wantFailedLate(t, h, form, s, before, "returned retry after its deadline (timeout 100ms)")
		}},
	{name: "a handler that ignores its context is abandoned: its row released, its worker freed", shapes: []tableShape{withError, withProcessedAt},
		run: runAbandoned},
	{name: "a batch handler that returns after its deadline fails every row", forms: rowLockOnly, shapes: []tableShape{withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			if h.tx {
				t.Skip("batch handlers cannot be transactional")
			}
			b := h.broker()
			h.publish(b, 2)
			before := time.Now()
			h.subscribeBatch(b, 2, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
				time.Sleep(300 * time.Millisecond)
				out := make([]rowactor.Outcome, len(ds))
				for i := range out {
					out[i] = rowactor.Ack()
				}
				return out
			}, rowactor.Timeout(100*time.Millisecond), hourPolicy)
			for _, s := range h.waitSettled(2) {
				wantFailedLate(t, h, form, s, before, "returned ack after its deadline")
			}
		}},
	{name: "a batch handler that ignores its context is abandoned: its rows rolled back, its worker freed", forms: rowLockOnly,
		shapes: []tableShape{withProcessedAt},
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			if h.tx {
				t.Skip("batch handlers cannot be transactional")
			}
			tel := newTelemetry(t)
			b, logs := h.captured(tel.options()...)
			ids := h.publish(b, 2)
			stuck, returned := make(chan struct{}), make(chan struct{})
			unblock := sync.OnceFunc(func() { close(stuck) })
			t.Cleanup(unblock) // before the broker's shutdown, should the test fail first
			var calls atomic.Int64
			h.subscribeBatch(b, 2, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
				out := make([]rowactor.Outcome, len(ds))
				for i := range out {
					out[i] = rowactor.Ack()
				}
				if calls.Add(1) == 1 {
					<-stuck // ignores ctx
					defer close(returned)
					for i := range out {
						out[i] = rowactor.RetryAfter(time.Hour)
					}
				}
				return out
			}, rowactor.Timeout(100*time.Millisecond), rowactor.Workers(1))
			got := h.waitSettled(4) // two releases, then the next batch's two acks
			released, acked := 0, 0
			for _, s := range got {
				switch {
				case s.Step == "release" && s.Released && errors.Is(s.Err, rowactor.ErrAbandoned) && errors.Is(s.Err, context.DeadlineExceeded):
					released++
				case s.Step == "ack" && s.Err == nil:
					acked++
				default:
					t.Fatalf("settlement %+v", s)
				}
			}
			if released != 2 || acked != 2 || calls.Load() != 2 {
				t.Fatalf("%d released, %d acked in %d calls; want both rows released, then acked by a second call while the first still runs", released, acked, calls.Load())
			}
			if n := tel.sum(t, "rowactor.deliveries.abandoned"); n != 2 {
				t.Fatalf("rowactor.deliveries.abandoned = %d, want 2", n)
			}
			if w := logs.logged(slog.LevelWarn, "ran past its deadline"); len(w) != 1 || w[0]["rows"].String() != "2" {
				t.Fatalf("WARN records %v, want one for the batch of 2", w)
			}
			unblock()
			<-returned
			h.quiet(300 * time.Millisecond)
			for _, id := range ids {
				if st := h.row(id); st.processedAt == nil || st.retryAfter != nil {
					t.Fatalf("row %d %+v: the abandoned batch's late RetryAfter must change nothing", id, st)
				}
			}
		}},
}

// runAbandoned: a handler blocked on a channel, its context ignored, is given up on a grace
// past its deadline. At that moment (the hook holds the delivery actor, so the subscription
// cannot claim again) the row is checked as another claimer sees it; then, with one worker,
// the subscription delivers the released row and the other while the first handler is
// still blocked; the first handler's late outcome changes nothing.
func runAbandoned(t *testing.T, h *harness, form rowactor.Form) {
	tel := newTelemetry(t)
	abandoned, checked := make(chan rowactor.Settlement, 1), make(chan struct{})
	hook := rowactor.WithOnSettled(func(s rowactor.Settlement) {
		if errors.Is(s.Err, rowactor.ErrAbandoned) {
			abandoned <- s
			<-checked
		}
		h.settled <- s
	})
	b, logs := h.captured(append(tel.options(), hook)...)
	ids := h.publish(b, 2)
	stuck, returned := make(chan struct{}), make(chan struct{})
	unblock := sync.OnceFunc(func() { close(stuck) })
	t.Cleanup(unblock) // before the broker's shutdown, should the test fail first
	lateWrite := make(chan error, 1)
	var calls atomic.Int64
	// The deadline bounds the next rows' deliveries too, whose handlers write through
	// their transactions: a second leaves that write room on a loaded machine (at 200 ms
	// one ran past it).
	const timeout = time.Second
	// Counted from before Subscribe: the first handler may start before it returns.
	start := time.Now()
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if calls.Add(1) > 1 {
			h.note(ctx, d, "next")
			return rowactor.Ack()
		}
		defer close(returned)
		h.note(ctx, d, "abandoned")
		<-stuck // ignores ctx
		if h.tx {
			// The lent transaction was ended under the handler.
			wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			lateWrite <- h.drv.txExec(wctx, d.Tx(), fmt.Sprintf("INSERT INTO %s (payload) VALUES (?)", h.sideTable.Name), []byte("late"))
		}
		return rowactor.RetryAfter(time.Hour)
	}, append(leaseOptions(form, time.Hour), rowactor.Timeout(timeout), rowactor.Workers(1))...)

	var s rowactor.Settlement
	select {
	case s = <-abandoned:
	case <-time.After(15 * time.Second):
		close(checked)
		t.Fatalf("no abandonment; logs:\n%v", logs.logged(slog.LevelWarn, ""))
	}
	func() {
		defer close(checked)
		withinDur(t, "abandoned after", time.Since(start), timeout+time.Second, timeout+time.Second+5*time.Second)
		if s.ID != ids[0] || s.Step != "release" || !s.Released || !errors.Is(s.Err, context.DeadlineExceeded) {
			t.Fatalf("abandonment %+v", s)
		}
		wantClaimable(t, h, form, ids[0])
		w := logs.logged(slog.LevelWarn, "ran past its deadline")
		if len(w) != 1 {
			t.Fatalf("%d WARN records of the abandonment, want 1", len(w))
		}
		for k, want := range map[string]string{"table": h.table.Name, "queue": h.queue, "id": fmt.Sprint(ids[0]), "attempt": "1",
			"form": form.String(), "timeout": timeout.String(), "grace": time.Second.String()} {
			if got := w[0][k].String(); got != want {
				t.Fatalf("log attribute %s = %q, want %q", k, got, want)
			}
		}
		if n := tel.sum(t, "rowactor.deliveries.abandoned"); n != 1 {
			t.Fatalf("rowactor.deliveries.abandoned = %d, want 1", n)
		}
	}()

	// One worker, and its handler still blocked: both rows are delivered all the same.
	got := h.waitSettled(3)
	if !errors.Is(got[0].Err, rowactor.ErrAbandoned) {
		t.Fatalf("first settlement %+v, want the abandonment", got[0])
	}
	for _, s := range got[1:] {
		if s.Step != "ack" || s.Err != nil {
			t.Fatalf("settlement after the abandonment %+v", s)
		}
	}
	if calls.Load() != 3 {
		t.Fatalf("%d handler calls, want 3 (the abandoned row again, and the other)", calls.Load())
	}
	before := h.row(ids[0])
	unblock()
	<-returned
	if h.tx {
		if err := <-lateWrite; err == nil {
			t.Fatal("a write through the abandoned delivery's transaction succeeded")
		}
	}
	h.quiet(300 * time.Millisecond) // nothing settled twice
	after := h.row(ids[0])
	if after.processedAt == nil || after.retryAfter != nil || after.attempt != before.attempt {
		t.Fatalf("row %+v after the abandoned handler returned RetryAfter, was %+v: it changed", after, before)
	}
	waitFor(t, func() bool { return len(logs.logged(slog.LevelInfo, "an abandoned handler returned")) == 1 })
	h.wantKept(map[string]int{"abandoned": 0, "next": 2, "late": 0})
}

// wantClaimable checks that a row given back by an abandonment can be claimed by anyone at
// once: its lease cleared; its claim transaction gone (another claim locks it); its key free.
func wantClaimable(t *testing.T, h *harness, form rowactor.Form, id int64) {
	t.Helper()
	switch form {
	case rowactor.FormLease:
		if st := h.row(id); st.lockedUntil != nil {
			t.Fatalf("lease still held: %+v", st)
		}
	case rowactor.FormRowLock:
		q, err := h.d.Open(context.Background(), dialects.QueueSpec{Table: h.table, Group: h.queue})
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		// The server drops the lock as the interrupted session ends: a moment, at most.
		var got int64
		waitFor(t, func() bool {
			c, ok, err := q.(dialects.RowLockQueue).ClaimLocked(context.Background(), time.Now())
			if err != nil || !ok {
				return false
			}
			got = c.Row().ID
			_ = c.Rollback(context.Background())
			return got == id
		})
	case rowactor.FormAdvisory:
		if h.drv.keyLocked != nil {
			key := strings.ReplaceAll(h.table.AdvisoryKey, "{id}", fmt.Sprint(id))
			waitFor(t, func() bool { return !h.drv.keyLocked(t, h.d, key) })
		}
	}
}

// TestTimeoutConformance runs the timeout scenarios over every database, form and mode.
func TestTimeoutConformance(t *testing.T) { runModeMatrix(t, timeoutScenarios) }

// TestTimeoutRefusesNegative: a negative Timeout is a *ConfigError naming the option.
func TestTimeoutRefusesNegative(t *testing.T) {
	t.Parallel()
	h := newHarness(t, driverNamed(t, "sqlite"), rowactor.FormLease)
	_, err := h.broker().Subscribe(context.Background(), h.table, h.queue,
		func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }, rowactor.Timeout(-time.Second))
	var ce *rowactor.ConfigError
	if !errors.As(err, &ce) || ce.Option != "Timeout" || ce.Table != h.table.Name {
		t.Fatalf("Subscribe with Timeout(-1s): %v, want a *ConfigError naming Timeout", err)
	}
}

// TestTimeoutStatementInFlight: a transactional handler whose statement is running
// through its lent transaction when the deadline passes, and which then ignores its
// context, is abandoned all the same: its row becomes claimable, and the connection the
// statement ran on is not used from two goroutines (run with -race). With the handler's
// context the driver cuts the statement off at the deadline. On PostgreSQL a statement run
// with a context of the handler's own is cut off by the abandonment itself (its socket
// closed under it); through database/sql the release waits for such a statement.
func TestTimeoutStatementInFlight(t *testing.T) {
	t.Parallel()
	sleeps := map[string]string{"postgres": "SELECT pg_sleep(30)", "mysql": "SELECT SLEEP(30)"}
	for _, drv := range drivers {
		sleep, ok := sleeps[drv.name]
		if !ok {
			continue
		}
		for _, form := range drv.forms {
			for _, own := range []bool{false, true} {
				if own && drv.name != "postgres" {
					continue
				}
				ctxName := "the handler's context"
				if own {
					ctxName = "a context of its own"
				}
				t.Run(fmt.Sprintf("%s/%s/%s", drv.name, form, ctxName), func(t *testing.T) {
					t.Parallel()
					h := newHarness(t, drv, form)
					h.tx, h.sideTable = true, h.side()
					abandoned, checked := make(chan rowactor.Settlement, 1), make(chan struct{})
					b := h.broker(rowactor.WithOnSettled(func(s rowactor.Settlement) {
						if errors.Is(s.Err, rowactor.ErrAbandoned) {
							abandoned <- s
							<-checked
						}
						h.settled <- s
					}))
					stuck := make(chan struct{})
					unblock := sync.OnceFunc(func() { close(stuck) })
					t.Cleanup(unblock)
					stmtErr := make(chan error, 1)
					var calls atomic.Int64
					h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
						if calls.Add(1) > 1 {
							return rowactor.Ack()
						}
						sctx := ctx
						if own {
							sctx = context.Background()
						}
						stmtErr <- h.drv.txExec(sctx, d.Tx(), sleep)
						<-stuck // and then ignores ctx
						return rowactor.Ack()
					}, append(leaseOptions(form, time.Hour), rowactor.Timeout(200*time.Millisecond), rowactor.Workers(1))...)
					id := h.publish(b, 1)[0]
					var s rowactor.Settlement
					select {
					case s = <-abandoned:
					case <-time.After(20 * time.Second):
						close(checked)
						t.Fatal("no abandonment")
					}
					start := time.Now()
					wantClaimable(t, h, form, id)
					t.Logf("claimable %v after the abandonment", time.Since(start))
					close(checked)
					if s.ID != id || !s.Released {
						t.Fatalf("abandonment %+v", s)
					}
					select {
					case err := <-stmtErr:
						if err == nil {
							t.Fatal("the handler's statement succeeded")
						}
					case <-time.After(5 * time.Second):
						t.Fatal("the handler's statement was not cut off")
					}
					if s := h.waitSettled(2)[1]; s.Step != "ack" || s.Err != nil {
						t.Fatalf("the released row's next delivery %+v", s)
					}
					unblock()
				})
			}
		}
	}
}

// A handler that moves its deadline (Delivery.SetTimeout) as the deadline passes, and then
// ignores its ended context, must still be given up on a grace after its deadline (Timeout:
// "A handler still running a grace past its deadline is given up on"). Goroutines of the
// handler that read its context (ctx.Err, as a driver does) make the race likely.
func TestSetTimeoutAsTheDeadlinePassesKeepsTheGiveUp(t *testing.T) {
	var drv driver
	for _, d := range drivers {
		if d.name == "sqlite" {
			drv = d
		}
	}
	const rows = 24
	h := newHarness(t, drv, rowactor.FormLease, withError)
	abandoned := make(chan int64, rows)
	b := h.broker(rowactor.WithOnSettled(func(s rowactor.Settlement) {
		if errors.Is(s.Err, rowactor.ErrAbandoned) {
			abandoned <- s.ID
		}
	}))
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		var wg sync.WaitGroup
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
				}
			}()
		}
		for ctx.Err() == nil {
			d.SetTimeout(time.Millisecond) // a heartbeat that keeps moving the deadline
		}
		wg.Wait()
		<-stuck // then ignores its context
		return rowactor.Ack()
	}, rowactor.Lease(time.Hour), rowactor.Timeout(time.Second), rowactor.Workers(rows))
	h.publish(b, rows)
	got := map[int64]bool{}
	timeout := time.After(8 * time.Second) // deadlines within ms of the start, a grace of 1 s
	for len(got) < rows {
		select {
		case id := <-abandoned:
			got[id] = true
		case <-timeout:
			t.Fatalf("%d of %d handlers that ignore their ended context were never given up on", rows-len(got), rows)
		}
	}
}
