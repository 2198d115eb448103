package adminsql

import (
	"context"
	"fmt"
	"slices"

	"github.com/rowactor/rowactor/dialects"
)

// UnfinishedWhere is the condition QueueStats adds to Stats' scan: " WHERE processed_at IS
// NULL" (quoted with quote), or "" without the column or when unfinished is false.
func UnfinishedWhere(t dialects.Table, quote func(string) string, unfinished bool) string {
	if !unfinished || t.ProcessedAt == "" {
		return ""
	}
	return " WHERE " + quote(t.ProcessedAt) + " IS NULL"
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
func StartRequeue(ctx context.Context, spec dialects.RequeueSpec, checkTable func(context.Context, dialects.Table) error,
	deadLetterColumns func(ctx context.Context, t dialects.Table, name string, requeue bool) ([]MoveColumn, error)) ([]any, []MoveColumn, error) {
	if err := dialects.CheckRequeue(spec); err != nil {
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
func PickRequeue(spec dialects.RequeueSpec, ids []int64) ([]int64, error) {
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
			return nil, fmt.Errorf("row %d is not in %s; nothing moved: %w", id, from, dialects.ErrRowNotFound)
		}
	}
	return picked, nil
}

// RequeueChunks runs move over ids in chunks of chunk (DefaultRequeueChunk when 0), in
// order, and calls progress after each. move returns how many rows it moved; a chunk that
// moved another number of rows fails with ErrRequeueRace, so the caller rolls back.
func RequeueChunks(ctx context.Context, ids []int64, chunk int, move func(ctx context.Context, ids []int64) (int64, error), progress func(done, total int)) (int, error) {
	if chunk <= 0 {
		chunk = dialects.DefaultRequeueChunk
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
			return done, fmt.Errorf("%w (a chunk of %d rows from id %d moved %d)", dialects.ErrRequeueRace, len(part), part[0], n)
		}
		done += len(part)
		if progress != nil {
			progress(done, len(ids))
		}
	}
	return done, nil
}
