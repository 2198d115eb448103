// Package rowactortest helps a service test the code around its queues: a broker on a
// temporary SQLite file in one line, assertions on what was published, and a service's
// handler run on one row, synchronously, with what became of the row.
//
// Everything runs on the real library and a real database (SQLite, embedded): a test
// sees the statements the service will run, not a stand-in. A Clock the test moves
// forward (NewWithClock) makes a RetryAfter, a Snooze, a delayed publish or a periodic
// job's next run due without waiting for it.
//
// A Worker runs a handler as the service subscribes it: on the service's own table and
// queue, with its own subscription options (dead letters, MaxAttempts, Transactional,
// Timeout…). Its Result is the library's Settlement (the outcome, and the statement that
// ran in WithOnSettled's words) and the row as it ended:
//
//	w := rowactortest.Worker{Broker: b, Table: emails, Queue: "welcome", Handler: sendWelcome,
//		Options: []rowactor.SubscribeOption{rowactor.MaxAttempts(2), rowactor.DeadLetterGroup("welcome-dead")}}
//	r := w.Work(ctx, t, payload)
//	if r.Step != "retry_after" || r.Row.Error != "bounced" { t.Fatalf("%v", r) }
//
// The library's warnings go to t's log (shown with a failing test, or with -v) unless
// Config.Logger or Worker.Logger names another logger. ExampleWorker is a whole test.
package rowactortest

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// New returns a broker on a SQLite file in t's temporary directory, with each of tables
// created as rowactor.Schema renders it. The broker is shut down when t ends. It logs
// warnings and errors to t's log (NewWithConfig takes another logger).
func New(t testing.TB, tables ...rowactor.Table) *rowactor.Broker {
	t.Helper()
	return NewWithConfig(t, Config{}, tables...)
}

// NewWithClock is New with a broker that goes by c (rowactor.WithClock): c.Advance makes
// what was due later due now, and the broker's subscriptions and periodic jobs act on it
// at once.
func NewWithClock(t testing.TB, c *Clock, tables ...rowactor.Table) *rowactor.Broker {
	t.Helper()
	if c == nil {
		t.Fatal("rowactortest: NewWithClock needs a clock: rowactortest.NewClock()")
	}
	return NewWithConfig(t, Config{Clock: c}, tables...)
}

// Config is what NewWithConfig makes a broker with. The zero Config makes New's.
type Config struct {
	// Clock is the broker's clock (rowactor.WithClock), which the test moves forward.
	// Defaults to the machine's time.
	Clock *Clock
	// Logger receives rowactor's logs. Defaults to warnings and errors written to t's
	// log, where go test shows them with a failing test, or with -v, beside the test
	// that caused them; slog.New(slog.DiscardHandler) silences them.
	Logger *slog.Logger
}

// NewWithConfig is New with a broker made as c says.
func NewWithConfig(t testing.TB, c Config, tables ...rowactor.Table) *rowactor.Broker {
	t.Helper()
	if c.Logger == nil {
		c.Logger = testLogger(t) // before the Shutdown cleanup below, so it ends after it
	}
	url := "sqlite:" + filepath.Join(t.TempDir(), "rowactortest.db")
	b := openBroker(context.Background(), t, url, c, nil)
	made.Store(b, madeBroker{url: url, config: c})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := b.Shutdown(ctx); err != nil {
			t.Errorf("rowactortest: Shutdown: %v", err)
		}
		made.Delete(b)
	})
	for _, tb := range tables {
		create(t, b, tb)
	}
	return b
}

// made holds how the kit made each broker of New's, until it is shut down: a Worker
// given one opens a broker of its own on the same database, by the same clock.
var made sync.Map // *rowactor.Broker → madeBroker

type madeBroker struct {
	url    string
	config Config
}

// openBroker opens a broker on url as c says, telling its settlements to onSettled.
func openBroker(ctx context.Context, t testing.TB, url string, c Config, onSettled func(rowactor.Settlement)) *rowactor.Broker {
	t.Helper()
	opts := []rowactor.Option{rowactor.WithLogger(c.Logger)}
	if onSettled != nil {
		opts = append(opts, rowactor.WithOnSettled(onSettled))
	}
	if c.Clock != nil {
		opts = append(opts, rowactor.WithClock(c.Clock))
	}
	b, err := rowactor.Open(ctx, url, opts...)
	if err != nil {
		t.Fatalf("rowactortest: open a SQLite broker: %v", err)
	}
	return b
}

// create creates tb on b's SQLite file.
func create(t testing.TB, b *rowactor.Broker, tb rowactor.Table) {
	t.Helper()
	ddl, err := rowactor.Schema(b.Dialect(), tb)
	if err != nil {
		t.Fatalf("rowactortest: Schema of table %s: %v", tb.Name, err)
	}
	for _, stmt := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := db(t, b).Exec(stmt); err != nil {
			t.Fatalf("rowactortest: create table %s: %v", tb.Name, err)
		}
	}
}

// db is the SQLite database of a broker New made.
func db(t testing.TB, b *rowactor.Broker) *sql.DB {
	t.Helper()
	return dialectOf(t, b).DB()
}

// dialectOf is the SQLite dialect of a broker New made.
func dialectOf(t testing.TB, b *rowactor.Broker) *sqlite.Dialect {
	t.Helper()
	d, ok := b.Dialect().(*sqlite.Dialect)
	if !ok {
		t.Fatalf("rowactortest: the broker is on %s; the kit reads brokers New made (SQLite)", b.Dialect().Name())
	}
	return d
}

// Published lists the ids of the rows of table queued for queue (its group, in a table
// with groups; processed rows left out) whose payload match accepts, in id order. A nil
// match accepts every row.
func Published(t testing.TB, b *rowactor.Broker, table rowactor.Table, queue string, match func(payload []byte) bool) []int64 {
	t.Helper()
	text, args := dialectOf(t, b).QueuedStatement(table, queue)
	rows, err := db(t, b).Query(text, args...)
	if err != nil {
		t.Fatalf("rowactortest: read table %s: %v", table.Name, err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var (
			id      int64
			payload []byte
		)
		if err := rows.Scan(&id, &payload); err != nil {
			t.Fatalf("rowactortest: read table %s: %v", table.Name, err)
		}
		if match == nil || match(payload) {
			ids = append(ids, id)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("rowactortest: read table %s: %v", table.Name, err)
	}
	return ids
}

// RequirePublished fails t unless exactly one row of table queued for queue has a payload
// match accepts, and returns its id.
func RequirePublished(t testing.TB, b *rowactor.Broker, table rowactor.Table, queue string, match func(payload []byte) bool) int64 {
	t.Helper()
	ids := Published(t, b, table, queue, match)
	if len(ids) != 1 {
		t.Fatalf("rowactortest: %d rows of table %s queued for %q match, want 1 (ids %v)", len(ids), table.Name, queue, ids)
	}
	return ids[0]
}

// RequireNotPublished fails t if a row of table queued for queue has a payload match
// accepts.
func RequireNotPublished(t testing.TB, b *rowactor.Broker, table rowactor.Table, queue string, match func(payload []byte) bool) {
	t.Helper()
	if ids := Published(t, b, table, queue, match); len(ids) > 0 {
		t.Fatalf("rowactortest: rows %v of table %s queued for %q match, want none", ids, table.Name, queue)
	}
}

// Payload is a match for Published and its Require functions: payloads equal to p.
func Payload(p []byte) func([]byte) bool { return func(got []byte) bool { return bytes.Equal(got, p) } }

// Work runs handler on one delivery of payload, as a subscription would in the lease form,
// on WorkTable in a SQLite file of its own, and returns what became of it once it
// settled: the outcome the handler returned, the statement that ran (Step) and its
// error. opts are the subscription's (Timeout, MaxAttempts…); Workers is 1. It fails t if
// no settlement comes before ctx ends.
//
// To run the handler on the service's own table, queue and options, and read the row as
// it ended, use a Worker.
func Work(ctx context.Context, t testing.TB, handler rowactor.Handler, payload []byte, opts ...rowactor.SubscribeOption) rowactor.Settlement {
	t.Helper()
	return Worker{Table: WorkTable, Handler: handler, Options: opts}.Work(ctx, t, payload).Settlement
}

// WorkTable is the table Work runs a delivery from: the lease form with every column a
// handler's outcome can write.
var WorkTable = rowactor.Table{Name: "rowactortest_work", ID: "id", Payload: "payload", Attempt: "attempt",
	RetryAfter: "retry_after", LockedUntil: "locked_until", Headers: "headers", Error: "error"}

// Clock is a clock a test moves forward: it runs with the machine's time, ahead of it by
// what Advance added. It is a rowactor.Clock that tells its jumps. Its zero value is a
// clock at the machine's time, as NewClock's.
type Clock struct {
	mu     sync.Mutex
	ahead  time.Duration
	jumped chan struct{}
}

// NewClock returns a clock at the machine's time.
func NewClock() *Clock { return &Clock{jumped: make(chan struct{})} }

// Now is the machine's time plus what Advance added.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.ahead)
}

// Advance moves the clock forward by d (back, for a negative d) and tells the brokers
// going by it, which claim and look for periodic runs at once.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ahead += d
	if c.jumped != nil {
		close(c.jumped)
	}
	c.jumped = make(chan struct{})
}

// Advanced returns a channel closed at the clock's next Advance.
func (c *Clock) Advanced() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.jumped == nil { // the zero value
		c.jumped = make(chan struct{})
	}
	return c.jumped
}
