// Quickstart: a job queue in a SQLite file, from publish to dead letter.
//
// It publishes 10,000 jobs, consumes them with 8 workers, and lets each job's number
// decide its fate:
//
//   - every 100th job always fails: it is retried until MaxAttempts(3) moves it to
//     the dead-letter group "jobs-dead";
//   - every other 10th job fails once and succeeds on its second attempt;
//   - every other job succeeds at once.
//
// Then it checks in SQL that every row is accounted for, prints one summary line, and
// exits 1 if anything is missing.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

const (
	jobs     = 10_000
	queue    = "jobs"
	deadPool = "jobs-dead"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()

	dir, err := os.MkdirTemp("", "rowactor-quickstart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "queue.db")

	// The settlement hook sees what became of every delivery: the statement that ran and
	// whether it took effect. Counting here, rather than in the handler, counts only what
	// the database actually recorded. (The handler returns Retry 1,200 times, but the
	// third Retry of a 100th job runs as a dead-letter move, not a retry.)
	var handled, retried, deadLettered, settleErrs atomic.Int64
	onSettled := func(s rowactor.Settlement) {
		if s.Err != nil {
			settleErrs.Add(1)
			fmt.Fprintf(os.Stderr, "settlement of row %d (%s): %v\n", s.ID, s.Step, s.Err)
			return
		}
		switch s.Step {
		case "ack":
			handled.Add(1)
		case "retry":
			retried.Add(1)
		case "dead_letter":
			deadLettered.Add(1)
		}
	}

	// Each dead-letter move logs a warning; this run expects 100 of them and counts them
	// instead, so only errors reach stderr.
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

	b, err := rowactor.Open(ctx, "sqlite:"+path, rowactor.WithOnSettled(onSettled), rowactor.WithLogger(quiet))
	if err != nil {
		return err
	}
	// Shutdown closes the database; it is called explicitly below, this covers early returns.
	defer b.Shutdown(context.Background()) // after the explicit Shutdown this only returns ErrClosed

	// A lease-form table: locked_until makes a claim a time-limited lease, attempt counts
	// deliveries (MaxAttempts needs it), and "queue" holds several queues in one table, so
	// dead letters move by a plain UPDATE of that column.
	table := rowactor.Table{
		Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until", Headers: "headers",
	}
	if err := b.ApplySchema(ctx, table); err != nil {
		return fmt.Errorf("create table: %w", err)
	}

	// One Publish per job, each its own autocommit INSERT: fast enough here (about a
	// second). For bulk loads, b.PublishTx inside one *sql.Tx commits them all at once.
	for n := 1; n <= jobs; n++ {
		if _, err := b.Publish(ctx, table, queue, []byte(strconv.Itoa(n))); err != nil {
			return err
		}
	}

	handler := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		n, err := strconv.Atoi(string(d.Payload()))
		switch {
		case err != nil:
			return rowactor.Drop() // a poison message: nothing would ever make it succeed
		case n%100 == 0:
			return rowactor.Retry() // always fails; MaxAttempts decides when to stop
		case n%10 == 0 && d.Attempt() == 1:
			return rowactor.Retry() // fails once, succeeds on attempt 2
		}
		return rowactor.Ack()
	}

	start := time.Now()
	_, err = b.Subscribe(ctx, table, queue, handler,
		rowactor.Workers(8),
		rowactor.PollInterval(100*time.Millisecond),
		rowactor.MaxAttempts(3), rowactor.DeadLetterGroup(deadPool))
	if err != nil {
		return err
	}

	// Every job ends either acked or dead-lettered.
	deadline := time.After(2 * time.Minute)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
wait:
	for handled.Load()+deadLettered.Load() < jobs {
		select {
		case <-tick.C:
		case <-deadline:
			break wait
		}
	}
	elapsed := time.Since(start)

	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rep, err := b.Shutdown(sctx)
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}

	// Shutdown closed the broker's pool; open the file again to check what it holds.
	v, err := sqlite.Open(ctx, path)
	if err != nil {
		return err
	}
	defer v.Close()
	var left, dead, deadOK, total int
	err = v.DB().QueryRowContext(ctx, `SELECT
		    count(*) FILTER (WHERE queue = ?),
		    count(*) FILTER (WHERE queue = ?),
		    -- attempt reads 4, not 3: the column starts at 1 and each claim adds one
		    -- before the handler runs (the delivery reports the value before the claim).
		    -- Three deliveries took it 1 -> 4, and the third one's Retry, reporting
		    -- Attempt() == 3 == MaxAttempts, moved the row instead of retrying it.
		    count(*) FILTER (WHERE queue = ? AND attempt = 4 AND locked_until IS NULL
		                     AND CAST(payload AS INTEGER) % 100 = 0),
		    count(*)
		FROM jobs`, queue, deadPool, deadPool).Scan(&left, &dead, &deadOK, &total)
	if err != nil {
		return err
	}

	secs := elapsed.Seconds()
	fmt.Printf("handled=%d retried=%d dead_lettered=%d seconds=%.2f msgs_per_s=%.0f\n",
		handled.Load(), retried.Load(), deadLettered.Load(), secs, jobs/secs)

	// Acked rows are deleted, so the table should hold exactly the 100 dead letters.
	var missing []error
	check := func(what string, got, want int64) {
		if got != want {
			missing = append(missing, fmt.Errorf("%s: got %d, want %d", what, got, want))
		}
	}
	check("acked jobs (hook)", handled.Load(), jobs-jobs/100)
	check("retries (hook)", retried.Load(), jobs/10-jobs/100+2*(jobs/100))
	check("dead-lettered jobs (hook)", deadLettered.Load(), jobs/100)
	check("settlement errors", settleErrs.Load(), 0)
	check("rows left in queue "+queue, int64(left), 0)
	check("rows in group "+deadPool, int64(dead), jobs/100)
	check("dead letters that are 100th jobs with attempt 4 and no lease", int64(deadOK), jobs/100)
	check("rows in the table", int64(total), jobs/100)
	check("rows released unsettled at shutdown", int64(rep.Released), 0)
	return errors.Join(missing...)
}
