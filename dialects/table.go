package dialects

import (
	"fmt"
	"strings"
)

// Table describes a queue table to rowactor.
//
// Column names are the table's own; only Name, ID and Payload are required. Which
// optional columns are named decides what the table can do. LockedUntil or AdvisoryKey
// selects the claim form.
type Table struct {
	// Name is the table's name: one identifier, without a dot.
	Name string
	// ID is the integer primary key. Claim order is by id.
	ID string
	// Payload holds the bytes the handler decodes.
	Payload string
	// Group, when set, holds several queues in one table: a subscription reads one group,
	// and dead letters move to another group by an UPDATE.
	Group string
	// Attempt counts deliveries; the first delivery reads 1. MaxAttempts needs it.
	Attempt string
	// RetryAfter is the "not before" time: a row is due when it is NULL or in the past.
	// Without it RetryAfter(d) behaves as Retry, with a warning.
	RetryAfter string
	// ProcessedAt, when set, makes Ack and Drop mark the row instead of deleting it; claims
	// skip marked rows.
	ProcessedAt string
	// LockedUntil selects the lease form: the lease expiry, which is also the delivery's
	// ownership token.
	LockedUntil string
	// Headers holds message metadata as a JSON object, W3C traceparent included.
	Headers string
	// Error, when set, keeps the text of the last error a handler settled its row with,
	// by Fail(err) or an outcome's WithError(err).
	//
	// It is a nullable text column: text on PostgreSQL, TEXT on MySQL and SQLite, or a
	// varchar that holds MaxErrorBytes. The settlement statement itself writes it, and it
	// moves with the row to a dead letter. The text is cut to MaxErrorBytes by ErrorText.
	//
	//   - A retry without an error leaves the column as it was.
	//   - Ack and Drop write the outcome's error, or clear the column when it carries
	//     none, so a row kept with processed_at after it succeeded shows no stale error.
	//   - A requeue keeps it.
	Error string
	// UniqueKey, when set, names a nullable text column under a unique index; Schema
	// renders both. rowactor.Unique(key) publishes with it: a publish of a key a row of
	// the table holds inserts nothing, and returns that row's id.
	//
	// A row holds its key while it is in the table: queued, in work, moved to a
	// dead-letter group, or kept finished with ProcessedAt, unless ClearUniqueKeyAtAck.
	// An Ack that deletes the row frees the key, and so does a move to a dead-letter
	// table, which receives the column as NULL. Rows published without a key leave the
	// column NULL and never conflict.
	UniqueKey string
	// ClearUniqueKeyAtAck makes Ack and Drop of a row kept with ProcessedAt clear its
	// UniqueKey, so that the key can be published again at once. Without it a finished
	// row holds its key until it is deleted.
	ClearUniqueKeyAtAck bool
	// Priority, when set, names an integer column that orders claims before the id;
	// Schema renders it NOT NULL DEFAULT 0.
	//
	// A claim takes the due rows of the lowest priority number first, and rows of one
	// priority in id order: 1 before 4, as River's priorities run. rowactor.Priority(n)
	// publishes with it; a publish without it writes 0. FIFO groups refuse it: their
	// order is the id's.
	Priority string
	// AdvisoryKey selects the advisory lock form: a template such as "jobs-{id}" whose
	// {placeholders} name columns; rows with equal keys are worked one at a time. Keys are
	// database-wide, so prefix them with something unique to the table.
	AdvisoryKey string
	// Isolation is the level of the row lock claim transaction and of transactional
	// deliveries, on PostgreSQL and MySQL/MariaDB. Empty means the database's default.
	Isolation Isolation
	// Mode is how SQLite opens those transactions: deferred, immediate or exclusive.
	// Empty means BEGIN DEFERRED.
	Mode Mode
	// DatabaseClock makes "now" the database's clock instead of the host's. The lease
	// form refuses it: its tokens are computed on the host.
	DatabaseClock bool
	// DeadAt, when set, names a nullable time column that tells when a row died.
	// Broker.RetainDeadLetters deletes by it. Schema renders the column, and with Group
	// an index on (group, dead_at) for the dead rows.
	//
	//   - A move into a dead-letter group sets it to the settlement's now.
	//   - A move into a dead-letter table does too: the row arrives with it.
	//   - A requeue clears it.
	//   - An event of the service's own that replaces the dead-letter step writes what
	//     it writes.
	//
	// Retention never deletes a row of a dead-letter group whose column is NULL: one
	// moved before the column was described, or by a statement of the service's own.
	DeadAt string
	// FIFO declares each group ordered, as an SQS FIFO message group is. It needs Group,
	// and the row lock or lease form.
	//
	// A group's rows are handled one at a time in id order across every process, and the
	// order holds across retries. The group's head is its unfinished row with the lowest
	// id, whatever its RetryAfter; unfinished means not deleted, ProcessedAt NULL, and
	// not moved to a dead letter.
	//
	//   - A head in work, or not yet due, holds its whole group and nothing else.
	//   - Retry redelivers the head first.
	//   - A head moved to its dead letter, by MaxAttempts say, makes the next row the
	//     head.
	FIFO bool
	// CancelRequests, when set, names a table of the same database through which a
	// cancel reaches a row in work that another process holds: Broker.Cancel and
	// `rowactor cancel` record the request there, and each process holding rows of this
	// table reads it every half second while it does, cancels its delivery and answers.
	// Schema renders it (row_id, reason, answer). See docs/cancel.md.
	CancelRequests string
}

// ClearUniqueKey is what an Ack's SET list adds to clear the row's unique key: ", k =
// NULL", quoted with quote. It is "" when the table keeps the key, as
// ClearUniqueKeyAtAck tells.
func (t Table) ClearUniqueKey(quote func(string) string) string {
	if t.UniqueKey == "" || !t.ClearUniqueKeyAtAck {
		return ""
	}
	return ", " + quote(t.UniqueKey) + " = NULL"
}

// ClaimOrder is the ORDER BY list of a claim: the priority column when the table has
// one, then the id. Each is quoted with quote, and qualified by alias unless it is
// empty.
func (t Table) ClaimOrder(quote func(string) string, alias string) string {
	col := func(name string) string {
		if alias == "" {
			return quote(name)
		}
		return alias + "." + quote(name)
	}
	if t.Priority == "" {
		return col(t.ID)
	}
	return col(t.Priority) + ", " + col(t.ID)
}

// Form is how rows are claimed.
type Form uint8

const (
	// FormRowLock holds each claimed row under FOR UPDATE SKIP LOCKED in an open
	// transaction. A table selects it by naming neither LockedUntil nor AdvisoryKey.
	FormRowLock Form = iota + 1
	// FormLease stamps a lease expiry into LockedUntil.
	FormLease
	// FormAdvisory locks the row's key on a session of its own.
	FormAdvisory
)

func (f Form) String() string {
	switch f {
	case FormRowLock:
		return "rowlock"
	case FormLease:
		return "lease"
	case FormAdvisory:
		return "advisory"
	}
	return "unknown"
}

// Form returns the claim form the description selects.
func (t Table) Form() Form {
	switch {
	case t.AdvisoryKey != "":
		return FormAdvisory
	case t.LockedUntil != "":
		return FormLease
	default:
		return FormRowLock
	}
}

// Isolation is a transaction isolation level.
type Isolation string

// The isolation levels a table may declare.
const (
	ReadUncommitted Isolation = "read uncommitted"
	ReadCommitted   Isolation = "read committed"
	RepeatableRead  Isolation = "repeatable read"
	Serializable    Isolation = "serializable"
)

// Mode is how SQLite begins a transaction.
type Mode string

// The SQLite transaction modes a table may declare.
const (
	Deferred  Mode = "deferred"
	Immediate Mode = "immediate"
	Exclusive Mode = "exclusive"
)

// Columns returns every column the description names, each with the role that names it,
// in a fixed order. The advisory key's placeholders are included.
func (t Table) Columns() []NamedColumn {
	var cols []NamedColumn
	add := func(role, name string) {
		if name != "" {
			cols = append(cols, NamedColumn{Role: role, Name: name})
		}
	}
	add("ID", t.ID)
	add("Payload", t.Payload)
	add("Group", t.Group)
	add("Attempt", t.Attempt)
	add("RetryAfter", t.RetryAfter)
	add("ProcessedAt", t.ProcessedAt)
	add("LockedUntil", t.LockedUntil)
	add("Headers", t.Headers)
	add("Error", t.Error)
	add("Priority", t.Priority)
	add("UniqueKey", t.UniqueKey)
	add("DeadAt", t.DeadAt)
	if parts, err := ParseKey(t.AdvisoryKey); err == nil {
		for _, p := range parts {
			if p.Column != "" {
				add("AdvisoryKey", p.Column)
			}
		}
	}
	return cols
}

// NamedColumn is a column of a description and the role that names it.
type NamedColumn struct {
	Role string
	Name string
}

// KeyPart is a piece of an advisory key template: literal text or a column's value.
type KeyPart struct {
	Literal string
	Column  string
}

// ParseKey splits an advisory key template such as "accounts-{account_id}" into parts.
func ParseKey(template string) ([]KeyPart, error) {
	var parts []KeyPart
	rest := template
	for rest != "" {
		open := strings.IndexByte(rest, '{')
		closing := strings.IndexByte(rest, '}')
		if open < 0 {
			if closing >= 0 {
				return nil, fmt.Errorf("advisory key %q has a '}' without its '{'", template)
			}
			parts = append(parts, KeyPart{Literal: rest})
			break
		}
		if closing >= 0 && closing < open {
			return nil, fmt.Errorf("advisory key %q has a '}' without its '{'", template)
		}
		if open > 0 {
			parts = append(parts, KeyPart{Literal: rest[:open]})
		}
		rest = rest[open+1:]
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			return nil, fmt.Errorf("advisory key %q has a '{' that is never closed", template)
		}
		col := rest[:end]
		if col == "" || strings.ContainsAny(col, "{") {
			return nil, fmt.Errorf("advisory key %q has an empty or malformed placeholder", template)
		}
		parts = append(parts, KeyPart{Column: col})
		rest = rest[end+1:]
	}
	return parts, nil
}
