package rowactor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// The service's own code never breaks the runtime: a panic in a function of the
// service's that rowactor calls (a WorkersByKey key function, a WithOnSettled hook, JSON
// decoding, a retry policy) stays with its one row, as a handler's panic does: logged with
// its stack, that row released or set aside, every other row handled once, and Shutdown
// drains as if nothing had happened.

// overlapCounter records each row's handler calls, and whether two ever ran at once.
type overlapCounter struct {
	mu      sync.Mutex
	running map[int64]int
	calls   map[int64]int
	overlap []int64
}

func newOverlapCounter() *overlapCounter {
	return &overlapCounter{running: map[int64]int{}, calls: map[int64]int{}}
}

func (o *overlapCounter) enter(id int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls[id]++
	if o.running[id]++; o.running[id] > 1 {
		o.overlap = append(o.overlap, id)
	}
}

func (o *overlapCounter) leave(id int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.running[id]--
}

func (o *overlapCounter) of(id int64) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls[id]
}

// TestAPanickingKeyFunctionStaysWithItsRow: a WorkersByKey key function that panics on
// one malformed row used to crash the subscription actor, which Proto.Actor restarted
// with fresh state: rows handled twice at once, a row leased to nobody, the restarted
// actor panicking on a nil map, and Shutdown waiting out its context. The malformed row
// is released and set aside at its next claim; every other row is handled once.
func TestAPanickingKeyFunctionStaysWithItsRow(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			t.Run(fmt.Sprintf("%s/%s", drv.name, form), func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, drv, form)
				b := h.broker()
				calls := newOverlapCounter()
				h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
					calls.enter(d.ID())
					defer calls.leave(d.ID())
					time.Sleep(30 * time.Millisecond)
					return rowactor.Ack()
				}, append(leaseOptions(form, time.Hour), rowactor.WorkersByKey(3, func(d *rowactor.Delivery) string {
					if d.Header("account") == "" {
						panic("malformed row: no account header")
					}
					return d.Header("account")
				}))...)
				var good []int64
				var bad int64
				for i, k := range []string{"alice", "", "alice", "bob", "bob", "carol"} {
					var opts []rowactor.PublishOption
					if k != "" {
						opts = append(opts, rowactor.WithHeaders(map[string]string{"account": k}))
					}
					id, err := b.Publish(context.Background(), h.table, h.queue, []byte(fmt.Sprint(i)), opts...)
					if err != nil {
						t.Fatal(err)
					}
					if k == "" {
						bad = id
					} else {
						good = append(good, id)
					}
				}
				var badSettled []rowactor.Settlement
				acked := 0
				deadline := time.After(15 * time.Second)
				// The malformed row's release may come after the last healthy row's ack: the
				// loop waits for both, so that the quiet below hears neither.
				for acked < len(good) || len(badSettled) == 0 {
					select {
					case s := <-h.settled:
						switch {
						case s.ID == bad:
							badSettled = append(badSettled, s)
						case s.Step == "ack" && s.Err == nil:
							acked++
						default:
							t.Errorf("settlement of a healthy row %+v", s)
						}
					case <-deadline:
						t.Fatalf("%d of %d healthy rows acked, and %d settlements of the malformed row, in 15 s\nlogs:\n%s",
							acked, len(good), len(badSettled), h.logs.String())
					}
				}
				// The malformed row is set aside: neither leased to nobody nor delivered.
				waitFor(t, func() bool {
					st := h.row(bad)
					return st.exists && st.lockedUntil == nil && strings.Contains(h.logs.String(), "set aside")
				})
				h.quiet(300 * time.Millisecond)
				for _, id := range good {
					if n := calls.of(id); n != 1 {
						t.Errorf("row %d handled %d times, want once", id, n)
					}
				}
				if n := calls.of(bad); n != 0 {
					t.Errorf("the malformed row was handled %d times", n)
				}
				if len(calls.overlap) > 0 {
					t.Errorf("rows %v were handled twice at once", calls.overlap)
				}
				if len(badSettled) == 0 || badSettled[0].Panic == nil || !badSettled[0].Released || errors.Is(badSettled[0].Err, rowactor.ErrClosed) {
					t.Errorf("the malformed row's settlements %+v; want it released with the key function's panic, not ErrClosed", badSettled)
				}
				logs := h.logs.String()
				if !strings.Contains(logs, "key function panicked") || !strings.Contains(logs, "malformed row: no account header") || !strings.Contains(logs, "goroutine ") {
					t.Errorf("the key function's panic was not logged with its stack:\n%s", logs)
				}
				if strings.Contains(logs, "subscription actor panicked") || strings.Contains(logs, "nil map") {
					t.Errorf("the subscription actor failed:\n%s", logs)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if rep, err := b.Shutdown(ctx); err != nil || !rep.Drained || rep.Released != 0 {
					t.Errorf("Shutdown with nothing in work: %+v, %v; want drained, nothing released", rep, err)
				}
			})
		}
	}
}

// TestAPanickingOnSettledHookLeaksNothing: a WithOnSettled hook that panicked once used to
// leave its delivery counted in work, so that Shutdown, with nothing in work, waited out
// its context and reported "did not drain: 0 rows released". The panic is logged with its
// stack, and the delivery ends as if the hook had returned.
func TestAPanickingOnSettledHookLeaksNothing(t *testing.T) {
	t.Parallel()
	eachDriverAndForm(t, nil, func(t *testing.T, h *harness) {
		panickingHookLeaksNothing(t, h, 1)
		if logs := h.logs.String(); !strings.Contains(logs, "WithOnSettled hook panicked") || !strings.Contains(logs, "the hook's own bug") ||
			!strings.Contains(logs, "goroutine ") {
			t.Errorf("the hook's panic was not logged with its stack:\n%s", logs)
		}
	})
}

// panickingHookLeaksNothing publishes five rows to a broker whose WithOnSettled hook
// panics on its first panics settlements (opts give the broker more), and checks that
// every row is acked and Shutdown drains at once.
func panickingHookLeaksNothing(t *testing.T, h *harness, panics int64, opts ...rowactor.Option) {
	t.Helper()
	var told atomic.Int64
	b := h.broker(append(opts, rowactor.WithOnSettled(func(rowactor.Settlement) {
		if told.Add(1) <= panics {
			panic("the hook's own bug")
		}
	}))...)
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }, rowactor.Workers(2))
	ids := h.publish(b, 5)
	waitFor(t, func() bool { return told.Load() == 5 })
	for _, id := range ids {
		if h.row(id).exists {
			t.Errorf("row %d was not acked", id)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if rep, err := b.Shutdown(ctx); err != nil || !rep.Drained || rep.Released != 0 {
		t.Errorf("Shutdown with nothing in work: %+v, %v; want drained and nil", rep, err)
	}
}

// panicky is a message whose JSON decoding panics on a payload it does not expect.
type panicky struct{ N int }

func (p *panicky) UnmarshalJSON(b []byte) error {
	if string(b) == `"boom"` {
		panic("UnmarshalJSON cannot take boom")
	}
	return json.Unmarshal(b, &p.N)
}

// TestAPanickingJSONDecodingStaysWithItsRow: a payload whose decoding panics (a custom
// UnmarshalJSON) is a panic of that row's handler: the row is released unsettled with
// the panic logged with its stack, and the other rows are handled once.
func TestAPanickingJSONDecodingStaysWithItsRow(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			b := h.broker()
			calls := newOverlapCounter()
			h.subscribe(b, rowactor.JSON(func(_ context.Context, d *rowactor.Delivery, m panicky) error {
				calls.enter(d.ID())
				calls.leave(d.ID())
				return nil
			}), rowactor.Workers(2))
			var good []int64
			var bad int64
			for _, p := range []string{"1", `"boom"`, "2", "3"} {
				id, err := b.Publish(context.Background(), h.table, h.queue, []byte(p))
				if err != nil {
					t.Fatal(err)
				}
				if p == `"boom"` {
					bad = id
				} else {
					good = append(good, id)
				}
			}
			var sawPanic bool
			acked := 0
			deadline := time.After(15 * time.Second)
			for acked < len(good) || !sawPanic {
				select {
				case s := <-h.settled:
					switch {
					case s.ID == bad:
						sawPanic = sawPanic || s.Panic != nil && s.Released
					case s.Step == "ack" && s.Err == nil:
						acked++
					default:
						t.Errorf("settlement of a healthy row %+v", s)
					}
				case <-deadline:
					t.Fatalf("%d of %d rows acked, the panic seen %v, in 15 s\nlogs:\n%s", acked, len(good), sawPanic, h.logs.String())
				}
			}
			for _, id := range good {
				if n := calls.of(id); n != 1 {
					t.Errorf("row %d handled %d times, want once", id, n)
				}
			}
			if logs := h.logs.String(); !strings.Contains(logs, "UnmarshalJSON cannot take boom") || !strings.Contains(logs, "goroutine ") {
				t.Errorf("the decoding panic was not logged with its stack:\n%s", logs)
			}
		})
	}
}

// TestAPanickingRetryPolicyFallsBackWithItsStackLogged: a retry policy that panics backs
// the row off by DefaultBackoff, and the panic is logged with its stack.
func TestAPanickingRetryPolicyFallsBackWithItsStackLogged(t *testing.T) {
	t.Parallel()
	h := newHarness(t, driverNamed(t, "sqlite"), rowactor.FormLease)
	b := h.broker()
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		return rowactor.Fail(errors.New("transient"))
	},
		rowactor.RetryPolicy(func(int, error) time.Duration { panic("the policy's own bug") }))
	id := h.publish(b, 1)[0]
	if s := h.waitSettled(1)[0]; s.Step != "retry_after" || s.Err != nil {
		t.Fatalf("settlement %+v, want retry_after by DefaultBackoff", s)
	}
	within(t, h.row(id).retryAfter, time.Now().Add(time.Second), 2*time.Second)
	if logs := h.logs.String(); !strings.Contains(logs, "the policy's own bug") || !strings.Contains(logs, "goroutine ") {
		t.Errorf("the policy's panic was not logged with its stack:\n%s", logs)
	}
}

// panicWhileStopping is the machine's clock, except that it panics when read as a stop
// releases the row of a handler still running (stopRunning): a stand-in for whatever may
// panic there (a service's clock, its slog handler on a warning, a dialect).
type panicWhileStopping struct{}

func (panicWhileStopping) Now() time.Time {
	pc := make([]uintptr, 64)
	frames := runtime.CallersFrames(pc[:runtime.Callers(2, pc)])
	for {
		f, more := frames.Next()
		if strings.Contains(f.Function, "stopRunning") {
			panic("the clock failed as the stop released the row")
		}
		if !more {
			return time.Now()
		}
	}
}

// TestAPanicAsAStopReleasesARunningRowLeavesTheProcessUp: when Shutdown stops a delivery
// whose handler still runs, the stop releases the row and leaves its result for the
// handler's goroutine. A panic in that release is recovered by the delivery's mailbox; the
// handler's goroutine, which runs outside it, once read the missing result through a nil
// pointer as the handler returned, and took the process down. The row stays in its table,
// leased, for the lease to run out.
func TestAPanicAsAStopReleasesARunningRowLeavesTheProcessUp(t *testing.T) {
	t.Parallel()
	h := newHarness(t, driverNamed(t, "sqlite"), rowactor.FormLease)
	b := h.broker(rowactor.WithClock(panicWhileStopping{}))
	started, returned := make(chan struct{}), make(chan struct{})
	h.subscribe(b, func(ctx context.Context, _ *rowactor.Delivery) rowactor.Outcome {
		close(started)
		<-ctx.Done()
		time.Sleep(50 * time.Millisecond) // returns after the stop released its row
		defer close(returned)
		return rowactor.Ack()
	})
	ids := h.publish(b, 1)
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = b.Shutdown(ctx) // the release panicked: the row is not reported released
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not return after Shutdown")
	}
	time.Sleep(200 * time.Millisecond) // the handler's goroutine reads the stop's result
	if r := h.row(ids[0]); !r.exists {
		t.Errorf("row %d is gone; want it left leased for its lease to run out", ids[0])
	}
}

// panickingHandler is a service's slog.Handler that panics on every record it is given.
type panickingHandler struct{ calls *atomic.Int64 }

func (panickingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (p panickingHandler) Handle(context.Context, slog.Record) error {
	p.calls.Add(1)
	panic("the logger's own bug")
}
func (p panickingHandler) WithAttrs([]slog.Attr) slog.Handler { return p }
func (p panickingHandler) WithGroup(string) slog.Handler      { return p }

// TestALoggerThatPanicsLeaksNothing: the service's slog handler is service code too. One
// that panics on every record, even while rowactor logs the panic of a WithOnSettled hook,
// costs the log lines and nothing else: every row is acked once, the process stays up,
// and Shutdown drains.
func TestALoggerThatPanicsLeaksNothing(t *testing.T) {
	t.Parallel()
	eachDriverAndForm(t, nil, func(t *testing.T, h *harness) {
		var logged atomic.Int64
		panickingHookLeaksNothing(t, h, 2, rowactor.WithLogger(slog.New(panickingHandler{&logged})))
		if logged.Load() < 2 {
			t.Errorf("the logger was given %d records; want the two hook panics at least", logged.Load())
		}
	})
}
