// Package rowactortest helps a service test the code around its queues: a broker on a
// temporary SQLite file in one line, assertions on what was published, and a handler run
// on one delivery, synchronously, with what its outcome settled.
//
// Everything runs on the real library and a real database (SQLite, embedded): a test
// sees the statements the service will run, not a stand-in. A Clock the test moves
// forward (NewWithClock) makes a RetryAfter, a Snooze, a delayed publish or a periodic
// job's next run due without waiting for it.
package rowactortest

import (
	"bytes"
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// New returns a broker on a SQLite file in t's temporary directory, with each of tables
// created as rowactor.Schema renders it. The broker is shut down when t ends.
func New(t testing.TB, tables ...rowactor.Table) *rowactor.Broker {
	t.Helper()
	return newBroker(t, nil, tables)
}

// NewWithClock is New with a broker that goes by c (rowactor.WithClock): c.Advance makes
// what was due later due now, and the broker's subscriptions and periodic jobs act on it
// at once.
func NewWithClock(t testing.TB, c *Clock, tables ...rowactor.Table) *rowactor.Broker {
	t.Helper()
	if c == nil {
		t.Fatal("rowactortest: NewWithClock needs a clock: rowactortest.NewClock()")
	}
	return newBroker(t, []rowactor.Option{rowactor.WithClock(c)}, tables)
}

func newBroker(t testing.TB, opts []rowactor.Option, tables []rowactor.Table) *rowactor.Broker {
	t.Helper()
	b, err := rowactor.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "rowactortest.db"), opts...)
	if err != nil {
		t.Fatalf("rowactortest: open a SQLite broker: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := b.Shutdown(ctx); err != nil {
			t.Errorf("rowactortest: Shutdown: %v", err)
		}
	})
	for _, tb := range tables {
		create(t, b, tb)
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
	d, ok := b.Dialect().(*sqlite.Dialect)
	if !ok {
		t.Fatalf("rowactortest: the broker is on %s; the kit reads brokers New made (SQLite)", b.Dialect().Name())
	}
	return d.DB()
}

// Published lists the ids of the rows of table queued for queue (its group, in a table
// with groups; processed rows left out) whose payload match accepts, in id order. A nil
// match accepts every row.
func Published(t testing.TB, b *rowactor.Broker, table rowactor.Table, queue string, match func(payload []byte) bool) []int64 {
	t.Helper()
	q := "SELECT " + quote(table.ID) + ", " + quote(table.Payload) + " FROM " + quote(table.Name) + " WHERE 1 = 1"
	var args []any
	if table.Group != "" {
		q += " AND " + quote(table.Group) + " = ?"
		args = append(args, queue)
	}
	if table.ProcessedAt != "" {
		q += " AND " + quote(table.ProcessedAt) + " IS NULL"
	}
	rows, err := db(t, b).Query(q+" ORDER BY "+quote(table.ID), args...)
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
// on a table of its own in a SQLite file of its own, and returns what became of it once
// it settled: the outcome the handler returned, the statement that ran (Step) and its
// error. opts are the subscription's (Timeout, MaxAttempts…); Workers is 1. It fails t if
// no settlement comes before ctx ends.
func Work(ctx context.Context, t testing.TB, handler rowactor.Handler, payload []byte, opts ...rowactor.SubscribeOption) rowactor.Settlement {
	t.Helper()
	settled := make(chan rowactor.Settlement, 1)
	b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "work.db"), rowactor.WithOnSettled(func(s rowactor.Settlement) {
		select {
		case settled <- s:
		default:
		}
	}))
	if err != nil {
		t.Fatalf("rowactortest: open a SQLite broker: %v", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = b.Shutdown(sctx)
	}()
	tb := WorkTable
	create(t, b, tb)
	if _, err := b.Publish(ctx, tb, "", payload); err != nil {
		t.Fatalf("rowactortest: publish: %v", err)
	}
	if _, err := b.Subscribe(ctx, tb, "", handler, append(opts, rowactor.Workers(1))...); err != nil {
		t.Fatalf("rowactortest: subscribe: %v", err)
	}
	select {
	case s := <-settled:
		return s
	case <-ctx.Done():
		t.Fatalf("rowactortest: no settlement before the context ended: %v", ctx.Err())
	}
	return rowactor.Settlement{}
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

// quote quotes a SQLite identifier.
func quote(ident string) string { return `"` + strings.ReplaceAll(ident, `"`, `""`) + `"` }
