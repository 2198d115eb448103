package dialecttest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

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
	return openAs[dialects.LeaseQueue](t, d, spec, "a LeaseQueue")
}

// OpenRowLock opens spec on d as a RowLockQueue.
func OpenRowLock(t *testing.T, d dialects.Dialect, spec dialects.QueueSpec) dialects.RowLockQueue {
	t.Helper()
	return openAs[dialects.RowLockQueue](t, d, spec, "a RowLockQueue")
}

// OpenAdvisory opens spec on d as an AdvisoryQueue.
func OpenAdvisory(t *testing.T, d dialects.Dialect, spec dialects.QueueSpec) dialects.AdvisoryQueue {
	t.Helper()
	return openAs[dialects.AdvisoryQueue](t, d, spec, "an AdvisoryQueue")
}

// openAs opens spec on d and fails unless the queue serves Q.
func openAs[Q any](t *testing.T, d dialects.Dialect, spec dialects.QueueSpec, what string) Q {
	t.Helper()
	q := OpenQueue(t, d, spec)
	served, ok := q.(Q)
	if !ok {
		t.Fatalf("Open returned %T, not %s", q, what)
	}
	return served
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

// NewSession opens an advisory session on q, aborted when t ends.
func NewSession(t *testing.T, q dialects.AdvisoryQueue) dialects.Session {
	t.Helper()
	s, err := q.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Abort(ctx) })
	return s
}

// TryLock locks key on s and reports whether it was free.
func TryLock(t *testing.T, s dialects.Session, key string) bool {
	t.Helper()
	ok, err := s.TryLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// ClaimOne publishes a row into group g of tbl and claims it on q, which must take that
// row, with the lease until t0+1m.
func ClaimOne(t *testing.T, d dialects.Dialect, q dialects.LeaseQueue, tbl dialects.Table) dialects.Lease {
	t.Helper()
	id := Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 || rows[0].ID != id {
		t.Fatalf("claim: %v %v", IDs(rows), err)
	}
	return dialects.Lease{ID: rows[0].ID, Token: rows[0].Token}
}

// ClaimTx claims a row of a transactional row-lock queue as of t0 and sets the savepoint
// the runtime sets before the handler runs; the claim is rolled back when t ends.
func ClaimTx(t *testing.T, q dialects.RowLockQueue) dialects.TxLockedClaim {
	t.Helper()
	c := claimLocked(t, q, t0)
	tc, ok := c.(dialects.TxLockedClaim)
	if !ok {
		c.Rollback(ctx)
		t.Fatalf("a transactional claim is %T, not a TxLockedClaim", c)
	}
	t.Cleanup(func() { tc.Rollback(ctx) })
	if err := tc.Savepoint(ctx); err != nil {
		t.Fatal(err)
	}
	return tc
}

// Unquote undoes a quoting that wraps text in q and doubles q inside it, as the dialects'
// fuzz tests check their identifier and literal quoting. ok is false when the text is not
// so wrapped or holds a lone q: a quote the parser would read as the end of the
// identifier or literal.
func Unquote(quoted string, q byte) (string, bool) {
	if len(quoted) < 2 || quoted[0] != q || quoted[len(quoted)-1] != q {
		return "", false
	}
	inner := quoted[1 : len(quoted)-1]
	var b strings.Builder
	for i := 0; i < len(inner); i++ {
		if inner[i] == q {
			if i+1 >= len(inner) || inner[i+1] != q {
				return "", false
			}
			i++
		}
		b.WriteByte(inner[i])
	}
	return b.String(), true
}

// DataFault checks that d classifies err, bare and wrapped as the runtime wraps a
// settlement's error, as dialects.FaultData: a value the row's data cannot take. what
// names the case in failures.
func DataFault(t *testing.T, d dialects.Dialect, what string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	for _, e := range []error{err, fmt.Errorf("settle retry of row 1: %w", err)} {
		if got := dialects.Classify(d, e); got != dialects.FaultData {
			t.Errorf("%s: Classify(%v) = %v, want %v", what, e, got, dialects.FaultData)
		}
	}
}

// LockFirst locks the first candidate of q on a session of its own, as a claimer does
// before its take, and returns the session and the candidate.
func LockFirst(t *testing.T, q dialects.AdvisoryQueue) (dialects.Session, dialects.Candidate) {
	t.Helper()
	cands, err := q.Candidates(ctx, t0, 1)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates %v %v", cands, err)
	}
	s := NewSession(t, q)
	if !TryLock(t, s, cands[0].Key) {
		t.Fatal("lock refused")
	}
	return s, cands[0]
}
