// Package dialects is the contract between rowactor's runtime and the databases it
// serves: the interface every database implements.
//
// Who may use it:
//
//   - The root package rowactor calls it, and so do the other packages of this module:
//     the engine packages (actors, claimer, settler...), outbox, rowactortest,
//     the dashboard, the rowactor command, the benchmarks and the examples.
//   - The three dialects of this module implement it: dialects/postgres,
//     dialects/mysql and dialects/sqlite.
//   - Nothing else should implement it yet. It has no compatibility promise for a
//     dialect outside this module: its interfaces change whenever the runtime needs
//     something new of a database, and such a change is not a breaking change of
//     rowactor's version.
//
// What the dialects share but the runtime never calls lives under dialects/internal.
//
// A dialect owns every difference between databases:
//
//   - the SQL text, built once per subscription, never per message;
//   - identifier quoting and how time is stored;
//   - how a claim is made atomic, and how an advisory key is locked;
//   - which forms and isolation levels the database can serve.
//
// The runtime above it asks the dialect, and never switches on a database's name.
//
// The runtime finds what a dialect can do by type assertion on the Queue that Open returns,
// the way database/sql discovers optional driver interfaces: a queue that implements
// LeaseQueue serves the lease form, AdvisoryQueue the advisory lock form, and RowLockQueue
// the row lock form. A dialect refuses a form it cannot serve from Open, with a *ConfigError
// that names the table and the fix.
//
// This package and its sub-packages never import the root package.
package dialects

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Dialect is one database behind rowactor.
type Dialect interface {
	// Name is the database's name as users know it: "sqlite", "postgres" or "mysql".
	// Error messages and telemetry use it; nothing chooses behaviour by it.
	Name() string

	// Open checks a subscription's table against the live database and builds the
	// subscription's statements. It claims nothing.
	//
	// The check covers every named column, and the form, isolation and mode the
	// database must serve. A description that cannot work is refused with a
	// *ConfigError.
	Open(ctx context.Context, spec QueueSpec) (Queue, error)

	// Publisher checks a table for publishing and builds its INSERT once.
	Publisher(ctx context.Context, t Table) (Publisher, error)

	// Schema renders the CREATE TABLE statement and the recommended claim index for a
	// description, in this database's column types.
	Schema(t Table) (string, error)

	// Limits says how much concurrency the database allows the runtime.
	Limits() Limits

	// Close releases what the dialect opened itself.
	//
	// It never closes a pool the caller handed in. A dialect made by Open in the root
	// package owns its pool, and closes it.
	Close() error
}

// Limits is what a database allows the runtime to hold at once.
type Limits struct {
	// Connections is how many pool connections one subscription may hold: its claims in
	// flight and, in the row lock and advisory forms, its deliveries in work. It is the
	// pool's size less one, which is left for publishes and handlers' own queries.
	//
	// 0 means no limit. SQLite holds no connection per row.
	Connections int
	// ClaimsInFlight is how many claims of one subscription may run at once. 0 means one
	// per free worker. SQLite says 1: it has one writer, so concurrent claims only
	// collide.
	ClaimsInFlight int
	// SessionConnections says an advisory session holds a connection of its own, which
	// Session.Abort closes. It is true on PostgreSQL and MySQL; SQLite keeps keys in the
	// process.
	SessionConnections bool
	// Budget is the pool's connections, shared by every subscription on the pool. Claims
	// take from it before they run, and give back as their claims and rows end. nil means
	// no limit.
	Budget *Budget
}

// SQLDB is a dialect that lends its pool as a database/sql handle: for the service's own
// statements (its business writes, a transaction to publish in with PublishTx) and for
// applying Schema's statements, the same code on every database.
//
// The handle shares the dialect's pool and its size; the dialect closes it on Close.
type SQLDB interface {
	SQLDB() *sql.DB
}

// Notifier is a dialect that can wake subscriptions in other processes, as PostgreSQL's
// LISTEN/NOTIFY does.
//
// Its publishers notify after each insert. A notification sent in a caller's
// transaction is delivered when the transaction commits.
type Notifier interface {
	// Listen holds one connection listening for publishes into any table, and calls wake
	// with each publish's table and group. Group "" wakes every queue of the table.
	//
	// Notifications sent while it is not connected are lost. So after it connects, and
	// after each reconnect, it calls wake("", "") and every subscription claims once.
	//
	// It returns when ctx ends. It reconnects with a capped backoff and never spins.
	//
	// wake must not block: a dialect may fan one session's notifications out to several
	// listeners in turn (PostgreSQL's dialects opened from one connection string share
	// one), and Listen returns only once a wake in progress has.
	Listen(ctx context.Context, wake func(table, group string)) error
}

// DueProber is a dialect that tells, in one statement, which queues of a table have a
// row a claim could take now.
//
// The broker probes its idle subscriptions of one table together: one statement per
// table per poll, instead of one claim per subscription.
//
// The rule: the probe must never say a queue is not due when a claim would take a row.
// It may say a queue is due when no claim would take one, which costs one empty claim,
// as a poll does. That happens for a row another process holds under a row lock or an
// advisory key, and for a row a FIFO claim passes over because it is not its group's
// head.
type DueProber interface {
	// DueQueues reports, for each of groups, whether a row of it is claimable at now:
	// unfinished, due, and, in the lease form, not leased. groups are the group column's
	// values, or [""] for a table without groups. The answer has len(groups) entries.
	DueQueues(ctx context.Context, t Table, lease bool, groups []string, now time.Time) ([]bool, error)
}

// Queue is one subscription's prepared statements. One of the optional interfaces
// LeaseQueue, AdvisoryQueue or RowLockQueue serves its form.
type Queue interface {
	// Close releases the queue's prepared statements.
	Close() error
}

// LeaseQueue serves the lease form. The claim writes the lease expiry, which is the
// delivery's token, and counts the attempt, in one commit. Every settlement and
// extension is fenced by the token.
type LeaseQueue interface {
	Queue

	// ClaimLeases claims up to limit due rows in claim order. It stamps each with the
	// lease expiry until, counts its attempt, and returns the rows with Attempt as it
	// stood before the count.
	//
	// The caller reads now once: due-ness, lease expiry and the new lease all derive
	// from it. A row whose data cannot be read is returned leased and flagged with
	// Row.Fault; it never fails the claim of the rows beside it.
	ClaimLeases(ctx context.Context, now, until time.Time, limit int) ([]Row, error)

	// ExtendLeases moves every lease in held that still holds its token to until, in one
	// statement, and returns the ids it moved.
	//
	// An id missing from the result lost its lease. The exception is a *RowsBusyError
	// that names the id: another session held its row's lock, and the lease keeps its
	// token. The ids returned beside that error were moved.
	ExtendLeases(ctx context.Context, until time.Time, held []Lease) ([]int64, error)

	// SettleLease runs the step's statement fenced by the token. It reports false, with
	// no change to the row, when the row no longer holds the token.
	SettleLease(ctx context.Context, step Step, held Lease) (bool, error)

	// Holding returns the ids of held whose rows hold their tokens, read without locking
	// or waiting for a lock. The renewer reads back with it what a round wrote when it did
	// not hear the round's end.
	Holding(ctx context.Context, held []Lease) ([]int64, error)
}

// FIFOQueue is a queue opened for a table with FIFO groups. Its claims take only the
// group's head, and only while no other row of the group is in work, across processes.
//
// A dialect's Open returns one for a FIFO table it serves, and refuses the table
// otherwise.
type FIFOQueue interface {
	Queue
	// ClaimsHeadsOnly is a marker: the queue's claims follow the FIFO rule.
	ClaimsHeadsOnly()
}

// LeaseBatchQueue is a lease queue that settles many rows of one kind in one statement and
// one commit, each row fenced by its own token.
type LeaseBatchQueue interface {
	LeaseQueue

	// SettleLeases runs kind's statement, in one statement, for every lease in held whose
	// row still holds its token, and returns the ids it settled. StepAck deletes the row
	// or sets processed_at = now; StepRelease clears the lease.
	//
	// An id missing from the result lost its lease and was left alone. The exception is
	// a *RowsBusyError that names the id: another session held its row's lock, and the
	// row still holds its token. The ids returned beside that error were settled.
	SettleLeases(ctx context.Context, kind StepKind, now time.Time, held []Lease) ([]int64, error)

	// SettleLeaseWaiting is SettleLease for a batchable step whose row another session
	// holds: it waits for the row's lock, up to ctx. Batchable is settler's test.
	//
	// A wait cut short changes nothing, then or later. Either the server ends the wait
	// itself, or the statement runs in a transaction that commits only once its result
	// is read.
	SettleLeaseWaiting(ctx context.Context, step Step, held Lease) (bool, error)
}

// AdvisoryQueue serves the advisory lock form:
//
//   - candidates are selected with their keys,
//   - each key is locked without waiting, on a session of its own,
//   - the row is taken, and its attempt counted, only if it is still claimable.
type AdvisoryQueue interface {
	Queue

	// Candidates returns up to limit claimable rows in claim order with their key text,
	// passing over keys the database can tell are held.
	Candidates(ctx context.Context, now time.Time, limit int) ([]Candidate, error)

	// Session opens a session that can hold one key. On servers with session locks it is
	// a dedicated connection; on SQLite it is a slot in the process's key registry.
	Session(ctx context.Context) (Session, error)
}

// TakesTogether is an AdvisoryQueue that takes the rows of several sessions, each
// holding its row's key, in one statement. SQLite keeps its keys in the process and has
// one writer per file: a claim's takes then cost one write between them instead of one
// each. A server's sessions are connections of their own, so each takes on its own.
type TakesTogether interface {
	// TakeAll runs Session.Take for each take, on its session (one of this queue's,
	// holding the key of the row), and sets its Row and OK as Take returns them. An error
	// leaves every take not taken.
	TakeAll(ctx context.Context, now time.Time, takes []Take) error
}

// Take is one row for TakesTogether.TakeAll to take on the session holding its key.
type Take struct {
	Session Session
	ID      int64
	Row     Row
	OK      bool
}

// Session holds at most one advisory key and settles its row while holding it.
type Session interface {
	// TryLock locks key without waiting. It reports false when the key is held elsewhere.
	TryLock(ctx context.Context, key string) (bool, error)

	// Take re-checks that the row is still claimable at now, counts its attempt and reads
	// it. It reports false when the row was settled or taken meanwhile. A row whose data
	// cannot be read is taken and returned flagged with Row.Fault.
	Take(ctx context.Context, id int64, now time.Time) (Row, bool, error)

	// Settle runs the step's statement on the session.
	Settle(ctx context.Context, step Step, id int64) error

	// Unlock releases the key and ends the session, and reports whether the connection
	// was closed.
	//
	// The connection returns to its pool when the database confirms the release. It is
	// closed otherwise, which ends the session and every lock it held. A session that
	// holds no key just ends.
	Unlock(ctx context.Context) (closed bool, err error)

	// Abort releases the key and closes the session's connection, for a delivery dropped
	// unsettled: whatever state the session was in, the server forgets it.
	Abort(ctx context.Context) error
}

// RowLockQueue serves the row lock form, on PostgreSQL and MySQL but not SQLite. The
// claim transaction holds its row while the handler runs, and its COMMIT is the
// settlement. Each claim holds one pool connection until it settles.
type RowLockQueue interface {
	Queue

	// ClaimLocked opens a transaction at the table's isolation level and claims the first
	// due row with FOR UPDATE SKIP LOCKED. The transaction stays open.
	//
	// ok is false when no row is due; the transaction has then ended. A row whose data
	// cannot be read is claimed, and its Row flagged with Row.Fault.
	ClaimLocked(ctx context.Context, now time.Time) (claim LockedClaim, ok bool, err error)
}

// RowLockBatchQueue serves batch handlers in the row lock form: one claim transaction
// holds up to limit rows, and one COMMIT settles them all.
type RowLockBatchQueue interface {
	RowLockQueue

	// ClaimLockedBatch opens a transaction at the table's isolation level and claims up
	// to limit due rows in claim order with FOR UPDATE SKIP LOCKED. The transaction stays
	// open. ok is false when no row is due; the transaction has then ended.
	ClaimLockedBatch(ctx context.Context, now time.Time, limit int) (batch LockedBatch, ok bool, err error)
}

// LockedBatch is an open claim transaction holding several rows.
type LockedBatch interface {
	// Rows are the claimed rows, in claim order. A row whose data cannot be read is among
	// them, flagged with Row.Fault.
	Rows() []Row
	// Settle runs steps[i] for Rows()[i] in the claim transaction, then commits once.
	// StepRelease runs nothing. A failed statement rolls everything back: every row
	// returns as it was.
	Settle(ctx context.Context, steps []Step) error
	// Rollback ends the transaction without a settlement; every row returns at once.
	Rollback(ctx context.Context) error
}

// LockedClaim is an open claim transaction of the row lock form, holding one row.
type LockedClaim interface {
	// Row is the claimed row. Its Attempt is the column as it reads: the row lock form
	// counts an attempt when a retry returns the row, so a crash spends none.
	Row() Row
	// Settle runs the step's statement in the claim transaction and ends it.
	//
	// It commits when the step wrote, and rolls back when nothing needed writing, as for
	// a Retry without an attempt column. A failed statement rolls back: the row returns
	// as it was.
	Settle(ctx context.Context, step Step) error
	// Rollback ends the transaction without a settlement; the row returns at once. When the
	// rollback itself fails the connection is closed, so the server rolls it back.
	Rollback(ctx context.Context) error
}

// ChainingClaim is a LockedClaim that settles and then claims the queue's next due row on
// the same connection, in the round trip of the settlement (PostgreSQL: the statement,
// COMMIT, BEGIN and the claim go in one pipeline). A worker that waits for its next row
// gets it with the settlement of its last, without a claim transaction of its own.
type ChainingClaim interface {
	LockedClaim
	// SettleAndClaim settles as Settle does and, only once the settlement committed (or
	// rolled back, for a step with nothing to write), claims as RowLockQueue.ClaimLocked
	// does. settleErr is the settlement's error; then no claim was made. claimErr is the
	// claim's; next is the claimed row's claim, nil when none was due.
	SettleAndClaim(ctx context.Context, step Step, now time.Time) (next LockedClaim, settleErr, claimErr error)
}

// ErrDuplicate reports a publish with a unique key a row of the table holds already: it
// inserted nothing, and Publish returns that row's id with an error wrapping this one.
var ErrDuplicate = errors.New("rowactor: the unique key is held by another row; nothing was inserted")

// Duplicate is the error of a publish whose unique key row id holds.
func Duplicate(key string, id int64) error {
	return fmt.Errorf("unique key %q is held by row %d: %w", key, id, ErrDuplicate)
}

// Publisher inserts rows into one table.
type Publisher interface {
	// Publish inserts one row and returns its id. When m's unique key is held, it
	// inserts nothing and returns the holding row's id with an error matching
	// ErrDuplicate (Duplicate).
	//
	// tx is nil for the dialect's pool, or the caller's transaction, of the type the
	// dialect documents, such as *sql.Tx. The row then exists only if the caller commits.
	Publish(ctx context.Context, tx any, m Message) (int64, error)
}

// Message is a row to publish.
type Message struct {
	Group   string
	Payload []byte
	// Headers is the JSON object stored in the headers column; nil for none.
	Headers []byte
	// NotBefore, when set, makes the row due only from then. It needs a retry_after
	// column.
	NotBefore time.Time
	// UniqueKey, when set, is written to the table's UniqueKey column. When a row holds
	// the key already, Publish inserts nothing and returns that row's id.
	UniqueKey string
	// Priority is written to the table's Priority column; claims take lower numbers
	// first. It must be 0 for a table without one.
	Priority int
}

// Row is a claimed row as the handler sees it.
type Row struct {
	ID      int64
	Payload []byte
	// Attempt is the attempt column as it stood before this claim counted it: the first
	// delivery reads 1. It is 0 when the table has no attempt column.
	Attempt int
	// Headers is the raw headers column, a JSON object; nil when absent or NULL.
	Headers []byte
	// Key is the advisory key text, in the advisory form only.
	Key string
	// Token is the lease expiry the claim wrote, in the lease form only.
	Token time.Time
	// Fault, when set, says the claim took the row but could not read its data; it is a
	// *RowDataError.
	//
	// The row's lease, lock or key is held as for any claimed row. ID and Token are set;
	// the other fields are not to be trusted. The runtime sets such a row aside instead
	// of delivering it, as SetAsideUntil tells.
	Fault error
}

// Lease names a row and the token its delivery holds.
type Lease struct {
	ID    int64
	Token time.Time
}

// Candidate is a row the advisory claim may take, with its key.
type Candidate struct {
	ID  int64
	Key string
}

// StepKind is what a settlement writes.
type StepKind uint8

const (
	// StepAck ends the row: it deletes it, or sets processed_at = now. Ack and Drop both
	// run it.
	StepAck StepKind = iota + 1
	// StepRetry returns the row to the queue at once:
	//
	//   - row lock form: attempt + 1;
	//   - lease form: locked_until = NULL, since the claim counted the attempt;
	//   - advisory form: no statement, since the unlock returns the row.
	StepRetry
	// StepRetryAfter returns the row due at Step.At. The row lock form also counts the
	// attempt.
	//
	// A lease table without a retry_after column keeps the row leased until Step.At
	// instead: locked_until = At, and no claim takes it before. The token fence stays
	// sound: every later claim writes a token after At, and every earlier token lies
	// before the claim this delivery made.
	StepRetryAfter
	// StepDeadLetter moves the row to the dead letter: an UPDATE of the group, or a move
	// into the dead-letter table.
	StepDeadLetter
	// StepRelease gives the row back unsettled; the lease form sets locked_until = NULL.
	//
	// With Step.Unstarted it also gives back the attempt the claim counted, in the lease
	// form and in the advisory form, whose release otherwise runs no statement.
	StepRelease
	// StepCustom runs an event of the service's own, named by Step.Event, with no
	// built-in statement behind it.
	StepCustom
	// StepSnooze returns the row due at Step.At without spending an attempt. The lease
	// and advisory forms give back the attempt their claim counted; the row lock form
	// counts none. It never moves a row to a dead letter.
	StepSnooze
)

func (k StepKind) String() string {
	switch k {
	case StepAck:
		return "ack"
	case StepRetry:
		return "retry"
	case StepRetryAfter:
		return "retry_after"
	case StepDeadLetter:
		return "dead_letter"
	case StepRelease:
		return "release"
	case StepCustom:
		return "event"
	case StepSnooze:
		return "snooze"
	}
	return "unknown"
}

// Step is one settlement statement with its times.
type Step struct {
	Kind StepKind
	// Now is the settlement's "now", written to processed_at.
	Now time.Time
	// At is when a StepRetryAfter row becomes due.
	At time.Time

	// Event, when set, names the event of QueueSpec.Events the dialect runs instead of
	// the step's built-in statement. It is always set for StepCustom.
	Event string
	// Error is the text the handler gave with its outcome. An event binds it as {error},
	// and the table's error column stores it (ErrorValue).
	Error string
	// Attempt is the attempt the delivery reported, for an event's {attempt}.
	Attempt int
	// Args are a custom event's {arg1}, {arg2}, ... values.
	Args []any
	// Unstarted says the delivery's handler never started: its row waited for a worker
	// and was given back, or cancelled, before one took it.
	//
	// A StepRelease or StepAck then also gives back the attempt the claim counted in the
	// lease and advisory forms, as StepSnooze does, so the row reads as it did before the
	// claim. The row lock form's claim counts none, and its release is the rollback. Such
	// a step never joins a batch.
	Unstarted bool
}

// EventValues returns what a step's event binds, for the row id.
func (s *Step) EventValues(id int64, group, deadLetter string) EventValues {
	return EventValues{ID: id, Now: s.Now, At: s.At, Error: s.Error, Group: group, DeadLetter: deadLetter,
		Attempt: s.Attempt, Args: s.Args}
}

// QueueSpec is what a subscription asks of a dialect.
type QueueSpec struct {
	Table Table
	// Group is the subscription's group value, used only when the table has a group
	// column.
	Group string
	// DeadLetterGroup is the group a spent row moves to, in a table with a group column.
	DeadLetterGroup string
	// DeadLetterTable is the table a spent row moves to, for a table without groups. It
	// must have the queue table's columns.
	DeadLetterTable string
	// Events are the subscription's own statements by event name: replacements of
	// built-in settlements (EventAck, ...) and custom events. A dialect compiles them at
	// Open, and runs Step.Event's in place of the step's statement.
	Events map[string]string
	// Transactional asks for transactions lent to handlers: see TxLockedClaim,
	// TxLeaseQueue and TxSession.
	//
	// A dialect refuses what it cannot open. PostgreSQL refuses a transactional lease
	// table at repeatable read or serializable, whose snapshot would not see the
	// renewer's extensions.
	Transactional bool
}
