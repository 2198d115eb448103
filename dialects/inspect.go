package dialects

import (
	"context"
	"errors"
	"time"
)

// ErrRowNotFound reports a row id the table does not hold.
var ErrRowNotFound = errors.New("rowactor: no row with that id")

// Inspector is a dialect that tells what became of one row, for rowactor inspect and
// Broker.Inspect. Like Admin's methods, it first checks the description against the live
// table and refuses a mismatch with a *ConfigError.
type Inspector interface {
	// Inspect reads row id of t as of now, in one statement that writes nothing; it
	// returns an error wrapping ErrRowNotFound when the table holds no such row.
	Inspect(ctx context.Context, t Table, id int64, now time.Time) (Job, error)
}

// JobState is where a row stands, as Stats counts it: each row is in the first of
// cancelled, processed, in work, dead, delayed and due that holds.
type JobState int

const (
	// JobProcessed: processed_at is set.
	JobProcessed JobState = iota
	// JobInWork: a delivery holds the row, by a lease not yet expired or an advisory key
	// a session holds. See Job.InWorkCounted.
	JobInWork
	// JobDelayed: retry_after is in the future.
	JobDelayed
	// JobDue: claimable now, or in work where the database cannot tell.
	JobDue
	// JobDead: a dead letter. The table describes DeadAt and the row's is set: a
	// dead-letter move wrote it (into a group of the table, or into a dead-letter table),
	// and a requeue clears it. Such a row is not due, whatever its retry_after: it waits
	// for a requeue. Without a DeadAt column a dead letter reads as due or delayed.
	JobDead
	// JobCancelled: processed_at is set and the error column starts with
	// CancelledPrefix: a cancellation ended the row (the outcome Cancel, or
	// Broker.Cancel), and kept it. It comes before processed: such a row is never
	// JobProcessed. Without processed_at a cancelled row is deleted; without an error
	// column it reads as processed. (The last value, so the others keep theirs.)
	JobCancelled
)

func (s JobState) String() string {
	switch s {
	case JobProcessed:
		return "processed"
	case JobInWork:
		return "in work"
	case JobDelayed:
		return "delayed"
	case JobDue:
		return "due"
	case JobDead:
		return "dead"
	case JobCancelled:
		return "cancelled"
	}
	return "unknown"
}

// Job is one row as Inspect read it. A column the description does not name reads as
// its zero value, as does a NULL.
type Job struct {
	ID int64
	// Group is the row's group. NullGroup says it is NULL, and no subscription claims
	// it.
	Group     string
	NullGroup bool
	State     JobState
	// InWorkCounted says the database can tell a row in work. It is false in the row lock
	// form and for SQLite's advisory keys, where a row in work reads as due, as in Stats.
	InWorkCounted bool
	// Attempt is the attempts made: how many times the row's handler was called, as the
	// handlers read their attempts, in every form (AttemptsMade reads it from the
	// column, which each form counts its own way). 0 for a row never delivered.
	Attempt     int64
	Payload     []byte
	Headers     []byte
	RetryAfter  time.Time
	LockedUntil time.Time
	ProcessedAt time.Time
	// DeadAt is when the row died: the DeadAt column, which a dead-letter move sets.
	DeadAt time.Time
	// Error is the error column: the last failure's text, kept until an ack clears it.
	Error string
}
