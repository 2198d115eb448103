// Package dialecttest is the conformance suite of rowactor's dialects: every behaviour of the
// interfaces in package dialects, written once and run against each database.
//
// A dialect's tests implement Harness (open a dialect on the test database, name a table,
// run raw SQL for assertions, read a row as stored) and call Run:
//
//	func TestConformance(t *testing.T) { dialecttest.Run(t, harness{}) }
//
// Run starts one subtest per topic and one per scenario inside it
// (TestConformance/lease/ClaimLeases), so `go test -run TestConformance/lease` runs a topic.
// What a database cannot do, or does differently, is a field of Caps, never a test of the
// dialect's name; tests that only one dialect can have (its SQL text, its driver, its
// internals) stay in that dialect's own files.
//
// The package is for tests only: the library never imports it.
package dialecttest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// Harness is what a dialect's tests give the suite. Every method that takes a *testing.T
// fails the test itself on an unexpected error.
type Harness interface {
	// Caps says what the database can do and how it differs.
	Caps() Caps

	// Open returns a new dialect on this test's database, closed when t ends. Two calls in
	// one test reach the same database, as two processes would.
	Open(t *testing.T) dialects.Dialect

	// OnCallerPool returns a dialect made by New on a pool of the caller's, on this test's
	// database, and a ping of that pool. The pool is closed when t ends.
	OnCallerPool(t *testing.T) (d dialects.Dialect, ping func() error)

	// ConnsInUse is how many of d's pool connections are in use.
	ConnsInUse(t *testing.T, d dialects.Dialect) int

	// Zero returns the dialect's zero value: no database behind it (cmd/rowactor's schema
	// command renders with it).
	Zero() dialects.Dialect

	// TableName returns a table name no other test (or earlier run) uses, starting with
	// prefix; the table, if created, is dropped when t ends.
	TableName(t *testing.T, d dialects.Dialect, prefix string) string

	// Quote quotes an identifier.
	Quote(ident string) string

	// Exec runs a statement written with ? placeholders on d's pool.
	Exec(t *testing.T, d dialects.Dialect, query string, args ...any)

	// Try runs a statement written with ? placeholders on d's pool under c, and returns its
	// error as the driver gave it.
	Try(c context.Context, d dialects.Dialect, query string, args ...any) error

	// QueryRow runs a query written with ? placeholders on d's pool and scans its first row
	// into dest (pointers to int, int64, string or []byte). It reports false when the query
	// returns no row.
	QueryRow(t *testing.T, d dialects.Dialect, query string, args []any, dest ...any) bool

	// TimeArg is t as a query argument compared with a time column.
	TimeArg(t time.Time) any

	// LentTry runs a statement written with ? placeholders in a transaction the dialect
	// lent a handler (DeliveryTx.Tx), as the handler would, and returns its error (also
	// when tx is not of the type the dialect lends).
	LentTry(tx any, query string, args ...any) error

	// Begin opens a transaction of the caller's on d's pool at read committed, of the type
	// the dialect's Publish takes.
	Begin(t *testing.T, d dialects.Dialect) Tx

	// SetAttemptType gives tbl's attempt column another integer type, as a table created
	// before rowactor rendered integer attempts has (never called with Type "").
	SetAttemptType(t *testing.T, d dialects.Dialect, tbl dialects.Table, typ string)

	// State reads the columns tbl names of row id (unnamed ones read as zero), and reports
	// whether the row exists. A harness checks here how its database stores times.
	State(t *testing.T, d dialects.Dialect, tbl dialects.Table, id int64) (RowState, bool)
}

// Tx is a caller's open transaction.
type Tx interface {
	// Value is the transaction as Publish takes it.
	Value() any
	// Exec runs a statement written with ? placeholders in the transaction.
	Exec(query string, args ...any) error
	Commit() error
	Rollback() error
}

// FIFOGuardHolder is a harness whose database guards each FIFO group across sessions:
// while another transaction holds what the guard waits for, a claim of the group comes back
// empty.
type FIFOGuardHolder interface {
	// HoldFIFOGroup holds, in a transaction of its own, what a FIFO claim of group in tbl
	// waits for; behind is a row of the group that is not its head (a database whose guard
	// locks the group's rows holds that one). release ends the transaction.
	HoldFIFOGroup(t *testing.T, d dialects.Dialect, tbl dialects.Table, group string, behind int64) (release func())
}

// PublishChecker is a harness that checks how its database stored a published row (column
// types, JSON as JSON); the suite calls it on a row published with a binary payload and
// headers {"a":1,"traceparent":"00-x"}.
type PublishChecker interface {
	CheckPublished(t *testing.T, d dialects.Dialect, tbl dialects.Table, id int64)
}

// FaultMaker is a harness that can produce the faults only its database has (a killed
// session, a server that is not there, a lock another session holds), for the suite to
// classify.
type FaultMaker interface {
	// MakeFaults produces them on d, whose table (columns id and v, one row, id 1) the
	// suite created.
	MakeFaults(t *testing.T, d dialects.Dialect, table string) []MadeFault
}

// MadeFault is a fault a FaultMaker produced: the error and the class it must have.
type MadeFault struct {
	What string
	Err  error
	Want dialects.Fault
}

// KeyInspector is a harness whose database keeps advisory locks where any session can see
// them (PostgreSQL, MySQL), as opposed to in the process (SQLite).
type KeyInspector interface {
	// HoldKey locks key on a plain connection, as another service would; release ends it.
	HoldKey(t *testing.T, d dialects.Dialect, key string) (release func())
	// LocksHeld counts the locks any session holds on keys.
	LocksHeld(t *testing.T, d dialects.Dialect, keys ...string) int
}

// Refuser is a harness with refusals of Open only its database makes (name lengths, a
// mode or isolation it cannot open, a column type it needs), run beside the suite's.
type Refuser interface {
	// Refusals are built on jobs, a lease table, and dead, a table that lacks the headers
	// column, both created by the suite.
	Refusals(t *testing.T, d dialects.Dialect, jobs, dead string) []Refusal
}

// Refusal is a spec Open must refuse with a *dialects.ConfigError naming the spec's table,
// Column and Option, its message containing Reason.
type Refusal struct {
	Name   string
	Spec   dialects.QueueSpec
	Column string
	Option string
	Reason string
}

// SessionWatcher is a harness that can tell what became of a transactional advisory
// session's connection.
type SessionWatcher interface {
	// WatchSession notes s's connection while its transaction is open; the returned check
	// runs after Unlock (closed false: the connection is back in the pool, outside any
	// transaction) or Abort (closed true: the connection is gone).
	WatchSession(t *testing.T, d dialects.Dialect, s dialects.TxSession) (check func(closed bool))
}

// TxEndedChecker is a harness whose dialect tells a settlement on a delivery transaction
// that already ended by an error of its own.
type TxEndedChecker interface {
	IsTxEnded(err error) bool
}

// BatchTexter is a harness that can tell the statement text SettleLeases runs for n leases
// of kind on q, so the suite can check that texts are built once per padded size.
type BatchTexter interface {
	BatchText(q dialects.Queue, kind dialects.StepKind, n int) string
	// BatchTexts is how many texts batches of 1 to 15 leases use.
	BatchTexts() int
}

// RowState is a row as stored; a NULL time is nil.
type RowState struct {
	Attempt     int
	Group       string
	LockedUntil *time.Time
	RetryAfter  *time.Time
	ProcessedAt *time.Time
}

// Caps is what a database can do and where it differs. The zero value is a database that
// differs in nothing the suite knows of.
type Caps struct {
	// Types are the column types of hand-written tables.
	Types Types

	// RowLock says the database serves the row lock form (SQLite does not: Open refuses it).
	RowLock bool

	// SingleWriter says one transaction writes at a time (SQLite): a caller's transaction
	// may not stay open while another session writes, and ids come in commit order.
	SingleWriter bool

	// FIFORacingClaimsMayAllMiss says FIFO claims racing for one group may all see each
	// other's guards and all come back empty (MySQL); otherwise exactly one takes the head.
	FIFORacingClaimsMayAllMiss bool

	// TxType is the type Publish takes as a caller's transaction, as its errors name it.
	TxType string
	// WrongTx is a value of a type Publish does not take as tx, that a caller might pass.
	WrongTx any
	// TypedNilTx, when set, is a nil of TxType, which Publish takes as no transaction.
	TypedNilTx any

	// EndedSessionWorks says a Session still works after it ended: after Unlock its Settle
	// runs, after Abort its Begin opens a transaction (SQLite: a session is a slot in the
	// process's key registry and settles on the pool, key or no key). Elsewhere an ended
	// session refuses both. The suite records the difference; whether SQLite should refuse
	// too is an open question (issue #17 part 1 report).
	EndedSessionWorks bool

	// AttemptTypes are the attempt column types an existing table may have, with their
	// maxima, where a claim or a retry saturates the counter. The first is the narrow type
	// the single saturation tests use. A Type "" leaves the column as Schema renders it
	// (SQLite: 64-bit integers, the counter capped at what a 32-bit column holds).
	AttemptTypes []AttemptType

	// Concat is the SQL expression that concatenates parts (column names, literals, event
	// placeholders) as text.
	Concat func(parts ...string) string
	// NowText, when set, is how an event's {now} reads when stored into a text column
	// (SQLite binds times as TimeLayout text); nil where a time does not bind as text.
	NowText func(time.Time) string

	// CommitWithoutTxSucceeds says a TxSession's Commit with no transaction open (before
	// Begin, or a second time) returns nil (MySQL); elsewhere it is an error (PostgreSQL,
	// SQLite). The interface does not say; the suite records the difference (issue #17
	// part 1 report).
	CommitWithoutTxSucceeds bool

	// TxNilAfterEnd says a TxSession's Tx() is nil once its transaction ended (MySQL);
	// elsewhere it may stay the ended transaction, which runs nothing.
	TxNilAfterEnd bool

	// TxAlways says the lease queues and advisory sessions implement TxLeaseQueue and
	// TxSession whatever QueueSpec.Transactional says (SQLite); elsewhere only a
	// transactional subscription's do. (The runtime asks its own flag first.)
	TxAlways bool

	// ClosedStillServes says a dialect made by New on the caller's pool goes on opening
	// queues and publishing after its Close (PostgreSQL: Close releases nothing of a
	// caller's pool); elsewhere a closed dialect refuses both. The interface does not say;
	// the suite records the difference (issue #17 part 1 report).
	ClosedStillServes bool

	// ListChunk is the most leases one statement of ExtendLeases or SettleLeases names; a
	// longer list runs in chunks. 0: no limit.
	ListChunk int

	// ParkNudge is how far a delay parked in the lease (a table without retry_after) at
	// exactly its token's own time moves the lease on. MySQL counts only changed rows, so
	// an unchanged row would read as a lost lease: it moves a microsecond on.
	ParkNudge time.Duration

	// WaiterKeepsPlace says a statement waiting for a row another session holds gets the
	// row before any later statement once that session ends (InnoDB queues record locks).
	// PostgreSQL does not: a waiter wakes and then locks the row, and a claim arriving in
	// between takes it if it finds it free, so a lease that ran out while the row was held
	// can be claimed before its waiting settlement runs.
	WaiterKeepsPlace bool
}

// AttemptType is an attempt column type and its maximum.
type AttemptType struct {
	Name string // subtest name
	Type string // for Harness.SetAttemptType; "" keeps the column
	Max  int64
}

// Types are column types for CREATE TABLE statements the suite writes itself.
type Types struct {
	// ID is a generated primary key column's type and constraints.
	ID string
	// Text is a text column's type.
	Text string
	// Time is a nullable time column's type (the dialect's choice for locked_until).
	Time string
	// CaseBlindText, when set, is a text column type whose comparisons ignore letter case
	// (SQLite's COLLATE NOCASE); MySQL's default collation already does, and also ignores
	// trailing spaces.
	CaseBlindText string
	// Int is an integer column's type.
	Int string
	// Blob is a binary column's type.
	Blob string
	// JSON is a JSON column's type.
	JSON string
}

// scenario is one behaviour of the suite.
type scenario struct {
	name string
	run  func(t *testing.T, h Harness)
	// applies, when set, says whether the database can show the behaviour at all; a
	// scenario that does not apply is not run.
	applies func(h Harness) bool
}

// topics are the suite's scenarios by topic, in the order Run runs them.
var topics = []struct {
	name      string
	scenarios []scenario
}{
	{"lease", leaseScenarios},
	{"fifo", fifoScenarios},
	{"batch", batchScenarios},
	{"publish", publishScenarios},
	{"faults", faultScenarios},
	{"advisory", advisoryScenarios},
	{"poison", poisonScenarios},
	{"validate", validateScenarios},
	{"admin", adminScenarios},
	{"inspect", inspectScenarios},
	{"jobcontrol", jobControlScenarios},
	{"joblist", jobListScenarios},
	{"retention", retentionScenarios},
	{"election", electionScenarios},
	{"events", eventScenarios},
	{"txn", txnScenarios},
	{"rowlock", rowLockScenarios},
	{"txended", txEndedScenarios},
}

// Run runs every scenario of the suite against the harness's database, as subtests named
// topic/scenario.
func Run(t *testing.T, h Harness) {
	for _, topic := range topics {
		var run []scenario
		for _, s := range topic.scenarios {
			if s.applies == nil || s.applies(h) {
				run = append(run, s)
			}
		}
		if len(run) == 0 {
			continue // a topic the database has no part in (SQLite's row locks)
		}
		t.Run(topic.name, func(t *testing.T) {
			for _, s := range run {
				t.Run(s.name, func(t *testing.T) { s.run(t, h) })
			}
		})
	}
}

// Dollar rewrites a query's ? placeholders as $1, $2, ... for databases that number them.
// A ? inside a quoted string or identifier stays.
func Dollar(query string) string {
	var (
		out   []byte
		n     int
		quote byte
	)
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			out = append(out, '$')
			out = strconv.AppendInt(out, int64(n), 10)
			continue
		}
		out = append(out, c)
	}
	return string(out)
}
