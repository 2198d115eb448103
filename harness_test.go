package rowactor_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// driver plugs one database into the conformance suite. Adding a database means adding a
// driver (driver_<db>_test.go), not writing new tests.
type driver struct {
	name  string
	forms []rowactor.Form
	// waiterKeepsPlace says a statement waiting for a row another session holds gets it
	// before any later statement once that session ends (dialecttest.Caps.WaiterKeepsPlace).
	waiterKeepsPlace bool
	// notifies says the database wakes subscriptions in other processes (LISTEN/NOTIFY).
	notifies bool
	// open returns a new dialect on the test's database; every call within one test
	// reaches the same database (two brokers in one test share it).
	open func(t *testing.T) func() dialects.Dialect
	// exec runs a statement written with ? placeholders.
	exec func(t *testing.T, d dialects.Dialect, query string, args ...any)
	// state reads a row's columns by role; exists is false when the row is gone.
	state func(t *testing.T, d dialects.Dialect, table rowactor.Table, id int64) rowState
	// count runs a COUNT(*) query written with ? placeholders.
	count func(t *testing.T, d dialects.Dialect, query string, args ...any) int
	// sorts explains a query written with ? placeholders (after refreshing the table's
	// statistics) and reports whether its plan sorts rows rather than reading them in
	// an index's order, with the plan's text.
	sorts func(t *testing.T, d dialects.Dialect, table, query string, args ...any) (bool, string)
	// txExec runs a statement written with ? placeholders in a transaction rowactor lent.
	txExec func(ctx context.Context, tx any, query string, args ...any) error
	// begin opens a transaction of the type PublishTx takes; commit or roll it back.
	begin func(t *testing.T, d dialects.Dialect) (tx any, commit, rollback func() error)
	// keyLocked reports whether the database holds an advisory key for anybody; nil where
	// keys live in the process (SQLite).
	keyLocked func(t *testing.T, d dialects.Dialect, key string) bool
	// url returns what rowactor.Open takes to reach the dialect's database from another
	// process.
	url func(t *testing.T, d dialects.Dialect) string
	// timeValue renders a time as the driver binds it into a time column.
	timeValue func(time.Time) any
}

var drivers []driver

// rowState is a row as the suite checks it; times are nil when NULL.
type rowState struct {
	exists      bool
	attempt     int
	group       string
	lockedUntil *time.Time
	retryAfter  *time.Time
	processedAt *time.Time
	lastError   *string // the error column (Table.Error); nil when NULL or not described
}

var tableSeq atomic.Int64

// harness is one scenario's bundle: a table of its own, a broker, and what it saw.
type harness struct {
	t       *testing.T
	drv     driver
	newD    func() dialects.Dialect
	d       dialects.Dialect
	table   rowactor.Table
	queue   string
	logs    *syncBuffer
	settled chan rowactor.Settlement
	// tx runs the scenario's subscriptions in transactional mode (the outcome
	// conformance's third axis); sideTable takes the handlers' writes then.
	tx        bool
	sideTable rowactor.Table
}

// tableShape edits the description before its table is created.
type tableShape func(*rowactor.Table)

func withProcessedAt(t *rowactor.Table)   { t.ProcessedAt = "processed_at" }
func withoutRetryAfter(t *rowactor.Table) { t.RetryAfter = "" }
func withoutGroup(t *rowactor.Table)      { t.Group = "" }
func withError(t *rowactor.Table)         { t.Error = "last_error" }

func newHarness(t *testing.T, drv driver, form rowactor.Form, shapes ...tableShape) *harness {
	t.Helper()
	h := &harness{t: t, drv: drv, newD: drv.open(t), logs: &syncBuffer{}, settled: make(chan rowactor.Settlement, 1024), queue: "q"}
	h.d = h.newD()
	name := fmt.Sprintf("ra_%s_%d_%d", form, time.Now().UnixNano()%1e6, tableSeq.Add(1))
	h.table = rowactor.Table{
		Name: name, ID: "id", Payload: "payload", Group: "grp", Attempt: "attempt",
		RetryAfter: "retry_after", Headers: "headers",
	}
	switch form {
	case rowactor.FormLease:
		h.table.LockedUntil = "locked_until"
	case rowactor.FormAdvisory:
		h.table.AdvisoryKey = name + "-{id}"
	}
	for _, s := range shapes {
		s(&h.table)
	}
	h.createTable(h.table)
	return h
}

func (h *harness) createTable(t rowactor.Table) {
	h.t.Helper()
	ddl, err := rowactor.Schema(h.d, t)
	if err != nil {
		h.t.Fatalf("Schema: %v", err)
	}
	for _, stmt := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(stmt) != "" {
			h.drv.exec(h.t, h.d, stmt)
		}
	}
}

// broker starts a broker on the harness's dialect whose settlements reach h.settled;
// Shutdown runs at cleanup.
func (h *harness) broker(opts ...rowactor.Option) *rowactor.Broker {
	h.t.Helper()
	return h.brokerOn(h.d, opts...)
}

// second returns a broker on a dialect of its own over the same database: another process,
// as far as the table can tell.
func (h *harness) second(opts ...rowactor.Option) *rowactor.Broker {
	h.t.Helper()
	return h.brokerOn(h.newD(), opts...)
}

func (h *harness) brokerOn(d dialects.Dialect, opts ...rowactor.Option) *rowactor.Broker {
	h.t.Helper()
	log := slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: debugLevel()}))
	opts = append([]rowactor.Option{rowactor.WithLogger(log), rowactor.WithOnSettled(func(s rowactor.Settlement) { h.settled <- s })}, opts...)
	b, err := rowactor.New(d, opts...)
	if err != nil {
		h.t.Fatalf("New: %v", err)
	}
	shutdownAtCleanup(h.t, b)
	return b
}

// shutdownAtCleanup shuts b down when the test ends, allowing it 10 s.
func shutdownAtCleanup(t testing.TB, b *rowactor.Broker) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = b.Shutdown(ctx)
	})
}

func (h *harness) subscribe(b *rowactor.Broker, fn rowactor.Handler, opts ...rowactor.SubscribeOption) *rowactor.Subscription {
	h.t.Helper()
	opts = append([]rowactor.SubscribeOption{rowactor.PollInterval(50 * time.Millisecond)}, opts...)
	if h.tx {
		opts = append(opts, rowactor.Transactional())
	}
	s, err := b.Subscribe(context.Background(), h.table, h.queue, fn, opts...)
	if err != nil {
		h.t.Fatalf("Subscribe: %v", err)
	}
	return s
}

func (h *harness) publish(b *rowactor.Broker, n int) []int64 {
	h.t.Helper()
	ids := make([]int64, n)
	for i := range ids {
		id, err := b.Publish(context.Background(), h.table, h.queue, []byte(fmt.Sprintf("job-%d", i)))
		if err != nil {
			h.t.Fatalf("Publish: %v", err)
		}
		ids[i] = id
	}
	return ids
}

// eachDriverAndForm runs fn, in parallel, over every (database, form) with a harness of
// its own, the forms limited to forms unless it is nil.
func eachDriverAndForm(t *testing.T, forms []rowactor.Form, fn func(t *testing.T, h *harness)) {
	for _, drv := range drivers {
		for _, form := range drv.forms {
			if forms != nil && !slices.Contains(forms, form) {
				continue
			}
			t.Run(fmt.Sprintf("%s/%s", drv.name, form), func(t *testing.T) {
				t.Parallel()
				fn(t, newHarness(t, drv, form))
			})
		}
	}
}

// waitSettled waits for n settlements and returns them; it fails the test after 15 s.
func (h *harness) waitSettled(n int) []rowactor.Settlement {
	h.t.Helper()
	return h.waitSettledWithin(n, 15*time.Second)
}

// waitSettledWithin waits for n settlements and returns them; it fails the test after d.
func (h *harness) waitSettledWithin(n int, d time.Duration) []rowactor.Settlement {
	h.t.Helper()
	var got []rowactor.Settlement
	deadline := time.After(d)
	for len(got) < n {
		select {
		case s := <-h.settled:
			got = append(got, s)
		case <-deadline:
			h.t.Fatalf("waited for %d settlements, saw %d: %+v\nlogs:\n%s", n, len(got), got, h.logs.String())
		}
	}
	return got
}

// waitDeliveries waits for n settlements of one row's successive deliveries and returns
// them by attempt: a settlement that freed the row (a retry, a release) may be reported
// after the redelivery it made possible.
func (h *harness) waitDeliveries(n int) []rowactor.Settlement {
	h.t.Helper()
	got := h.waitSettled(n)
	slices.SortStableFunc(got, func(a, b rowactor.Settlement) int { return cmp.Compare(a.Attempt, b.Attempt) })
	return got
}

// quiet asserts that no settlement arrives for d.
func (h *harness) quiet(d time.Duration) {
	h.t.Helper()
	select {
	case s := <-h.settled:
		h.t.Fatalf("unexpected settlement %+v", s)
	case <-time.After(d):
	}
}

func (h *harness) row(id int64) rowState {
	h.t.Helper()
	return h.drv.state(h.t, h.d, h.table, id)
}

func (h *harness) exec(query string, args ...any) {
	h.t.Helper()
	h.drv.exec(h.t, h.d, query, args...)
}

// calls records handler calls safely.
type calls struct {
	mu       sync.Mutex
	attempts map[int64][]int
	n        atomic.Int64
}

func newCalls() *calls { return &calls{attempts: map[int64][]int{}} }

func (c *calls) add(d *rowactor.Delivery) {
	c.mu.Lock()
	c.attempts[d.ID()] = append(c.attempts[d.ID()], d.Attempt())
	c.mu.Unlock()
	c.n.Add(1)
}

func (c *calls) of(id int64) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.attempts[id]...)
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func within(t *testing.T, got *time.Time, want time.Time, slack time.Duration) {
	t.Helper()
	if got == nil {
		t.Fatalf("time is NULL, want about %v", want)
	}
	if d := got.Sub(want); d < -slack || d > slack {
		t.Fatalf("time %v, want %v ± %v", got, want, slack)
	}
}

// driverNamed returns the driver of one database, for tests of its own behaviour.
func driverNamed(t *testing.T, name string) driver {
	t.Helper()
	for _, d := range drivers {
		if d.name == name {
			return d
		}
	}
	t.Fatalf("no %s driver in the matrix", name)
	return driver{}
}

func debugLevel() slog.Level {
	if os.Getenv("RA_TEST_DEBUG") != "" {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// receiveN receives n values from ch, failing the test if they take longer than d
// together; what names one value in the failure.
func receiveN[T any](t *testing.T, ch <-chan T, n int, d time.Duration, what string) {
	t.Helper()
	deadline := time.After(d)
	for i := range n {
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%d of %d: no %s within %v", i, n, what, d)
		}
	}
}
