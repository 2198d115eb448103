package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/rowactor/rowactor/dialects"
)

// waiting runs fn in a transaction of its own at read committed, for statements that wait
// for row locks other sessions hold, and commits it once fn returned nil.
//
// pgx gives up on a statement whose context ends by closing its socket, and PostgreSQL
// does not notice that while the statement waits in a lock's queue: run on its own
// (autocommit), the orphan would take the lock once the other session let it go and
// commit, unseen by its caller. Here the server ends the wait itself when ctx's deadline
// comes (lock_timeout, reported as *dialects.RowsBusyError naming held), and a statement
// the client gave up on anyway (ctx cancelled, or the deadline seen first) never commits:
// the transaction waits for a COMMIT that is only sent after its result was read, and the
// server rolls it back when it finds the socket closed.
func (d *Dialect) waiting(ctx context.Context, held []dialects.Lease, fn func(tx pgx.Tx) error) error {
	begin := "BEGIN ISOLATION LEVEL READ COMMITTED"
	if dl, ok := ctx.Deadline(); ok {
		begin += "; SET LOCAL lock_timeout = " + strconv.FormatInt(max(time.Until(dl).Milliseconds(), 1), 10)
	}
	tx, err := d.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = tx.Rollback(rctx)
		cancel()
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "55P03" {
			return &dialects.RowsBusyError{IDs: dialects.IDs(held)}
		}
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// ExtendLeasesWaiting moves the leases of held that still hold their tokens, waiting (up
// to ctx) for rows another session has locked; a wait cut short moves nothing (waiting).
func (q *leaseQueue) ExtendLeasesWaiting(ctx context.Context, until time.Time, held []dialects.Lease) ([]int64, error) {
	ids, tokens := leaseArrays(held)
	var moved []int64
	err := q.d.waiting(ctx, held, func(tx pgx.Tx) error {
		var err error
		moved, err = queryIDs(ctx, tx, q.extendWait.text, until, ids, tokens)
		return err
	})
	if err != nil {
		if busy := (*dialects.RowsBusyError)(nil); errors.As(err, &busy) {
			return nil, err
		}
		return nil, q.errorf("extend", err)
	}
	return moved, nil
}

// SettleLeaseWaiting runs a step's statement, waiting (up to ctx) for the row's lock; a
// wait cut short settles nothing (waiting).
func (q *leaseQueue) SettleLeaseWaiting(ctx context.Context, step dialects.Step, held dialects.Lease) (bool, error) {
	if step.Event != "" {
		return false, q.errorf(step.Kind.String(), fmt.Errorf("a step with an event does not wait for its row in a batch"))
	}
	var (
		done bool
		serr error // the statement's own error, which names the table already
	)
	err := q.d.waiting(ctx, []dialects.Lease{held}, func(tx pgx.Tx) error {
		done, serr = q.settleOn(ctx, tx, step, held)
		return serr
	})
	if busy := (*dialects.RowsBusyError)(nil); errors.As(err, &busy) {
		return false, err
	}
	if err != nil {
		// The transaction did not commit (or its COMMIT's answer never came): nothing is
		// reported settled.
		if err != serr {
			err = q.errorf(step.Kind.String(), err) // BEGIN or COMMIT
		}
		return false, err
	}
	return done, nil
}
