package dialecttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
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

// SchemaText checks the text d's Schema renders: wantLease for a lease table named name
// with a processed_at column, wantAdvisory for table "m" (id, body) keyed on {id} and
// {account}; a description without columns it refuses.
func SchemaText(t *testing.T, d dialects.Dialect, name, wantLease, wantAdvisory string) {
	t.Helper()
	tbl := LeaseTable(name)
	tbl.ProcessedAt = "processed_at"
	for _, c := range []struct {
		tbl  dialects.Table
		want string
	}{
		{tbl, wantLease},
		{dialects.Table{Name: "m", ID: "id", Payload: "body", AdvisoryKey: "m-{id}-{account}"}, wantAdvisory},
	} {
		got, err := d.Schema(c.tbl)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("schema:\n%s\nwant:\n%s", got, c.want)
		}
	}
	if _, err := d.Schema(dialects.Table{Name: "n"}); err == nil {
		t.Error("a description without columns was rendered")
	}
}

// Env is the environment variable name's value, or fallback when it is unset or empty:
// the dialects' tests name their servers so.
func Env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// CreateTable creates the table d's Schema renders for tbl, running each statement of it
// with exec.
func CreateTable(t *testing.T, d dialects.Dialect, tbl dialects.Table, exec func(stmt string)) {
	t.Helper()
	ddl, err := d.Schema(tbl)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(s) != "" {
			exec(s)
		}
	}
}

// CatalogColumns checks a dialect's reading of its catalog (its unexported catalogOf):
// table's columns print as want (fmt.Sprint), and a missing table has none.
func CatalogColumns(t *testing.T, catalog func(context.Context, string) ([]adminsql.CatalogColumn, error), table, want string) {
	t.Helper()
	cols, err := catalog(ctx, table)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(cols); got != want {
		t.Fatalf("catalog of %s: %s, want %s", table, got, want)
	}
	if cols, err := catalog(ctx, table+"_missing"); err != nil || len(cols) != 0 {
		t.Fatalf("a missing table: %v, %v", cols, err)
	}
}

// DeadLetterOne claims one row of q as of t0 and moves it to the dead-letter table; it
// returns the row's id.
func DeadLetterOne(t *testing.T, q dialects.LeaseQueue) int64 {
	t.Helper()
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(30*time.Second), 1)
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v, %v", rows, err)
	}
	ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter, Now: t0}, dialects.Lease{ID: rows[0].ID, Token: rows[0].Token})
	if err != nil || !ok {
		t.Fatalf("dead-letter move: %v, %v", ok, err)
	}
	return rows[0].ID
}
