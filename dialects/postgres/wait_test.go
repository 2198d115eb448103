package postgres

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// commitCutter cancels the context of the next COMMIT it sees, as when the caller's
// deadline comes between the statement's answer and the commit.
type commitCutter struct {
	mu     sync.Mutex
	cancel context.CancelFunc
}

func (c *commitCutter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.EqualFold(strings.TrimSpace(data.SQL), "commit") {
		c.mu.Lock()
		if c.cancel != nil {
			c.cancel()
			c.cancel = nil
		}
		c.mu.Unlock()
	}
	return ctx
}

func (*commitCutter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// claimOneLease publishes a row into a new lease table and claims it.
func claimOneLease(t *testing.T, d *Dialect) (dialects.Table, dialects.LeaseBatchQueue, dialects.Lease) {
	t.Helper()
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl}).(dialects.LeaseBatchQueue)
	now := time.Now()
	token := now.Truncate(time.Second).Add(30 * time.Second)
	if rows, err := q.ClaimLeases(ctx, now, token, 1); err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", dialecttest.IDs(rows), err)
	}
	return tbl, q, dialects.Lease{ID: id, Token: token}
}

// TestSettleLeaseWaitingErrorsNameTheTable: every error of a settlement names its
// table, as SettleLease's and MySQL's SettleLeaseWaiting's do; here the transaction's
// BEGIN fails (the context ended already).
func TestSettleLeaseWaitingErrorsNameTheTable(t *testing.T) {
	d := newDialect(t)
	tbl, q, held := claimOneLease(t, d)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	done, err := q.SettleLeaseWaiting(gone, dialects.Step{Kind: dialects.StepAck, Now: time.Now()}, held)
	if done || !errors.Is(err, context.Canceled) {
		t.Fatalf("waiting ack with an ended context: done %v, err %v", done, err)
	}
	if !strings.Contains(err.Error(), tbl.Name) {
		t.Fatalf("the error does not name the table %s: %v", tbl.Name, err)
	}
}

// TestSettleLeaseWaitingCutBeforeCommitIsNotDone: the statement ran in the waiting
// transaction, and the context ended before its COMMIT went out: the transaction rolls
// back, so the settlement must not report the row settled, and its error names the table.
func TestSettleLeaseWaitingCutBeforeCommitIsNotDone(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(withParams(testURL(), "pool_max_conns=4"))
	if err != nil {
		t.Fatal(err)
	}
	cut := &commitCutter{}
	cfg.ConnConfig.Tracer = cut
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	d := New(pool)
	tbl, q, held := claimOneLease(t, d)

	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cut.mu.Lock()
	cut.cancel = cancel
	cut.mu.Unlock()
	done, err := q.SettleLeaseWaiting(c, dialects.Step{Kind: dialects.StepAck, Now: time.Now()}, held)
	if err == nil {
		t.Fatal("the commit was cut, yet no error")
	}
	// The row is still the delivery's: nothing was settled.
	if ok, herr := q.Holding(ctx, []dialects.Lease{held}); herr != nil || len(ok) != 1 {
		t.Fatalf("the row after the cut commit: holding %v, %v", ok, herr)
	}
	if done {
		t.Errorf("the waiting ack reported the row settled, yet it rolled back (err %v)", err)
	}
	if !strings.Contains(err.Error(), tbl.Name) {
		t.Errorf("the error does not name the table %s: %v", tbl.Name, err)
	}
}
