package dialects

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// RowsBusyError reports leases a batched statement left alone because another session
// held their rows' locks while the rows still held their tokens. The batch is an
// extension round, or a batch of acks or releases. A dialect returns it beside the ids it
// did settle.
//
// Waiting for such a lock inside the batch would hold the locks the batch already took
// on every other row in it. So the batch skips the row and settles the rest. The leases
// named are still their holders': an extension round keeps their tokens and comes back
// for them, and a batch settles them one by one, where waiting for the lock costs only
// that row.
type RowsBusyError struct {
	IDs []int64
}

func (e *RowsBusyError) Error() string {
	return fmt.Sprintf("rowactor: %d rows locked by another session were left for a later statement", len(e.IDs))
}

// Busy reports whether id is one of the rows left alone.
func (e *RowsBusyError) Busy(id int64) bool { return slices.Contains(e.IDs, id) }

// Missing returns the leases of held whose rows are not in done, each row once.
func Missing(held []Lease, done []int64) []Lease {
	if len(done) == len(held) {
		return nil // each row of held is named once, and each was done
	}
	seen := make(map[int64]struct{}, len(held))
	for _, id := range done {
		seen[id] = struct{}{}
	}
	var out []Lease
	for _, l := range held {
		if _, ok := seen[l.ID]; !ok {
			seen[l.ID] = struct{}{}
			out = append(out, l)
		}
	}
	return out
}

// IDs returns the row ids of leases.
func IDs(leases []Lease) []int64 {
	out := make([]int64, len(leases))
	for i, l := range leases {
		out[i] = l.ID
	}
	return out
}

// WaitingExtender is a lease queue that can also extend leases by waiting, up to ctx,
// for the locks other sessions hold on their rows, where ExtendLeases skips such rows.
//
// The renewer uses it for leases it found busy, one statement at a time. A lock held a
// moment, such as another claim's read of the row, is then waited out before the lease
// runs out, and at most the renewer's one connection waits. An extension cut short by
// ctx moves nothing, then or later, as for LeaseBatchQueue.SettleLeaseWaiting.
type WaitingExtender interface {
	ExtendLeasesWaiting(ctx context.Context, until time.Time, held []Lease) ([]int64, error)
}
