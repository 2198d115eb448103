package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/leaserenewer"
)

// rawBatchSize is how many rows one claim of the batched raw loop takes: the figure the
// issue's reference loop uses (one statement claims 32 rows, acks go in batches).
const rawBatchSize = 32

// drainRawBatch is the fastest hand-written lease loop we know on the dialect's own
// statements: each of n goroutines claims up to 32 rows in one statement, "handles" them,
// and acks them all in one token-fenced statement (dialects.LeaseBatchQueue). It has no
// lease renewal and no per-row isolation: a slow row holds up its whole batch. It is the
// bar for the lease form's batching, not a design to copy.
func drainRawBatch(ctx context.Context, tg *target, t tableDesc, workers, rows int, _ bool) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	l := newLatch(rows)
	before, cpuBefore, stmtsBefore := mallocs(), cpuTime(), tg.stmtCount()
	retriesBefore := tg.retries.Load()
	qs, closeQueues, err := tg.openQueues(ctx, dialects.QueueSpec{Table: t.Table})
	if err != nil {
		return result{}, err
	}
	defer closeQueues()
	if _, ok := qs[0].(dialects.LeaseBatchQueue); !ok {
		return result{}, fmt.Errorf("the %s dialect cannot settle leases in batches", tg.db)
	}
	next := spread[dialects.LeaseBatchQueue](qs)
	took, total, err := runLoops(ctx, cancel, l, workers*len(qs), func(ctx context.Context, l *latch) (tally, error) {
		return rawBatchLease(ctx, next(), tg.costs, l)
	})
	allocs, cpu, driver := mallocs()-before, cpuTime()-cpuBefore, tg.stmtCount()-stmtsBefore
	if err != nil {
		return result{}, err
	}
	r := result{rows: rows, took: took, mallocs: allocs, cpu: cpu, stmts: total.stmts, stmtsBy: "construction"}
	if tg.driverStmts != nil {
		r.stmts, r.stmtsBy = driver, "driver"
	}
	if n := tg.retries.Load() - retriesBefore; n > 0 {
		r.note = fmt.Sprintf("%d claims or settlements run again after a certification conflict", n)
	}
	return r, nil
}

func rawBatchLease(ctx context.Context, q dialects.LeaseBatchQueue, c costs, l *latch) (tl tally, _ error) {
	held := make([]dialects.Lease, 0, rawBatchSize)
	for {
		now := time.Now()
		claimed, err := q.ClaimLeases(ctx, now, leaserenewer.Expiry(now, lease), rawBatchSize)
		if err != nil {
			return tl, err
		}
		if len(claimed) == 0 {
			tl.stmts += int64(c.claimLeaseEmpty)
			return tl, nil
		}
		tl.stmts += int64(c.claimLease)
		l.begin()
		held = held[:0]
		for _, r := range claimed {
			held = append(held, dialects.Lease{ID: r.ID, Token: r.Token})
		}
		total := len(held)
		for len(held) > 0 {
			settled, err := q.SettleLeases(ctx, dialects.StepAck, time.Now(), held)
			tl.stmts += int64(c.settleBatch)
			var busy *dialects.RowsBusyError
			if errors.As(err, &busy) {
				// Another goroutine's claim locked some of the rows for a moment (on
				// PostgreSQL a claim's skipping read may lock a row it then finds leased,
				// until it commits): settle those again, as rowactor's busy lane does.
				err = nil
			}
			if err != nil {
				return tl, err
			}
			for range settled {
				l.settled()
			}
			kept := held[:0]
			for _, h := range held {
				if busy != nil && busy.Busy(h.ID) {
					kept = append(kept, h)
				}
			}
			if len(settled)+len(kept) != len(held) {
				return tl, fmt.Errorf("%d of %d leases lost", len(held)-len(settled)-len(kept), total)
			}
			held = kept
		}
	}
}
