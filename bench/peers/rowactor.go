package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// rowactorQueue is one rowactor queue table on one database: a fresh table per round
// (rowactor.Schema's DDL), filled in bulk, dropped after the round, as in bench/.
type rowactorQueue struct {
	d     dialects.Dialect
	t     rowactor.Table
	stmts func() int64 // nil where the driver cannot count

	exec   func(ctx context.Context, text string) error
	count  func(ctx context.Context, table string) (int, error)
	insert func(ctx context.Context, table string, rows int) error
	settle func(ctx context.Context, table string) error
}

// tableFor names the table after the form and this process, so a run never touches
// another run's (or another test's) table.
func tableFor(f dialects.Form) rowactor.Table {
	t := rowactor.Table{Name: fmt.Sprintf("peers_%s_%d", f, os.Getpid()), ID: "id", Payload: "payload", Attempt: "attempt"}
	if f == dialects.FormLease {
		t.LockedUntil = "locked_until"
	}
	return t
}

func (q *rowactorQueue) contender(system string) contender {
	return contender{system: system, fill: q.fill, drain: q.drain, check: q.check, clean: q.drop}
}

func (q *rowactorQueue) fill(ctx context.Context, rows int) error {
	ddl, err := rowactor.Schema(q.d, q.t)
	if err != nil {
		return err
	}
	q.drop(ctx)
	for _, s := range strings.Split(ddl, ";\n") {
		if s = strings.TrimSpace(s); s != "" {
			if err := q.exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
	}
	if err := q.insert(ctx, q.t.Name, rows); err != nil {
		return err
	}
	if n, err := q.count(ctx, q.t.Name); err != nil || n != rows {
		return fmt.Errorf("filled %d rows of %d: %v", n, rows, err)
	}
	return q.settle(ctx, q.t.Name)
}

func (q *rowactorQueue) drop(ctx context.Context) {
	if err := q.exec(ctx, "DROP TABLE IF EXISTS "+q.t.Name); err != nil {
		fmt.Fprintf(os.Stderr, "peers: drop %s: %v\n", q.t.Name, err)
	}
}

// check: an ack deletes the row, so a drained table is empty.
func (q *rowactorQueue) check(ctx context.Context, _ int) error {
	left, err := q.count(ctx, q.t.Name)
	if err == nil && left != 0 {
		err = fmt.Errorf("%d rows left in %s after the drain", left, q.t.Name)
	}
	return err
}

// prefetch is the -prefetch flag: rowactor's Prefetch(n) in the lease form, given only
// when the flag is (-1, the default, leaves rowactor to size the room itself).
var prefetch int

// drain runs a broker on the shared dialect, as bench/drain.go does with tracing off:
// Workers(n), Lease(30s) in the lease form, rowactor's defaults otherwise (its poll
// interval, its own room for rows in hand), a handler that acks, and the latch counted
// down by WithOnSettled.
func (q *rowactorQueue) drain(ctx context.Context, workers, rows int) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	l := newLatch(rows)
	tl := newTally(rows, l)
	b, err := rowactor.New(q.d, rowactor.WithOnSettled(func(s rowactor.Settlement) {
		if s.Released && s.Err == nil {
			return // given back unstarted (every worker stalled): delivered again
		}
		if s.Err != nil || s.Step != "ack" {
			l.fail(fmt.Errorf("row %d: step %s: %v", s.ID, s.Step, s.Err))
			return
		}
		l.settled()
	}))
	if err != nil {
		return result{}, err
	}
	handler := func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		l.begin()
		tl.handle(seqOf(d.Payload()))
		return rowactor.Ack()
	}
	opts := []rowactor.SubscribeOption{rowactor.Workers(workers)}
	if q.t.Form() == dialects.FormLease {
		opts = append(opts, rowactor.Lease(leaseLength))
		if prefetch >= 0 {
			opts = append(opts, rowactor.Prefetch(prefetch))
		}
	}
	m := startMeter(q.stmts)
	_, err = b.Subscribe(ctx, q.t, "peers", handler, opts...)
	var r result
	if err == nil {
		var took time.Duration
		took, err = l.wait(ctx)
		r = m.stop(rows, took, tl.handledIn())
	}
	rep, serr := b.Shutdown(ctx)
	switch {
	case err != nil:
		return result{}, err
	case serr != nil:
		return result{}, fmt.Errorf("shutdown: %w", serr)
	case !rep.Drained || rep.Released != 0:
		return result{}, fmt.Errorf("shutdown: %+v", rep)
	}
	return r, tl.check()
}

// rowactorPostgres serves one form on the pool.
func rowactorPostgres(d dialects.Dialect, pool *pgxpool.Pool, stmts func() int64, f dialects.Form) *rowactorQueue {
	return &rowactorQueue{
		d: d, t: tableFor(f), stmts: stmts,
		exec: func(ctx context.Context, text string) error {
			_, err := pool.Exec(ctx, text)
			return err
		},
		count: func(ctx context.Context, table string) (int, error) {
			return countRows(ctx, pool, "SELECT count(*) FROM "+table)
		},
		insert: func(ctx context.Context, table string, rows int) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx) // a no-op after Commit
			err = insertBatches(rows, func(first, n int) (string, []any) {
				return insertText(table, n, func(i int) string { return "$" + strconv.Itoa(i+1) }), payloads(first, n)
			}, func(text string, args []any) error {
				// Simple protocol: a fill's texts are not worth a prepared statement each.
				_, err := tx.Exec(ctx, text, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
				return err
			})
			if err != nil {
				return err
			}
			return tx.Commit(ctx)
		},
		settle: func(ctx context.Context, table string) error { return settlePostgres(ctx, pool, table) },
	}
}

// rowactorSQLite serves the lease form (SQLite has no row locks) on the dialect's pool.
func rowactorSQLite(d dialects.Dialect, db *sql.DB) *rowactorQueue {
	return &rowactorQueue{
		d: d, t: tableFor(dialects.FormLease),
		exec: func(ctx context.Context, text string) error {
			_, err := db.ExecContext(ctx, text)
			return err
		},
		count: func(ctx context.Context, table string) (n int, err error) {
			err = db.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n)
			return n, err
		},
		insert: func(ctx context.Context, table string, rows int) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback() // a no-op after Commit
			err = insertBatches(rows, func(first, n int) (string, []any) {
				return insertText(table, n, func(int) string { return "?" }), payloads(first, n)
			}, func(text string, args []any) error {
				_, err := tx.ExecContext(ctx, text, args...)
				return err
			})
			if err != nil {
				return err
			}
			return tx.Commit()
		},
		settle: checkpointSQLite(db),
	}
}

// checkpointSQLite starts every drain from a checkpointed, truncated WAL, as bench/ does.
func checkpointSQLite(db *sql.DB) func(ctx context.Context, _ string) error {
	return func(ctx context.Context, _ string) error {
		_, err := db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)")
		return err
	}
}

// fillBatch is how many rows one INSERT carries.
const fillBatch = 500

// insertBatches runs multi-row INSERTs of fillBatch rows (the callers run them all in
// one transaction).
func insertBatches(rows int, build func(first, n int) (string, []any), run func(string, []any) error) error {
	for first := 0; first < rows; first += fillBatch {
		text, args := build(first, min(fillBatch, rows-first))
		if err := run(text, args); err != nil {
			return err
		}
	}
	return nil
}

// insertText renders a multi-row INSERT of n payloads.
func insertText(table string, n int, placeholder func(i int) string) string {
	var b strings.Builder
	b.WriteString("INSERT INTO " + table + " (payload) VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(" + placeholder(i) + ")")
	}
	return b.String()
}

func payloads(first, n int) []any {
	args := make([]any, n)
	for i := range args {
		args[i] = payloadFor(first + i)
	}
	return args
}
