package dialecttest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var ctx = context.Background()

// T0 is the suite's "now", whole seconds plus a fraction finer than a microsecond: tokens
// must still match once the database has stored them to the microsecond (PostgreSQL and
// MySQL's DATETIME(6) keep microseconds; SQLite's TimeLayout text too). The dialects'
// own tests use it as well.
var T0 = time.Date(2030, 1, 2, 3, 4, 5, 123456789, time.UTC)

var t0 = T0

// env is one scenario's bundle: the test, the harness and a dialect opened for it.
type env struct {
	t    *testing.T
	h    Harness
	d    dialects.Dialect
	caps Caps
}

func setup(t *testing.T, h Harness) *env {
	t.Helper()
	return &env{t: t, h: h, d: h.Open(t), caps: h.Caps()}
}

// other is a second dialect on the same database, as another process would open it.
func (e *env) other() *env {
	e.t.Helper()
	return &env{t: e.t, h: e.h, d: e.h.Open(e.t), caps: e.caps}
}

func (e *env) q(ident string) string { return e.h.Quote(ident) }

func (e *env) exec(query string, args ...any) {
	e.t.Helper()
	e.h.Exec(e.t, e.d, query, args...)
}

func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if !e.h.QueryRow(e.t, e.d, query, args, &n) {
		e.t.Fatalf("%s: no row", query)
	}
	return n
}

func (e *env) state(tbl dialects.Table, id int64) (RowState, bool) {
	e.t.Helper()
	return e.h.State(e.t, e.d, tbl, id)
}

// name returns a unique table name.
func (e *env) name(prefix string) string {
	e.t.Helper()
	return e.h.TableName(e.t, e.d, prefix)
}

// table creates the table Schema renders for shape under a unique name.
func (e *env) table(prefix string, shape func(string) dialects.Table) dialects.Table {
	e.t.Helper()
	tbl := shape(e.name(prefix))
	e.create(tbl)
	return tbl
}

// create creates the table Schema renders for tbl.
func (e *env) create(tbl dialects.Table) {
	e.t.Helper()
	CreateTable(e.t, e.d, tbl, func(s string) { e.exec(s) })
}

// LeaseTable is the lease form's table the suite and the dialects' tests use.
func LeaseTable(name string) dialects.Table {
	return dialects.Table{Name: name, ID: "id", Payload: "payload", Group: "grp", Attempt: "attempt",
		RetryAfter: "retry_after", LockedUntil: "locked_until", Headers: "headers"}
}

// RowLockTable is the row lock form's table the suite and the dialects' tests use.
func RowLockTable(name string) dialects.Table {
	return dialects.Table{Name: name, ID: "id", Payload: "payload", Group: "grp", Attempt: "attempt",
		RetryAfter: "retry_after", Headers: "headers"}
}

// AdvisoryTable is the advisory form's table the suite uses, its key ending in a quote
// and a backslash.
func AdvisoryTable(name string) dialects.Table { return AdvisoryTableKeyed(name, `'s\`) }

// AdvisoryTableKeyed is AdvisoryTable with its key, name-{account}, ending in suffix.
func AdvisoryTableKeyed(name, suffix string) dialects.Table {
	return dialects.Table{Name: name, ID: "id", Payload: "payload", Attempt: "attempt", ProcessedAt: "processed_at",
		RetryAfter: "retry_after", AdvisoryKey: name + "-{account}" + suffix}
}

// keyOf is the key advisoryTable's template renders for account.
func keyOf(table, account string) string { return table + "-" + account + "'s\\" }

func (e *env) open(spec dialects.QueueSpec) dialects.Queue {
	e.t.Helper()
	return OpenQueue(e.t, e.d, spec)
}

func (e *env) openAdvisory(spec dialects.QueueSpec) dialects.AdvisoryQueue {
	e.t.Helper()
	return OpenAdvisory(e.t, e.d, spec)
}

// session opens an advisory session, aborted when the test ends.
func (e *env) session(q dialects.AdvisoryQueue) dialects.Session {
	e.t.Helper()
	return NewSession(e.t, q)
}

// unlock ends a session that must keep its connection.
func unlock(t *testing.T, s dialects.Session) {
	t.Helper()
	if closed, err := s.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock: closed %v, %v", closed, err)
	}
}

func (e *env) openLease(spec dialects.QueueSpec) dialects.LeaseQueue {
	e.t.Helper()
	return OpenLease(e.t, e.d, spec)
}

func (e *env) publish(tbl dialects.Table, m dialects.Message) int64 {
	e.t.Helper()
	return Publish(e.t, e.d, tbl, m)
}

// fill inserts n rows of payload "p" in group into a table with a group column.
func (e *env) fill(table string, n int, group string) {
	e.t.Helper()
	for n > 0 {
		k := min(n, 500)
		args := make([]any, 0, 2*k)
		for range k {
			args = append(args, []byte("p"), group)
		}
		e.exec("INSERT INTO "+e.q(table)+" (payload, grp) VALUES "+
			strings.TrimSuffix(strings.Repeat("(?, ?),", k), ","), args...)
		n -= k
	}
}

// concurrentWriters says another session can write while a caller's transaction holds a
// row (not Caps.SingleWriter).
func concurrentWriters(h Harness) bool { return !h.Caps().SingleWriter }

// manyLeases is how many leases cross the dialect's chunking of id lists.
func (e *env) manyLeases() int {
	if e.caps.ListChunk == 0 {
		return 5000
	}
	return e.caps.ListChunk + 3
}

// stored is t as the databases keep it: UTC, to the microsecond.
func stored(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// sameTime fails unless got is exactly want as stored.
func sameTime(t *testing.T, what string, got *time.Time, want time.Time) {
	t.Helper()
	if got == nil {
		t.Errorf("%s is NULL, want %v", what, stored(want))
		return
	}
	if !got.Equal(stored(want)) {
		t.Errorf("%s = %v, want exactly %v", what, got, stored(want))
	}
}

func isTime(got *time.Time, want time.Time) bool { return got != nil && got.Equal(stored(want)) }

// SameState says a and b are the same row state (times equal, or both NULL).
func SameState(a, b RowState) bool {
	eq := func(x, y *time.Time) bool { return (x == nil) == (y == nil) && (x == nil || x.Equal(*y)) }
	return a.Attempt == b.Attempt && a.Group == b.Group && eq(a.LockedUntil, b.LockedUntil) &&
		eq(a.RetryAfter, b.RetryAfter) && eq(a.ProcessedAt, b.ProcessedAt)
}

var (
	sameState     = SameState
	leaseTable    = LeaseTable
	rowLockTable  = RowLockTable
	advisoryTable = AdvisoryTable
	configError   = ConfigError
	contains      = Contains
	ids           = IDs
	tryLock       = TryLock
)
