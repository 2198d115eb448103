package rowactor

import (
	"context"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// Job is one row as Inspect read it: its columns (those the table describes; the others,
// and NULLs, read as zero values) and where it stands.
type Job = dialects.Job

// JobState is where a row stands: processed, in work, delayed or due, the first that
// holds, as `rowactor stats` counts rows.
type JobState = dialects.JobState

// The states of a row (Job.State).
const (
	JobProcessed = dialects.JobProcessed
	JobInWork    = dialects.JobInWork
	JobDelayed   = dialects.JobDelayed
	JobDue       = dialects.JobDue
)

// Inspect reads row id of table t and tells where it stands, in one statement that writes
// nothing: its attempt, payload, headers, delay, lease, processed time and last error, as
// the table describes them. In the row lock form (and for SQLite's advisory keys, which
// live in the consuming process) a row in work reads as due, and Job.InWorkCounted is
// false. It returns an error wrapping ErrNotFound when the table holds no such row, a
// *ConfigError when the description does not match the live table, and ErrClosed once
// Shutdown began.
func (b *Broker) Inspect(ctx context.Context, t Table, id int64) (Job, error) {
	in, ok := b.d.(dialects.Inspector)
	if !ok {
		return Job{}, fmt.Errorf("rowactor: the %s dialect cannot inspect rows (dialects.Inspector)", b.d.Name())
	}
	if !b.enterPublish() {
		return Job{}, fmt.Errorf("rowactor: inspect row %d of %s: %w", id, t.Name, ErrClosed)
	}
	defer b.leavePublish()
	return in.Inspect(ctx, t, id, time.Now())
}
