package rowactor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// A job queue in a SQLite file: describe the table, create it, subscribe a handler,
// publish, and shut down.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)

	b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	jobs := rowactor.Table{
		Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until",
	}
	ddl, _ := rowactor.Schema(b.Dialect(), jobs)
	if _, err := b.Dialect().(*sqlite.Dialect).DB().Exec(ddl); err != nil {
		fmt.Println(err)
		return
	}

	done := make(chan string)
	_, err = b.Subscribe(ctx, jobs, "emails", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if d.Attempt() == 1 {
			return rowactor.RetryAfter(0) // the handler picks its own backoff
		}
		done <- fmt.Sprintf("sent %s on attempt %d", d.Payload(), d.Attempt())
		return rowactor.Ack()
	}, rowactor.Workers(4), rowactor.Lease(time.Minute), rowactor.MaxAttempts(5), rowactor.DeadLetterGroup("emails-dead"))
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := b.Publish(ctx, jobs, "emails", []byte("welcome@example.com")); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(<-done)

	report, err := b.Shutdown(ctx)
	fmt.Println(report.Drained, report.Released, err)
	// Output:
	// sent welcome@example.com on attempt 2
	// true 0 <nil>
}

// Bad descriptions are refused before anything is claimed, with the table, the column
// and the fix.
func ExampleConfigError() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	b, _ := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"))
	defer b.Shutdown(ctx)

	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", LockedUntil: "locked_until"}
	ddl, _ := rowactor.Schema(b.Dialect(), jobs)
	_, _ = b.Dialect().(*sqlite.Dialect).DB().Exec(ddl)

	jobs.Attempt = "attempts" // not a column of the table
	_, err := b.Subscribe(ctx, jobs, "jobs", func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	fmt.Println(err)
	// Output:
	// rowactor: table "jobs", column "attempts", Table.Attempt: the table has no such column (it has id, payload, locked_until); fix: add the column to the table, or correct Table.Attempt
}

// An audited ack: the service's own SQL moves a handled row to a "sent" group instead of
// deleting it, and a retry records why it failed. Events run where the form runs its
// settlement (here, a lease table: in a transaction that first confirms the lease).
func ExampleOnEvent() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	acked := make(chan struct{})
	b, _ := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"), rowactor.WithOnSettled(func(s rowactor.Settlement) {
		if s.Event == "ack" && s.Err == nil {
			close(acked)
		}
	}))
	defer b.Shutdown(ctx)

	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", LockedUntil: "locked_until"}
	ddl, _ := rowactor.Schema(b.Dialect(), jobs)
	db := b.Dialect().(*sqlite.Dialect).DB()
	_, _ = db.Exec(ddl)
	_, _ = db.Exec("ALTER TABLE jobs ADD COLUMN last_error TEXT")

	_, err := b.Subscribe(ctx, jobs, "emails", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if d.Attempt() == 1 {
			return rowactor.Retry().WithError(fmt.Errorf("smtp: 451 try later"))
		}
		return rowactor.Ack()
	},
		rowactor.OnEvent("ack", "UPDATE jobs SET queue = 'sent', locked_until = NULL WHERE id = {id}"),
		rowactor.OnEvent("retry", "UPDATE jobs SET last_error = {error}, locked_until = NULL WHERE id = {id}"))
	if err != nil {
		fmt.Println(err)
		return
	}
	_, _ = b.Publish(ctx, jobs, "emails", []byte("welcome@example.com"))
	<-acked

	var queue, lastError string
	var attempt int
	_ = db.QueryRow("SELECT queue, attempt, last_error FROM jobs").Scan(&queue, &attempt, &lastError)
	fmt.Println(queue, attempt, lastError)
	// Output:
	// sent 3 smtp: 451 try later
}

// Rows of one account are handled one at a time, in order; accounts side by side.
func ExampleWorkersByKey() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	b, _ := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"))
	defer b.Shutdown(ctx)
	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Headers: "headers", LockedUntil: "locked_until"}
	ddl, _ := rowactor.Schema(b.Dialect(), jobs)
	_, _ = b.Dialect().(*sqlite.Dialect).DB().Exec(ddl)

	var mu sync.Mutex
	seen := map[string][]string{}
	done := make(chan struct{})
	account := func(d *rowactor.Delivery) string { return d.Header("account") }
	_, err := b.Subscribe(ctx, jobs, "", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		mu.Lock()
		defer mu.Unlock()
		seen[account(d)] = append(seen[account(d)], string(d.Payload()))
		if len(seen["alice"])+len(seen["bob"]) == 6 {
			close(done)
		}
		return rowactor.Ack()
	}, rowactor.WorkersByKey(4, account))
	if err != nil {
		fmt.Println(err)
		return
	}
	for i, acct := range []string{"alice", "bob", "alice", "bob", "alice", "bob"} {
		_, _ = b.Publish(ctx, jobs, "", []byte(fmt.Sprint("op", i)), rowactor.WithHeaders(map[string]string{"account": acct}))
	}
	<-done
	fmt.Println("alice:", seen["alice"])
	fmt.Println("bob:", seen["bob"])
	// Output:
	// alice: [op0 op2 op4]
	// bob: [op1 op3 op5]
}
