// Package dialects is the ground floor of rowactor: the interface every database implements.
//
// A dialect owns every difference between databases: the SQL text (built once per
// subscription, never per message), identifier quoting, how time is stored, how a claim is
// made atomic, how an advisory key is locked, and which forms and isolation levels the
// database can serve. The runtime above it asks the dialect and never switches on a
// database's name.
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
	"fmt"
	"time"
)

// Dialect is one database behind rowactor.
type Dialect interface {
	// Name is the database's name as users know it ("sqlite", "postgres", "mysql"); it is
	// used in error messages and telemetry, never to choose behaviour.
	Name() string

	// Open checks a subscription's table against the live database (every named column
	// exists; the form, isolation and mode are ones this database can serve) and builds the
	// subscription's statements. It claims nothing. A description that cannot work is
	// refused with a *ConfigError.
	Open(ctx context.Context, spec QueueSpec) (Queue, error)

	// Publisher checks a table for publishing and builds its INSERT once.
	Publisher(ctx context.Context, t Table) (Publisher, error)

	// Schema renders the CREATE TABLE statement and the recommended claim index for a
	// description, in this database's column types.
	Schema(t Table) (string, error)

	// Limits says how much concurrency the database allows the runtime.
	Limits() Limits

	// Close releases what the dialect opened itself. It never closes a pool the caller
	// handed in; a dialect made by Open in the root package owns its pool and closes it.
	Close() error
}

// Limits is what a database allows the runtime to hold at once.
type Limits struct {
	// Connections is how many pool connections one subscription may hold for its claims in
	// flight and, in the forms that hold one per row (row lock, advisory), its deliveries in
	// work: the pool's size less one, left for publishes and handlers' own queries. 0 means
	// no limit (SQLite holds no connection per row).
	Connections int
	// ClaimsInFlight is how many claims of one subscription may run at once; 0 means one
	// per free worker. SQLite has one writer, so concurrent claims only collide: 1.
	ClaimsInFlight int
	// SessionConnections says an advisory session holds a connection of its own, which
	// Session.Abort closes (PostgreSQL, MySQL); SQLite keeps keys in the process.
	SessionConnections bool
	// Budget is the pool's connections, shared by every subscription on the pool: claims
	// take from it before they run, and give back as their claims and rows end. nil means
	// no limit.
	Budget *Budget
}

// Notifier is a dialect that can wake subscriptions in other processes (PostgreSQL's
// LISTEN/NOTIFY). Its publishers notify after each insert; notifications from a caller's
// transaction are delivered when it commits.
type Notifier interface {
	// Listen holds one connection listening for publishes into any table and calls wake
	// with each one's table and group (group "" wakes every queue of the table). After it
	// connects, and after each reconnect (notifications sent meanwhile are lost), it calls
	// wake("", "") so every subscription claims once. It returns when ctx ends; it
	// reconnects with a capped backoff and never spins.
	Listen(ctx context.Context, wake func(table, group string)) error
}

// DueProber is a dialect that tells, in one statement, which queues of a table have a
// row a claim could take now. The broker polls its idle subscriptions of one table
// together with it: one statement per table per poll instead of one claim per
// subscription. The probe may say a queue is due when no claim would take a row (a row
// another process holds under a row lock or an advisory key, or that a FIFO claim would
// pass over as not its group's head): that costs one empty claim, as a poll does. It
// must never say a queue is not due when a claim would take a row.
type DueProber interface {
	// DueQueues reports, for each of groups (the group column's values; [""] for a table
	// without groups), whether a row of it is claimable at now: unfinished, due, and in
	// the lease form not leased. The answer has len(groups) entries.
	DueQueues(ctx context.Context, t Table, lease bool, groups []string, now time.Time) ([]bool, error)
}

// ProbeChunk is how many groups one DueQueues statement asks about: n rounded up to a
// power of two, at most ProbeMax, so that a dialect prepares a handful of statement
// texts however many subscriptions a table has. The dialect pads a chunk by repeating
// its last group.
func ProbeChunk(n int) int {
	c := 1
	for c < n && c < ProbeMax {
		c *= 2
	}
	return c
}

// ReadDue reads a probe of n queues: entry i is true when a row named i. A table without
// groups asked one question (the first entry), whose answer goes in every entry.
func ReadDue(rows Rows, t Table, n int) ([]bool, error) {
	due := make([]bool, n)
	for rows.Next() {
		var i int
		if err := rows.Scan(&i); err != nil {
			return nil, err
		}
		if i >= 0 && i < n {
			due[i] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if t.Group == "" && n > 0 {
		for i := range due {
			due[i] = due[0]
		}
	}
	return due, nil
}

// ProbeMax is the most groups one DueQueues statement asks about.
const ProbeMax = 64

// ProbeGroups calls probe for each chunk of groups (ProbeChunk, padded by repeating the
// chunk's last group) and gathers the answers in groups' order.
func ProbeGroups(groups []string, probe func(chunk []string) ([]bool, error)) ([]bool, error) {
	due := make([]bool, 0, len(groups))
	for len(groups) > 0 {
		n := min(len(groups), ProbeMax)
		chunk := make([]string, ProbeChunk(n))
		copy(chunk, groups[:n])
		for i := n; i < len(chunk); i++ {
			chunk[i] = groups[n-1]
		}
		got, err := probe(chunk)
		if err != nil {
			return nil, err
		}
		if len(got) != len(chunk) {
			return nil, fmt.Errorf("rowactor: a due probe answered %d of %d queues", len(got), len(chunk))
		}
		due = append(due, got[:n]...)
		groups = groups[n:]
	}
	return due, nil
}

// Queue is one subscription's prepared statements. Its form is served by one of the
// optional interfaces LeaseQueue, AdvisoryQueue or RowLockQueue.
type Queue interface {
	// Close releases the queue's prepared statements.
	Close() error
}

// LeaseQueue serves the lease form: the claim writes the lease expiry (the delivery's
// token) and counts the attempt in one commit; every settlement and extension is fenced
// by the token.
type LeaseQueue interface {
	Queue

	// ClaimLeases claims up to limit due rows in claim order, stamps each with the lease
	// expiry until and counts its attempt, and returns the rows with Attempt as it stood
	// before the count. now is read once by the caller: due-ness, lease expiry and the new
	// lease all derive from it. A row whose data cannot be read is returned leased and
	// flagged (Row.Fault), never failing the claim of the rows beside it.
	ClaimLeases(ctx context.Context, now, until time.Time, limit int) ([]Row, error)

	// ExtendLeases moves every lease in held that still holds its token to until, in one
	// statement, and returns the ids it moved. An id missing from the result lost its lease,
	// unless the error is a *RowsBusyError naming it: another session held its row's lock,
	// the lease keeps its token, and the ids returned beside that error were moved.
	ExtendLeases(ctx context.Context, until time.Time, held []Lease) ([]int64, error)

	// SettleLease runs the step's statement fenced by the token. It reports false, with
	// no change to the row, when the row no longer holds the token.
	SettleLease(ctx context.Context, step Step, held Lease) (bool, error)

	// Holding returns the ids of held whose rows hold their tokens, read without locking
	// or waiting for a lock. The renewer reads back what a round it did not hear the end
	// of wrote.
	Holding(ctx context.Context, held []Lease) ([]int64, error)
}

// FIFOQueue is a queue opened for a table with FIFO groups whose claims take only the
// group's head, and only while no other row of the group is in work, across processes. A
// dialect's Open returns one for a FIFO table it serves, and refuses the table otherwise.
type FIFOQueue interface {
	Queue
	// ClaimsHeadsOnly is a marker: the queue's claims follow the FIFO rule.
	ClaimsHeadsOnly()
}

// LeaseBatchQueue is a lease queue that settles many rows of one kind in one statement and
// one commit, each row fenced by its own token.
type LeaseBatchQueue interface {
	LeaseQueue

	// SettleLeases runs kind's statement (StepAck: delete or set processed_at = now;
	// StepRelease: clear the lease) for every lease in held whose row still holds its
	// token, in one statement, and returns the ids it settled. An id missing from the
	// result lost its lease and was left alone, unless the error is a *RowsBusyError
	// naming it: another session held its row's lock and the row still holds its token;
	// the ids returned beside that error were settled.
	SettleLeases(ctx context.Context, kind StepKind, now time.Time, held []Lease) ([]int64, error)

	// SettleLeaseWaiting is SettleLease for a batchable step (Batchable in settler) whose
	// row another session holds: it waits for the row's lock, up to ctx. A wait cut short
	// changes nothing, then or later: the server ends the wait itself, or the statement
	// runs in a transaction that commits only once its result is read.
	SettleLeaseWaiting(ctx context.Context, step Step, held Lease) (bool, error)
}

// AdvisoryQueue serves the advisory lock form: candidates are selected with their keys,
// each key is locked without waiting on a session of its own, and the row is taken (and
// its attempt counted) only if it is still claimable.
type AdvisoryQueue interface {
	Queue

	// Candidates returns up to limit claimable rows in claim order with their key text,
	// passing over keys the database can tell are held.
	Candidates(ctx context.Context, now time.Time, limit int) ([]Candidate, error)

	// Session opens a session that can hold one key. On servers with session locks it is
	// a dedicated connection; on SQLite it is a slot in the process's key registry.
	Session(ctx context.Context) (Session, error)
}

// Session holds at most one advisory key and settles its row while holding it.
type Session interface {
	// TryLock locks key without waiting. It reports false when the key is held elsewhere.
	TryLock(ctx context.Context, key string) (bool, error)

	// Take re-checks that the row is still claimable (as of now), counts its attempt and
	// reads it. It reports false when the row was settled or taken meanwhile. A row whose
	// data cannot be read is taken and returned flagged (Row.Fault).
	Take(ctx context.Context, id int64, now time.Time) (Row, bool, error)

	// Settle runs the step's statement on the session.
	Settle(ctx context.Context, step Step, id int64) error

	// Unlock releases the key and ends the session: the connection returns to its pool
	// when the database confirms the release, and is closed otherwise (ending the session
	// and every lock it held). A session that holds no key just ends. It reports whether
	// the connection was closed.
	Unlock(ctx context.Context) (closed bool, err error)

	// Abort releases the key and closes the session's connection, for a delivery dropped
	// unsettled: whatever state the session was in, the server forgets it.
	Abort(ctx context.Context) error
}

// RowLockQueue serves the row lock form: the claim transaction holds its row while the
// handler runs, and its COMMIT is the settlement. (PostgreSQL and MySQL; not SQLite.)
// Each claim holds one pool connection until it settles.
type RowLockQueue interface {
	Queue

	// ClaimLocked opens a transaction at the table's isolation level and claims the first
	// due row with FOR UPDATE SKIP LOCKED; the transaction stays open. ok is false (and
	// the transaction ended) when no row is due. A row whose data cannot be read is
	// claimed and its Row flagged (Row.Fault).
	ClaimLocked(ctx context.Context, now time.Time) (claim LockedClaim, ok bool, err error)
}

// RowLockBatchQueue serves batch handlers in the row lock form: one claim transaction
// holds up to limit rows, and one COMMIT settles them all.
type RowLockBatchQueue interface {
	RowLockQueue

	// ClaimLockedBatch opens a transaction at the table's isolation level and claims up
	// to limit due rows in claim order with FOR UPDATE SKIP LOCKED; the transaction stays
	// open. ok is false (and the transaction ended) when no row is due.
	ClaimLockedBatch(ctx context.Context, now time.Time, limit int) (batch LockedBatch, ok bool, err error)
}

// LockedBatch is an open claim transaction holding several rows.
type LockedBatch interface {
	// Rows are the claimed rows, in claim order; a row whose data cannot be read is among
	// them, flagged (Row.Fault).
	Rows() []Row
	// Settle runs steps[i] for Rows()[i] (StepRelease runs nothing) in the claim
	// transaction, then commits once. A failed statement rolls everything back: every
	// row returns as it was.
	Settle(ctx context.Context, steps []Step) error
	// Rollback ends the transaction without a settlement; every row returns at once.
	Rollback(ctx context.Context) error
}

// LockedClaim is an open claim transaction of the row lock form, holding one row.
type LockedClaim interface {
	// Row is the claimed row (Attempt as the column reads: the row lock form counts
	// attempts when a retry returns the row, so a crash spends none).
	Row() Row
	// Settle runs the step's statement in the claim transaction and ends it: COMMIT when
	// the step wrote, ROLLBACK when nothing needed writing (Retry without an attempt
	// column). A failed statement rolls back: the row returns as it was.
	Settle(ctx context.Context, step Step) error
	// Rollback ends the transaction without a settlement; the row returns at once. When the
	// rollback itself fails the connection is closed, so the server rolls it back.
	Rollback(ctx context.Context) error
}

// Publisher inserts rows into one table.
type Publisher interface {
	// Publish inserts one row and returns its id. tx is nil for the dialect's pool, or the
	// caller's transaction (the type the dialect documents, e.g. *sql.Tx); the row then
	// exists only if the caller commits.
	Publish(ctx context.Context, tx any, m Message) (int64, error)
}

// Message is a row to publish.
type Message struct {
	Group   string
	Payload []byte
	// Headers is the JSON object stored in the headers column (nil for none).
	Headers []byte
	// NotBefore, when set, makes the row due only from then (needs a retry_after column).
	NotBefore time.Time
	// UniqueKey, when set, is written to the table's UniqueKey column: when a row holds
	// the key already, Publish inserts nothing and returns that row's id.
	UniqueKey string
	// Priority is written to the table's Priority column (claims take lower numbers
	// first); it must be 0 for a table without one.
	Priority int
}

// Row is a claimed row as the handler sees it.
type Row struct {
	ID      int64
	Payload []byte
	// Attempt is the attempt column as it stood before this claim counted it (the first
	// delivery reads 1); 0 when the table has no attempt column.
	Attempt int
	// Headers is the raw headers column (a JSON object), nil when absent or NULL.
	Headers []byte
	// Key is the advisory key text (advisory form only).
	Key string
	// Token is the lease expiry the claim wrote (lease form only).
	Token time.Time
	// Fault, when set, says the claim took the row (its lease, lock or key is held as for
	// any claimed row) but could not read its data (a *RowDataError): ID and Token are
	// set, the other fields are not to be trusted. The runtime sets such a row aside
	// instead of delivering it (see CountAttempt's file).
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
	// StepAck ends the row: DELETE, or processed_at = now. Ack and Drop both run it.
	StepAck StepKind = iota + 1
	// StepRetry returns the row to the queue at once. Row lock: attempt + 1. Lease:
	// locked_until = NULL (the claim counted). Advisory: no statement (the unlock returns it).
	StepRetry
	// StepRetryAfter returns the row due at Step.At (and counts the attempt in the row lock
	// form). A lease table without a retry_after column keeps the row leased until Step.At
	// instead (locked_until = At): no claim takes it before, and the token fence stays
	// sound, since every later claim writes a token after At and every earlier token lies
	// before the claim that this delivery made.
	StepRetryAfter
	// StepDeadLetter moves the row to the dead letter: an UPDATE of the group, or a move
	// into the dead-letter table.
	StepDeadLetter
	// StepRelease gives the row back unsettled (lease form: locked_until = NULL).
	StepRelease
	// StepCustom runs an event of the service's own (Step.Event), with no built-in
	// statement behind it.
	StepCustom
	// StepSnooze returns the row due at Step.At without spending an attempt: the lease and
	// advisory forms give back the attempt their claim counted (UncountAttempt), the row
	// lock form counts none. It never moves a row to a dead letter.
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
		return "custom"
	case StepSnooze:
		return "snooze"
	}
	return "unknown"
}

// Step is one settlement statement with its times.
type Step struct {
	Kind StepKind
	// Now is the settlement's "now" (processed_at).
	Now time.Time
	// At is when a StepRetryAfter row becomes due.
	At time.Time

	// Event, when set, names the event of QueueSpec.Events the dialect runs instead of
	// the step's built-in statement (always set for StepCustom).
	Event string
	// Error is the text the handler gave with its outcome, for an event's {error} and the
	// table's error column (ErrorValue).
	Error string
	// Attempt is the attempt the delivery reported, for an event's {attempt}.
	Attempt int
	// Args are a custom event's {arg1}, {arg2}, ... values.
	Args []any
}

// EventValues returns what a step's event binds, for the row id.
func (s *Step) EventValues(id int64, group, deadLetter string) EventValues {
	return EventValues{ID: id, Now: s.Now, At: s.At, Error: s.Error, Group: group, DeadLetter: deadLetter,
		Attempt: s.Attempt, Args: s.Args}
}

// QueueSpec is what a subscription asks of a dialect.
type QueueSpec struct {
	Table Table
	// Group is the subscription's group value; used only when the table has a group column.
	Group string
	// DeadLetterGroup is the group a spent row moves to (tables with a group column).
	DeadLetterGroup string
	// DeadLetterTable is the table a spent row moves to (tables without groups); it must
	// have the queue table's columns.
	DeadLetterTable string
	// Events are the subscription's own statements by event name (see CompileEvent):
	// replacements of built-in settlements (EventAck, ...) and custom events. A dialect
	// compiles them at Open and runs Step.Event's in place of the step's statement.
	Events map[string]string
	// Transactional asks for transactions lent to handlers (see TxLockedClaim,
	// TxLeaseQueue, TxSession). A dialect refuses what it cannot open: on PostgreSQL a
	// transactional lease table at repeatable read or serializable, whose snapshot would
	// not see the renewer's extensions.
	Transactional bool
}
