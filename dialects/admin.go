package dialects

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Admin is a dialect that serves the operator's commands of cmd/rowactor: what a queue
// table holds, group by group, and moving dead letters back into their queue.
//
// The command line finds it by type assertion on the Dialect, as the runtime finds a
// queue's form; it never switches on the database's name. Each method first checks the
// description against the live table, as Open does, and refuses a mismatch with a
// *ConfigError.
type Admin interface {
	// Stats counts the table's rows as of now: one GroupStats per group, in group order.
	// A table without groups has one, even when it is empty. It reads the whole table in
	// one statement and writes nothing.
	Stats(ctx context.Context, t Table, now time.Time) ([]GroupStats, error)

	// Requeue moves the dead letters spec names back into the queue, in one transaction,
	// and reports how many rows moved. With spec.DryRun it reports how many would, and
	// changes nothing.
	//
	// A moved row's attempt goes back to 1, and its retry_after, locked_until,
	// processed_at and dead_at are cleared, for the columns the table has. progress, when
	// not nil, is called inside the transaction after each chunk of spec.Chunk rows, with
	// the rows moved so far and the total.
	Requeue(ctx context.Context, spec RequeueSpec, progress func(done, total int)) (int, error)
}

// QueueCounter is a dialect whose counts can leave the finished rows out, for the
// dashboard's overview, refreshed every few seconds.
//
// QueueStats reads only the rows whose processed_at is NULL, which the claim index holds:
// the index is partial on that condition, or leads with it. So its cost follows the rows
// queued, however many finished rows the table keeps. Without a processed_at column every
// row is unfinished, and it reads the whole table, as Stats does.
type QueueCounter interface {
	// QueueStats is Stats over the unfinished rows. Processed is 0, a group whose rows
	// are all finished is left out, and Errors are those of unfinished rows: retrying,
	// delayed or dead.
	QueueStats(ctx context.Context, t Table, now time.Time) ([]GroupStats, error)
}

// GroupLister is a dialect that lists the groups of a table's finished rows: the
// dashboard's overview shows a line for every group that has rows, and QueueStats leaves
// out a group whose rows are all finished.
//
// Its statement reads the finished rows: on MySQL through the claim index, which leads
// with the group; on PostgreSQL and SQLite, whose claim index leaves finished rows out, the
// whole table. So a caller that repeats it, as the dashboard does, keeps its answer a while.
type GroupLister interface {
	// FinishedGroups returns the distinct groups of t's rows whose processed_at is set,
	// in group order, at most limit of them, in one statement that writes nothing. A
	// description without a group column or a processed_at column is refused with a
	// *ConfigError.
	FinishedGroups(ctx context.Context, t Table, limit int) ([]GroupName, error)
}

// GroupName is one group's value. NullGroup says it is NULL.
type GroupName struct {
	Group     string
	NullGroup bool
}

// GroupStats counts one group's rows at one moment. Every row is in exactly one of
// Processed, InWork, Dead, Delayed and Due, in that order of precedence.
type GroupStats struct {
	// Group is the group's value; "" for a table without groups.
	Group string
	// NullGroup is the rows whose group is NULL, in a table of the service's own that
	// allows it. No subscription claims them.
	NullGroup bool
	// Due counts unfinished rows neither dead, delayed nor known to be in work: claimable
	// now. Where the database cannot tell a row in work, as InWorkCounted says, rows in
	// work read as due.
	Due int64
	// Delayed counts unfinished rows whose retry_after is in the future.
	Delayed int64
	// InWork counts unfinished rows a delivery holds: a lease not yet expired, or an
	// advisory key held on a server with session locks. A held key also holds the rows
	// waiting behind the delivery on that key.
	InWork int64
	// InWorkCounted says the database can tell rows in work. It is false in the row lock
	// form, whose locks only an extension such as pgrowlocks could list, and for SQLite's
	// advisory keys, which live in the consuming process.
	InWorkCounted bool
	// Processed counts rows whose processed_at is set, but for the cancelled ones; 0
	// without the column.
	Processed int64
	// Cancelled counts the rows a cancellation ended and the table kept (JobCancelled):
	// processed_at set and the error column starting with CancelledPrefix. They are
	// finished, but not counted in Processed: Processed + Cancelled are the finished rows.
	// 0 without processed_at or an error column.
	Cancelled int64
	// Dead counts the dead letters: unfinished rows, not in work, whose DeadAt is set (a
	// dead-letter move into a group of the table set it); 0 without the column. They
	// wait for a requeue, so they are neither due nor delayed.
	Dead int64
	// Oldest is the due row the next claim takes: the lowest id. Its ID is 0 when none
	// is due; a dead row is never the oldest due.
	Oldest DueRow
	// Errors are the group's most frequent error texts among its rows that hold one, at
	// most three, most frequent first. nil for a table without an error column.
	Errors []ErrorCount
}

// DueRow is what a table tells about when a due row became due.
type DueRow struct {
	ID int64
	// RetryAfter and LockedUntil are the row's columns; zero when NULL or not described.
	RetryAfter  time.Time
	LockedUntil time.Time
	// Headers is the raw headers column, a JSON object; nil when NULL or not described.
	Headers []byte
}

// RequeueSpec names the dead letters to move back into a queue. Exactly one of
// FromGroup and FromTable is set:
//
//   - FromGroup moves the rows of that group of Table to ToGroup;
//   - FromTable moves the rows of that table into Table, with their ids and every
//     column the two tables share. The table must have every described column, as a
//     dead-letter table does.
type RequeueSpec struct {
	Table     Table
	FromGroup string
	// ToGroup is the group the rows return to. It is always meant: "" is a group value
	// like any other.
	ToGroup   string
	FromTable string
	// IDs, when set, names the dead letters to move. Each must be a row of the source: a
	// requeue naming one that is not moves nothing and fails. Empty moves every row.
	IDs []int64
	// DryRun counts the rows and changes nothing.
	DryRun bool
	// Chunk is how many rows one statement moves; 0 means DefaultRequeueChunk.
	Chunk int
}

// DefaultRequeueChunk is how many rows one requeue statement moves unless told otherwise:
// short statements keep the bind lists small and let progress be told.
const DefaultRequeueChunk = 1000

// CheckRequeue refuses a requeue no database could run:
//
//   - no source, or two;
//   - a group move on a table without groups;
//   - a move onto the source group itself;
//   - a dead-letter table that is not one identifier, or is the queue table.
func CheckRequeue(spec RequeueSpec) error {
	t := spec.Table
	if err := CheckDescription(t); err != nil {
		return err
	}
	switch {
	case spec.FromGroup == "" && spec.FromTable == "":
		return &ConfigError{Table: t.Name, Option: "requeue source",
			Reason: "no dead letters named", Fix: "name a dead-letter group (FromGroup) or a dead-letter table (FromTable)"}
	case spec.FromGroup != "" && spec.FromTable != "":
		return &ConfigError{Table: t.Name, Option: "requeue source",
			Reason: "dead letters come from a group or from a table, not both", Fix: "keep FromGroup or FromTable"}
	case spec.FromGroup != "" && t.Group == "":
		return &ConfigError{Table: t.Name, Option: "Table.Group",
			Reason: "a dead-letter group needs the table's group column, and the description names none",
			Fix:    "name the group column, or requeue from a dead-letter table"}
	case spec.FromGroup != "" && spec.FromGroup == spec.ToGroup:
		return &ConfigError{Table: t.Name, Option: "requeue destination",
			Reason: fmt.Sprintf("the rows would move from group %q to itself", spec.FromGroup),
			Fix:    "name the queue's group as the destination"}
	case spec.FromTable != "" && spec.ToGroup != "":
		return &ConfigError{Table: t.Name, Option: "requeue destination",
			Reason: "rows moved from a dead-letter table keep their group",
			Fix:    "drop the destination group"}
	}
	seen := make(map[int64]bool, len(spec.IDs))
	for _, id := range spec.IDs {
		if id <= 0 || seen[id] {
			return &ConfigError{Table: t.Name, Option: "requeue ids",
				Reason: fmt.Sprintf("row id %d is not a positive id, or is named twice", id), Fix: "name each dead letter's id once"}
		}
		seen[id] = true
	}
	if spec.Chunk < 0 {
		return &ConfigError{Table: t.Name, Option: "requeue chunk",
			Reason: fmt.Sprintf("chunk %d is negative", spec.Chunk), Fix: "use a positive chunk, or 0 for the default"}
	}
	if spec.FromTable != "" {
		return CheckDeadLetterName(t, spec.FromTable, true)
	}
	return nil
}

// ErrRequeueRace is a requeue chunk that changed another number of rows than it locked:
// something moved them meanwhile. The transaction rolled back; nothing moved.
var ErrRequeueRace = errors.New("rowactor: requeue: rows changed while they were being moved; nothing moved")
