package dialects

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Admin is a dialect that serves the operator's commands (cmd/rowactor): what a queue
// table holds, group by group, and moving dead letters back into their queue. The command
// line finds it by type assertion on the Dialect, as the runtime finds a queue's form; it
// never switches on the database's name. Each method first checks the description against
// the live table, as Open does, and refuses a mismatch with a *ConfigError.
type Admin interface {
	// Stats counts the table's rows as of now, one GroupStats per group in group order
	// (one for a table without groups, even when it is empty). It reads the whole table
	// in one statement and writes nothing.
	Stats(ctx context.Context, t Table, now time.Time) ([]GroupStats, error)

	// Requeue moves the dead letters spec names back into the queue, in one transaction:
	// attempt back to 1, retry_after, locked_until, processed_at and dead_at cleared (for the
	// columns the table has). It reports how many rows moved, or with spec.DryRun how many
	// would, changing nothing. progress, when not nil, is called after each chunk of
	// spec.Chunk rows with the rows moved so far and the total, inside the transaction.
	Requeue(ctx context.Context, spec RequeueSpec, progress func(done, total int)) (int, error)
}

// QueueCounter is a dialect whose counts can leave the finished rows out (the
// dashboard's overview, refreshed every few seconds): QueueStats reads only the rows
// whose processed_at is NULL, which the claim index holds (it is partial on that
// condition, or leads with it), so its cost follows the rows queued, however many
// finished rows the table keeps. Without a processed_at column every row is unfinished
// and it reads the whole table, as Stats does.
type QueueCounter interface {
	// QueueStats is Stats over the unfinished rows: Processed is 0, a group whose rows
	// are all finished is left out, and Errors are those of unfinished rows (retrying,
	// delayed, dead-lettered).
	QueueStats(ctx context.Context, t Table, now time.Time) ([]GroupStats, error)
}

// UnfinishedWhere is the condition QueueStats adds to Stats' scan: " WHERE processed_at IS
// NULL" (quoted with quote), or "" without the column or when unfinished is false.
func UnfinishedWhere(t Table, quote func(string) string, unfinished bool) string {
	if !unfinished || t.ProcessedAt == "" {
		return ""
	}
	return " WHERE " + quote(t.ProcessedAt) + " IS NULL"
}

// GroupStats counts one group's rows at one moment. Every row is in exactly one of
// Processed, InWork, Delayed and Due, in that order of precedence.
type GroupStats struct {
	// Group is the group's value; "" for a table without groups.
	Group string
	// NullGroup is the rows whose group is NULL (a table of the service's own that allows
	// it): no subscription claims them.
	NullGroup bool
	// Due counts unfinished rows neither delayed nor known to be in work: claimable now.
	// Where the database cannot tell a row in work (InWorkCounted false), rows in work
	// read as due.
	Due int64
	// Delayed counts unfinished rows whose retry_after is in the future.
	Delayed int64
	// InWork counts unfinished rows a delivery holds: a lease not yet expired, or (on
	// servers with session locks) an advisory key held, which also holds the rows
	// waiting behind the delivery on that key.
	InWork int64
	// InWorkCounted says the database can tell rows in work: false in the row lock form,
	// whose locks only an extension could list (pgrowlocks), and for SQLite's advisory
	// keys, which live in the consuming process.
	InWorkCounted bool
	// Processed counts rows whose processed_at is set (0 without the column).
	Processed int64
	// Oldest is the due row the next claim takes (the lowest id); ID 0 when none is due.
	Oldest DueRow
	// Errors are the group's most frequent error texts (TopErrors at most, most frequent
	// first) among its rows that hold one; nil for a table without an error column.
	Errors []ErrorCount
}

// DueRow is what a table tells about when a due row became due.
type DueRow struct {
	ID int64
	// RetryAfter and LockedUntil are the row's columns; zero when NULL or not described.
	RetryAfter  time.Time
	LockedUntil time.Time
	// Headers is the raw headers column (a JSON object), nil when NULL or not described.
	Headers []byte
}

// RequeueSpec names the dead letters to move back into a queue: the rows of group
// FromGroup of Table, moved to ToGroup, or the rows of table FromTable (which must have
// every described column, as a dead-letter table does), moved into Table with their ids
// and every column the two tables share (MoveColumns).
// Exactly one of FromGroup and FromTable is set.
type RequeueSpec struct {
	Table     Table
	FromGroup string
	// ToGroup is the group the rows return to. It is always meant: "" is a group value
	// like any other.
	ToGroup   string
	FromTable string
	// IDs, when set, names the dead letters to move: each must be a row of the source
	// (a requeue naming one that is not moves nothing and fails). Empty: every row.
	IDs []int64
	// DryRun counts the rows and changes nothing.
	DryRun bool
	// Chunk is how many rows one statement moves; 0 means DefaultRequeueChunk.
	Chunk int
}

// DefaultRequeueChunk is how many rows one requeue statement moves unless told otherwise:
// short statements keep the bind lists small and let progress be told.
const DefaultRequeueChunk = 1000

// CheckRequeue refuses a requeue no database could run: no source or two, a group move
// on a table without groups, a move onto the source group itself, a dead-letter table
// that is not one identifier or is the queue table.
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
		return CheckDeadLetterName(t, spec.FromTable)
	}
	return nil
}

// RequeueValue is what a requeue writes into a column of the role: a fresh first attempt,
// no delay, no lease, not processed, not dead; "" keeps the column's value.
func RequeueValue(role string) string {
	switch role {
	case "Attempt":
		return "1"
	case "RetryAfter", "LockedUntil", "ProcessedAt", "DeadAt":
		return "NULL"
	}
	return ""
}

// StartRequeue does what every dialect's Requeue does first: CheckRequeue, then the
// dialect's checks of the live table and (when the rows come from one) the dead-letter
// table. It returns the source's arguments (the group, or none for a table) and, for a
// dead-letter table, the columns the requeue copies (MoveColumns, requeue true), which
// deadLetterColumns reads from the catalog and checks.
func StartRequeue(ctx context.Context, spec RequeueSpec, checkTable func(context.Context, Table) error,
	deadLetterColumns func(ctx context.Context, t Table, name string, requeue bool) ([]MoveColumn, error)) ([]any, []MoveColumn, error) {
	if err := CheckRequeue(spec); err != nil {
		return nil, nil, err
	}
	if err := checkTable(ctx, spec.Table); err != nil {
		return nil, nil, err
	}
	if spec.FromTable != "" {
		cols, err := deadLetterColumns(ctx, spec.Table, spec.FromTable, true)
		return nil, cols, err
	}
	return []any{spec.FromGroup}, nil, nil
}

// PickRequeue narrows the source rows a requeue locked (ids, in id order) to spec.IDs,
// when set: a named id that is not among them fails the requeue (wrapping ErrRowNotFound),
// before anything moved.
func PickRequeue(spec RequeueSpec, ids []int64) ([]int64, error) {
	if len(spec.IDs) == 0 {
		return ids, nil
	}
	have := make(map[int64]bool, len(ids))
	for _, id := range ids {
		have[id] = true
	}
	picked := slices.Clone(spec.IDs)
	slices.Sort(picked)
	for _, id := range picked {
		if !have[id] {
			from := fmt.Sprintf("dead-letter group %q", spec.FromGroup)
			if spec.FromTable != "" {
				from = "dead-letter table " + spec.FromTable
			}
			return nil, fmt.Errorf("row %d is not in %s; nothing moved: %w", id, from, ErrRowNotFound)
		}
	}
	return picked, nil
}

// ErrRequeueRace is a requeue chunk that changed another number of rows than it locked:
// something moved them meanwhile. The transaction rolled back; nothing moved.
var ErrRequeueRace = errors.New("rowactor: requeue: rows changed while they were being moved; nothing moved")

// RequeueChunks runs move over ids in chunks of chunk (DefaultRequeueChunk when 0), in
// order, and calls progress after each. move returns how many rows it moved; a chunk that
// moved another number of rows fails with ErrRequeueRace, so the caller rolls back.
func RequeueChunks(ctx context.Context, ids []int64, chunk int, move func(ctx context.Context, ids []int64) (int64, error), progress func(done, total int)) (int, error) {
	if chunk <= 0 {
		chunk = DefaultRequeueChunk
	}
	done := 0
	for done < len(ids) {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		part := ids[done:min(done+chunk, len(ids))]
		n, err := move(ctx, part)
		if err != nil {
			return done, err
		}
		if n != int64(len(part)) {
			return done, fmt.Errorf("%w (a chunk of %d rows from id %d moved %d)", ErrRequeueRace, len(part), part[0], n)
		}
		done += len(part)
		if progress != nil {
			progress(done, len(ids))
		}
	}
	return done, nil
}
