package rowactortest_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/sqlite"
	"github.com/rowactor/rowactor/rowactortest"
)

// The service's welcome queue as it runs in production: a group column for its
// dead-letter group, an error column, finished rows kept.
var (
	welcomes = rowactor.Table{Name: "welcomes", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until", Error: "error",
		ProcessedAt: "processed_at"}
	welcomeOptions = []rowactor.SubscribeOption{rowactor.MaxAttempts(2), rowactor.DeadLetterGroup("welcome-dead"),
		rowactor.RetryPolicy(func(int, error) time.Duration { return time.Hour })}
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A Worker runs the handler with the subscription's own options on the service's own
// table: the dead-letter group the kit's WorkTable cannot take, and the attempt cap,
// read in the row as it ended.
func TestWorkerRunsTheSubscriptionsOwnOptions(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	clock := rowactortest.NewClock()
	b := rowactortest.NewWithClock(t, clock, welcomes)
	w := rowactortest.Worker{Broker: b, Table: welcomes, Queue: "welcome", Handler: sendWelcome, Options: welcomeOptions}

	r := w.Work(ctx, t, []byte(`{"to":"a@example.com"}`))
	if r.Step != "ack" || r.Err != nil || r.Dead || r.Deleted || r.Row.State != rowactor.JobProcessed || r.Attempt != 1 {
		t.Fatalf("a good address: %v", r)
	}

	r = w.Work(ctx, t, []byte(`{"to":"bounce@example.com"}`))
	if r.Step != "retry_after" || !errors.Is(r.HandlerErr, errBounced) || r.Dead ||
		r.Row.State != rowactor.JobDelayed || r.Row.Group != "welcome" || r.Row.Attempt != 1 || r.Row.Error != "bounced" {
		t.Fatalf("a bounced address, first attempt: %v", r)
	}
	id := r.ID
	// The retry policy's hour, made due by the clock; the second attempt is the last.
	if msg := fails(t, func(tb testing.TB) { w.WorkRow(ctx, tb, id) }); !strings.Contains(msg, "delayed until") {
		t.Fatalf("WorkRow of a delayed row: %q", msg)
	}
	clock.Advance(time.Hour)
	r = w.WorkRow(ctx, t, id)
	if r.Step != "dead_letter" || !r.Dead || r.Deleted || r.Attempt != 2 || r.Row.Group != "welcome-dead" || r.Row.Error != "bounced" {
		t.Fatalf("a bounced address, second attempt: %v", r)
	}
	rowactortest.RequireNotPublished(t, b, welcomes, "welcome", nil)
	if ids := rowactortest.Published(t, b, welcomes, "welcome-dead", nil); len(ids) != 1 || ids[0] != id {
		t.Fatalf("the dead-letter group holds %v, want [%d]", ids, id)
	}
}

// settledBy runs handler on one row of table, published to queue, through a plain
// subscription with opts, and returns the settlement rowactor.WithOnSettled tells: what
// the kit's results must agree with.
func settledBy(t *testing.T, table rowactor.Table, queue string, handler rowactor.Handler, opts ...rowactor.SubscribeOption) rowactor.Settlement {
	t.Helper()
	ctx := testCtx(t)
	settled := make(chan rowactor.Settlement, 1)
	b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "plain.db"), rowactor.WithOnSettled(func(s rowactor.Settlement) {
		select {
		case settled <- s:
		default:
		}
	}), rowactor.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown(context.WithoutCancel(ctx))
	ddl, err := rowactor.Schema(b.Dialect(), table)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Dialect().(*sqlite.Dialect).DB().Exec(ddl); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Publish(ctx, table, queue, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Subscribe(ctx, table, queue, handler, opts...); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-settled:
		return s
	case <-ctx.Done():
		t.Fatal("no settlement")
	}
	return rowactor.Settlement{}
}

var errUnwanted = errors.New("unwanted")

// A cancel reads as the library tells it: a Cancel outcome and a Broker.Cancel of the row
// in work both end it as cancelled ("ack", outcome "cancel", the reason after
// CancelledPrefix; Broker.Cancel's handler error wraps ErrCancelled); a DeadLetter
// outcome moves the row to the subscription's dead letter ("dead_letter"), or drops it
// without one ("ack", outcome "dead_letter"). Each Step and Outcome is the one a plain
// subscription's WithOnSettled hook reports.
func TestWorkerReportsACancelAsTheLibraryDoes(t *testing.T) {
	t.Parallel()
	cancel := func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Cancel(errUnwanted) }
	deadLetter := func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.DeadLetter(errUnwanted) }
	brokerCancel := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if err := d.Broker().Cancel(ctx, welcomes, d.ID(), "not wanted"); err != nil && !errors.Is(err, context.Canceled) {
			return rowactor.Fail(err)
		}
		<-ctx.Done()
		return rowactor.Ack() // the row ends as cancelled whatever the handler returns
	}
	for _, c := range []struct {
		name    string
		handler rowactor.Handler
		opts    []rowactor.SubscribeOption
		step    string
		outcome string
		check   func(r rowactortest.Result) bool
	}{
		{"Cancel with a dead letter", cancel, welcomeOptions, "ack", "cancel", func(r rowactortest.Result) bool {
			return !r.Dead && r.Row.State == rowactor.JobCancelled && r.Row.Error == "cancelled: unwanted" && errors.Is(r.HandlerErr, errUnwanted)
		}},
		{"DeadLetter with a dead letter", deadLetter, welcomeOptions, "dead_letter", "dead_letter", func(r rowactortest.Result) bool {
			return r.Dead && r.Row.Group == "welcome-dead" && r.Row.Error == "unwanted" && errors.Is(r.HandlerErr, errUnwanted)
		}},
		{"DeadLetter without a dead letter", deadLetter, nil, "ack", "dead_letter", func(r rowactortest.Result) bool {
			return !r.Dead && r.Row.State == rowactor.JobProcessed && r.Row.Error == "unwanted"
		}},
		{"Broker.Cancel", brokerCancel, welcomeOptions, "ack", "cancel", func(r rowactortest.Result) bool {
			return !r.Dead && r.Row.State == rowactor.JobCancelled && r.Row.Error == "cancelled: not wanted" && errors.Is(r.HandlerErr, rowactor.ErrCancelled)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := rowactortest.Worker{Table: welcomes, Queue: "welcome", Handler: c.handler, Options: c.opts}.Work(testCtx(t), t, []byte("x"))
			if r.Step != c.step || r.Outcome.String() != c.outcome || r.Err != nil || r.Deleted || !c.check(r) {
				t.Fatalf("%v", r)
			}
			plain := settledBy(t, welcomes, "welcome", c.handler, c.opts...)
			if plain.Step != r.Step || plain.Outcome.String() != r.Outcome.String() {
				t.Fatalf("a plain subscription's hook reports step %s, outcome %s; the worker %s, %s", plain.Step, plain.Outcome, r.Step, r.Outcome)
			}
		})
	}
}

// A transactional subscription's handler writes with its row's Ack, and a failure rolls
// them back, as in production; the Broker's tables show it.
func TestWorkerRunsATransactionalSubscription(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	sent := rowactor.Table{Name: "sent", ID: "id", Payload: "payload", Attempt: "attempt", LockedUntil: "locked_until"}
	b := rowactortest.New(t, welcomes, sent)
	handler := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if d.Tx() == nil {
			return rowactor.Fail(errors.New("no transaction: the subscription is not transactional"))
		}
		if _, err := d.Broker().PublishTx(ctx, d.Tx(), sent, "", d.Payload()); err != nil {
			return rowactor.Fail(err)
		}
		return sendWelcome(ctx, d)
	}
	w := rowactortest.Worker{Broker: b, Table: welcomes, Queue: "welcome", Handler: handler,
		Options: append([]rowactor.SubscribeOption{rowactor.Transactional()}, welcomeOptions...)}
	if r := w.Work(ctx, t, []byte(`{"to":"a@example.com"}`)); r.Step != "ack" || r.Err != nil {
		t.Fatalf("a good address: %v", r)
	}
	rowactortest.RequirePublished(t, b, sent, "", rowactortest.Payload([]byte(`{"to":"a@example.com"}`)))
	if r := w.Work(ctx, t, []byte(`{"to":"bounce@example.com"}`)); r.Step != "retry_after" || r.Err != nil {
		t.Fatalf("a bounced address: %v", r)
	}
	rowactortest.RequireNotPublished(t, b, sent, "", rowactortest.Payload([]byte(`{"to":"bounce@example.com"}`)))
}

// The subscription's Timeout bounds the handler: its context ends, and what it returns
// then settles.
func TestWorkerAppliesTheSubscriptionsTimeout(t *testing.T) {
	t.Parallel()
	slow := func(ctx context.Context, _ *rowactor.Delivery) rowactor.Outcome {
		<-ctx.Done()
		return rowactor.Fail(context.Cause(ctx))
	}
	r := rowactortest.Worker{Table: welcomes, Queue: "welcome", Handler: slow,
		Options: []rowactor.SubscribeOption{rowactor.Timeout(100 * time.Millisecond)}}.Work(testCtx(t), t, []byte("x"))
	if r.Step != "retry_after" || !errors.Is(r.HandlerErr, context.DeadlineExceeded) || r.Row.State != rowactor.JobDelayed {
		t.Fatalf("%v", r)
	}
}

// outputRecorder is a testing.TB whose output is kept, to read what the kit logged.
type outputRecorder struct {
	testing.TB
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *outputRecorder) Output() io.Writer { return o }

func (o *outputRecorder) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *outputRecorder) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// The library's warnings go to t's log by default, to Worker.Logger when set, and on a
// Broker where that broker logs.
func TestWorkerLogs(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	bounce := []byte(`{"to":"bounce@example.com"}`)
	out := &outputRecorder{TB: t}
	rowactortest.Worker{Table: welcomes, Queue: "welcome", Handler: sendWelcome}.Work(ctx, out, bounce)
	if got := out.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "bounced") {
		t.Fatalf("t's log: %q", got)
	}

	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))
	quiet := &outputRecorder{TB: t}
	rowactortest.Worker{Table: welcomes, Queue: "welcome", Handler: sendWelcome, Logger: logger}.Work(ctx, quiet, bounce)
	mu.Lock()
	got := buf.String()
	mu.Unlock()
	if !strings.Contains(got, "level=WARN") || !strings.Contains(got, "bounced") || quiet.String() != "" {
		t.Fatalf("Logger: %q; t's log: %q", got, quiet.String())
	}

	var brokerLog bytes.Buffer
	b := rowactortest.NewWithConfig(t, rowactortest.Config{Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &brokerLog}, nil))}, welcomes)
	rowactortest.Worker{Broker: b, Table: welcomes, Queue: "welcome", Handler: sendWelcome}.Work(ctx, quiet, bounce)
	mu.Lock()
	got = brokerLog.String()
	mu.Unlock()
	if !strings.Contains(got, "level=WARN") || !strings.Contains(got, "bounced") || quiet.String() != "" {
		t.Fatalf("Broker's logger: %q; t's log: %q", got, quiet.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A worker that cannot run says why and what to do.
func TestWorkerRefusals(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := rowactortest.New(t, welcomes)
	foreign, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "foreign.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Shutdown(context.WithoutCancel(ctx))
	ok := rowactortest.Worker{Table: welcomes, Queue: "welcome", Handler: sendWelcome}
	with := func(f func(w *rowactortest.Worker)) rowactortest.Worker { w := ok; f(&w); return w }
	for _, c := range []struct {
		name string
		run  func(tb testing.TB)
		want string
	}{
		{"no handler", func(tb testing.TB) { with(func(w *rowactortest.Worker) { w.Handler = nil }).Work(ctx, tb, nil) }, "Worker.Handler is nil"},
		{"no table", func(tb testing.TB) {
			with(func(w *rowactortest.Worker) { w.Table = rowactor.Table{} }).Work(ctx, tb, nil)
		}, "Worker.Table is empty"},
		{"a broker the kit did not make", func(tb testing.TB) { with(func(w *rowactortest.Worker) { w.Broker = foreign }).Work(ctx, tb, nil) }, "rowactortest.New"},
		{"WorkRow without a broker", func(tb testing.TB) { ok.WorkRow(ctx, tb, 1) }, "set Worker.Broker"},
		{"WorkRow of a missing row", func(tb testing.TB) { with(func(w *rowactortest.Worker) { w.Broker = b }).WorkRow(ctx, tb, 999) }, "has no row 999"},
		{"a delayed publish", func(tb testing.TB) { ok.Work(ctx, tb, nil, rowactor.After(time.Hour)) }, "delayed until"},
	} {
		if msg := fails(t, c.run); !strings.Contains(msg, c.want) {
			t.Errorf("%s: failed with %q, want %q", c.name, msg, c.want)
		}
	}
	// The service's dead-letter group on the kit's WorkTable, which has no group column:
	// the library's own refusal, with its fix.
	onWorkTable := rowactortest.Worker{Table: rowactortest.WorkTable, Handler: sendWelcome, Options: welcomeOptions}
	if msg := fails(t, func(tb testing.TB) { onWorkTable.Work(ctx, tb, nil) }); !strings.Contains(msg, "Table.Group") {
		t.Errorf("a dead-letter group on a table without groups: %q", msg)
	}
	// Another due row of the queue would be taken too.
	for range 2 {
		if _, err := b.Publish(ctx, welcomes, "welcome", []byte(`{"to":"a@example.com"}`)); err != nil {
			t.Fatal(err)
		}
	}
	onB := with(func(w *rowactortest.Worker) { w.Broker = b })
	if msg := fails(t, func(tb testing.TB) { onB.WorkRow(ctx, tb, 1) }); !strings.Contains(msg, "rows [2]") {
		t.Errorf("WorkRow with another row due: %q", msg)
	}
	// A subscription of Broker's own to the queue would take the row.
	if _, err := b.Subscribe(ctx, welcomes, "welcome", sendWelcome); err != nil {
		t.Fatal(err)
	}
	if msg := fails(t, func(tb testing.TB) { onB.Work(ctx, tb, nil) }); !strings.Contains(msg, "Subscription.Pause") {
		t.Errorf("Broker subscribed to the queue: %q", msg)
	}
}

// A Retry returns the row to the queue due at once, and Work still runs the handler
// once: the row reads as the retry left it, not as a second delivery took it.
func TestWorkerRunsTheHandlerOnce(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := rowactortest.New(t, welcomes)
	var calls atomic.Int32
	retry := func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		calls.Add(1)
		return rowactor.Retry()
	}
	w := rowactortest.Worker{Broker: b, Table: welcomes, Queue: "welcome", Handler: retry}
	r := w.Work(ctx, t, []byte("x"))
	if r.Step != "retry" || r.Row.State != rowactor.JobDue || r.Row.Attempt != 1 || calls.Load() != 1 {
		t.Fatalf("%v; handler ran %d times", r, calls.Load())
	}
	r = w.WorkRow(ctx, t, r.ID)
	if r.Step != "retry" || r.Attempt != 2 || r.Row.State != rowactor.JobDue || r.Row.Attempt != 2 || calls.Load() != 2 {
		t.Fatalf("the second delivery: %v; handler ran %d times", r, calls.Load())
	}
}

// A handler's panic gives the row back unsettled: the step is "release", the panic is
// told, and the row is due again with the attempt its claim counted.
func TestWorkerReportsAPanic(t *testing.T) {
	t.Parallel()
	panics := func(context.Context, *rowactor.Delivery) rowactor.Outcome { panic("boom") }
	r := rowactortest.Worker{Table: welcomes, Queue: "welcome", Handler: panics}.Work(testCtx(t), t, []byte("x"))
	if r.Step != "release" || !r.Released || r.Panic != "boom" || r.Row.State != rowactor.JobDue || r.Deleted {
		t.Fatalf("%v (panic %v)", r, r.Panic)
	}
}
