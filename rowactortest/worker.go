package rowactortest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// Worker runs a service's handler on one row as the service's subscription runs it: on
// the service's own table and queue, with the options the service passes to Subscribe
// (MaxAttempts, DeadLetterGroup, Transactional, Timeout, RetryPolicy, OnEvent…). A test
// so exercises the configuration that runs in production, and reads what became of the
// row in the words the library uses elsewhere.
//
//	w := rowactortest.Worker{Table: emails, Queue: "welcome", Handler: sendWelcome,
//		Options: []rowactor.SubscribeOption{rowactor.MaxAttempts(3), rowactor.DeadLetterGroup("welcome-dead")}}
//	r := w.Work(ctx, t, payload)
//
// Its zero value is not usable: Table, Handler, and Queue for a table with groups, are
// required. The rest default as each field says.
type Worker struct {
	// Table is the service's table description. The worker's broker creates it as
	// rowactor.Schema renders it when its database has no such table; a table the test
	// made is used as it is.
	Table rowactor.Table
	// Queue is the queue the service subscribes: its group, in a table with groups.
	Queue string
	// Handler is the service's handler.
	Handler rowactor.Handler
	// Options are the service's subscription options, as it passes them to Subscribe. A
	// subscription that refuses them fails the test with the library's *ConfigError.
	// Work adds Workers(1) and Prefetch(0) after them: it works one row.
	Options []rowactor.SubscribeOption
	// Broker, when set, is a broker New, NewWithClock or NewWithConfig made. The worker
	// then works in its database, which the test can fill before and read after, by its
	// clock, and WorkRow works a row already there. The worker still runs its own broker
	// on that database, shut down once the work is done, so that no subscription stays
	// behind: Broker must not have a subscription of its own to the queue running, which
	// would take the row. Defaults to a new SQLite file of the worker's own.
	Broker *rowactor.Broker
	// Tables are more tables to create, as New does, before the row is worked: a
	// dead-letter table (DeadLetterTable), a table the handler publishes to.
	Tables []rowactor.Table
	// Logger receives the logs of the worker's broker. Defaults to Broker's logger, or
	// without Broker to warnings and errors in t's log, as New's brokers log.
	Logger *slog.Logger
}

// Result is what became of the row a Worker worked.
type Result struct {
	// Settlement is the library's report of the delivery, as rowactor.WithOnSettled
	// tells it: the outcome the handler returned, the statement that ran (Step: "ack",
	// "retry_after", "dead_letter", "release"…), the statement's error (Err) and the
	// handler's (HandlerErr). A DeadLetter outcome runs "dead_letter" when the
	// subscription has a dead letter, else "ack", which drops the row; its Outcome reads
	// "dead_letter". A Cancel outcome and a Broker.Cancel of the row in work both run
	// "ack", with Outcome "cancel" (Broker.Cancel's HandlerErr wraps
	// rowactor.ErrCancelled). Attempt is the delivery's attempt: 1 for the first.
	// Broker is the worker's own, shut down once Work returns.
	rowactor.Settlement
	// Row is the row as it ended, as Broker.Inspect reads it once the settlement is
	// told: its group (a dead-letter group's, once moved there), state (processed,
	// delayed, due), attempts made (the calls so far, as handlers read them), error
	// column and payload. It is zero when Deleted.
	Row rowactor.Job
	// Deleted reports a row no longer in the table: deleted by an ack, a drop or a
	// cancel, or moved to a dead-letter table (Dead too).
	Deleted bool
	// Dead reports a row moved to its dead letter: the step "dead_letter" took effect.
	Dead bool
}

// String tells the result in a line, for a test's failure message.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "row %d, attempt %d: outcome %s, step %s", r.ID, r.Attempt, r.Outcome, r.Step)
	if r.HandlerErr != nil {
		fmt.Fprintf(&b, " (handler error %q)", r.HandlerErr.Error())
	}
	if r.Err != nil {
		fmt.Fprintf(&b, ", settlement error: %v", r.Err)
	}
	switch {
	case r.Deleted && r.Dead:
		b.WriteString("; moved to its dead-letter table")
	case r.Deleted:
		b.WriteString("; deleted")
	default:
		fmt.Fprintf(&b, "; now %s, %d attempts made", r.Row.State, r.Row.Attempt)
		if r.Row.Group != "" {
			fmt.Fprintf(&b, ", group %q", r.Row.Group)
		}
		if r.Row.Error != "" {
			fmt.Fprintf(&b, ", error column %q", r.Row.Error)
		}
	}
	return b.String()
}

// Work publishes payload to the worker's queue with opts, runs the handler on its
// delivery as the service's subscription would, and returns what became of the row once
// it settled. It fails t if the row is not due (an After option), if another row of the
// queue is due (on a Broker: the subscription would take it too), or if no settlement
// comes before ctx ends.
func (w Worker) Work(ctx context.Context, t testing.TB, payload []byte, opts ...rowactor.PublishOption) Result {
	t.Helper()
	b, h, done := w.open(ctx, t)
	defer done()
	id, err := b.Publish(ctx, w.Table, w.Queue, payload, opts...)
	if err != nil {
		t.Fatalf("rowactortest: publish to %s: %v", w.Table.Name, err)
	}
	return w.work(ctx, t, b, h, id)
}

// WorkRow runs the handler on row id of the worker's table, already in Broker's database
// (published by the service's own code, or left by an earlier Work: a retry made due by
// Clock.Advance), and returns what became of it. It needs Broker, and fails t as Work
// does, and if the row is missing, finished, in work or in another queue.
func (w Worker) WorkRow(ctx context.Context, t testing.TB, id int64) Result {
	t.Helper()
	if w.Broker == nil {
		t.Fatalf("rowactortest: WorkRow works a row already in a database: set Worker.Broker to the broker (made by rowactortest.New) whose table holds row %d", id)
	}
	b, h, done := w.open(ctx, t)
	defer done()
	return w.work(ctx, t, b, h, id)
}

// open checks the worker and opens its broker: on the database and by the clock of
// Broker when set, else on a new SQLite file. It returns the broker with the worker's
// tables created, the hub that tells its settlements, and its shutdown.
func (w Worker) open(ctx context.Context, t testing.TB) (*rowactor.Broker, *hub, func()) {
	t.Helper()
	switch {
	case w.Handler == nil:
		t.Fatalf("rowactortest: Worker.Handler is nil: set it to the service's handler")
	case w.Table.Name == "":
		t.Fatalf("rowactortest: Worker.Table is empty: set it to the service's table description")
	}
	url, c := w.database(t)
	if w.Logger != nil {
		c.Logger = w.Logger
	}
	if c.Logger == nil {
		c.Logger = testLogger(t)
	}
	h := &hub{waiters: map[rowKey]chan rowactor.Settlement{}}
	b := openBroker(ctx, t, url, c, h.settled)
	done := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = b.Shutdown(sctx)
	}
	created := false
	defer func() {
		if !created { // t failed creating a table: the broker would outlive the test
			done()
		}
	}()
	for _, tb := range append([]rowactor.Table{w.Table}, w.Tables...) {
		create(t, b, tb)
	}
	created = true
	return b, h, done
}

// database is the URL and the config of the worker's broker: Broker's, or a new SQLite
// file's. It fails t when Broker was not made by the kit, or has a subscription that
// would compete with the worker's for the row.
func (w Worker) database(t testing.TB) (string, Config) {
	t.Helper()
	if w.Broker == nil {
		return "sqlite:" + filepath.Join(t.TempDir(), "work.db"), Config{}
	}
	m, ok := made.Load(w.Broker)
	if !ok {
		t.Fatalf("rowactortest: Worker.Broker was not made by the kit, which opens the worker's broker on its database: make it with rowactortest.New, NewWithClock or NewWithConfig")
	}
	for _, s := range w.Broker.Subscriptions() {
		if s.Table().Name == w.Table.Name && (w.Table.Group == "" || s.Queue() == w.Queue) && !s.Paused() {
			t.Fatalf("rowactortest: Worker.Broker has a subscription to queue %q of %s, which would take the worker's row: pause it (Subscription.Pause) while the worker works", s.Queue(), w.Table.Name)
		}
	}
	return m.(madeBroker).url, m.(madeBroker).config
}

// work runs the handler on row id of b and returns what became of it.
func (w Worker) work(ctx context.Context, t testing.TB, b *rowactor.Broker, h *hub, id int64) Result {
	t.Helper()
	w.requireDue(ctx, t, b, id)
	w.requireNoOtherDue(ctx, t, b, id)
	settled, stopWaiting := h.wait(w.Table.Name, id)
	defer stopWaiting()
	run := &oneRow{id: id, handler: w.Handler, ready: make(chan struct{}), stray: make(chan int64, 1)}
	opts := append(slices.Clone(w.Options), rowactor.Workers(1), rowactor.Prefetch(0))
	sub, err := b.Subscribe(ctx, w.Table, w.Queue, run.handle, opts...)
	if err != nil {
		t.Fatalf("rowactortest: subscribe to %s with the worker's options: %v", w.Table.Name, err)
	}
	run.sub = sub
	close(run.ready)
	select {
	case s := <-settled:
		return w.result(ctx, t, b, s)
	case other := <-run.stray:
		t.Fatalf("rowactortest: the subscription delivered row %d of %s too, which came due while row %d was worked: Work runs one row; keep the queue's other rows delayed or in another queue", other, w.Table.Name, id)
	case <-ctx.Done():
		t.Fatalf("rowactortest: row %d of %s did not settle before the context ended: %v", id, w.Table.Name, ctx.Err())
	}
	return Result{}
}

// result reads the row s settled and tells what became of it.
func (w Worker) result(ctx context.Context, t testing.TB, b *rowactor.Broker, s rowactor.Settlement) Result {
	t.Helper()
	r := Result{Settlement: s, Dead: s.Step == "dead_letter" && s.Err == nil}
	job, err := b.Inspect(ctx, w.Table, s.ID)
	switch {
	case errors.Is(err, rowactor.ErrNotFound):
		r.Deleted = true
	case err != nil:
		t.Fatalf("rowactortest: read row %d of %s after its settlement (%s): %v", s.ID, w.Table.Name, s.Step, err)
	default:
		r.Row = job
	}
	return r
}

// requireDue fails t unless row id of the worker's queue is due: a subscription would
// never deliver it otherwise.
func (w Worker) requireDue(ctx context.Context, t testing.TB, b *rowactor.Broker, id int64) {
	t.Helper()
	job, err := b.Inspect(ctx, w.Table, id)
	switch {
	case errors.Is(err, rowactor.ErrNotFound):
		t.Fatalf("rowactortest: table %s has no row %d", w.Table.Name, id)
	case err != nil:
		t.Fatalf("rowactortest: read row %d of %s: %v", id, w.Table.Name, err)
	case w.Table.Group != "" && job.Group != w.Queue:
		t.Fatalf("rowactortest: row %d of %s is in queue %q, and the worker subscribes %q", id, w.Table.Name, job.Group, w.Queue)
	case job.State == rowactor.JobDelayed:
		t.Fatalf("rowactortest: row %d of %s is delayed until %s: move the broker's clock past it (NewWithClock, Clock.Advance), or make it due with Broker.RetryNow",
			id, w.Table.Name, job.RetryAfter.Format(time.RFC3339Nano))
	case job.State != rowactor.JobDue:
		t.Fatalf("rowactortest: row %d of %s is %s, not due", id, w.Table.Name, job.State)
	}
}

// requireNoOtherDue fails t if a row of the worker's queue other than id is due: the
// subscription would deliver it too.
func (w Worker) requireNoOtherDue(ctx context.Context, t testing.TB, b *rowactor.Broker, id int64) {
	t.Helper()
	var due []int64
	for _, other := range Published(t, b, w.Table, w.Queue, nil) {
		if other == id {
			continue
		}
		job, err := b.Inspect(ctx, w.Table, other)
		if err == nil && job.State == rowactor.JobDue {
			due = append(due, other)
		}
	}
	if len(due) > 0 {
		t.Fatalf("rowactortest: rows %v of %s are due in queue %q besides row %d, and the worker's subscription would take them too: work them first, one at a time with WorkRow",
			due, w.Table.Name, w.Queue, id)
	}
}

// oneRow is the handler Work subscribes: it stops the subscription's claims as its row
// is delivered, so that nothing else is claimed (not even the row again, after a Retry),
// and runs the service's handler on that row only.
type oneRow struct {
	id      int64
	handler rowactor.Handler
	sub     *rowactor.Subscription
	ready   chan struct{} // closed once sub is set
	stray   chan int64
}

func (o *oneRow) handle(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
	<-o.ready
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	_ = o.sub.Pause(pctx) // an error is a subscription already stopping: it claims nothing more
	cancel()
	if d.ID() != o.id {
		select {
		case o.stray <- d.ID():
		default:
		}
		return rowactor.Outcome{} // released unsettled: the test fails on it
	}
	return o.handler(ctx, d)
}
