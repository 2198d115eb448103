package dialecttest

import (
	"errors"
	"strings"
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

// The helpers below serve the dialects' own tests as well as the suite.

// OpenQueue opens spec on d and closes the queue when t ends.
func OpenQueue(t *testing.T, d dialects.Dialect, spec dialects.QueueSpec) dialects.Queue {
	t.Helper()
	q, err := d.Open(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// OpenLease opens spec on d as a LeaseQueue.
func OpenLease(t *testing.T, d dialects.Dialect, spec dialects.QueueSpec) dialects.LeaseQueue {
	t.Helper()
	q := OpenQueue(t, d, spec)
	lq, ok := q.(dialects.LeaseQueue)
	if !ok {
		t.Fatalf("Open returned %T, not a LeaseQueue", q)
	}
	return lq
}

// OpenRowLock opens spec on d as a RowLockQueue.
func OpenRowLock(t *testing.T, d dialects.Dialect, spec dialects.QueueSpec) dialects.RowLockQueue {
	t.Helper()
	q := OpenQueue(t, d, spec)
	rq, ok := q.(dialects.RowLockQueue)
	if !ok {
		t.Fatalf("Open returned %T, not a RowLockQueue", q)
	}
	return rq
}

// OpenAdvisory opens spec on d as an AdvisoryQueue.
func OpenAdvisory(t *testing.T, d dialects.Dialect, spec dialects.QueueSpec) dialects.AdvisoryQueue {
	t.Helper()
	q := OpenQueue(t, d, spec)
	aq, ok := q.(dialects.AdvisoryQueue)
	if !ok {
		t.Fatalf("Open returned %T, not an AdvisoryQueue", q)
	}
	return aq
}

// Publish publishes m into tbl through d's pool and returns its id.
func Publish(t *testing.T, d dialects.Dialect, tbl dialects.Table, m dialects.Message) int64 {
	t.Helper()
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	id, err := p.Publish(ctx, nil, m)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// ConfigError fails unless err is a *dialects.ConfigError with a reason and a fix.
func ConfigError(t *testing.T, err error) *dialects.ConfigError {
	t.Helper()
	var ce *dialects.ConfigError
	if !errors.As(err, &ce) || !errors.Is(err, dialects.ErrConfig) {
		t.Fatalf("want a *ConfigError, got %T %v", err, err)
	}
	if ce.Fix == "" || ce.Reason == "" {
		t.Errorf("config error without reason or fix: %v", err)
	}
	return ce
}

// Contains fails unless s contains sub.
func Contains(t *testing.T, s, sub string) {
	t.Helper()
	if !strings.Contains(s, sub) {
		t.Errorf("%q does not contain %q", s, sub)
	}
}

// IDs are the rows' ids in order.
func IDs(rows []dialects.Row) []int64 {
	var out []int64
	for _, r := range rows {
		out = append(out, r.ID)
	}
	return out
}
