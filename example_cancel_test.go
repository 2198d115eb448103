package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rowactor/rowactor"
	_ "github.com/rowactor/rowactor/dialects/sqlite"
)

// Cancel of a row in work: the handler's context is cancelled with a cause that wraps
// ErrCancelled, and the row ends as cancelled whatever the handler returns.
func ExampleBroker_Cancel() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Shutdown(ctx)
	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue", Attempt: "attempt",
		LockedUntil: "locked_until", ProcessedAt: "processed_at", Error: "error"}
	if err := b.ApplySchema(ctx, jobs); err != nil {
		fmt.Println(err)
		return
	}
	id, err := b.Publish(ctx, jobs, "reports", []byte("report 7"))
	if err != nil {
		fmt.Println(err)
		return
	}
	started, why := make(chan struct{}), make(chan error, 1)
	render := func(ctx context.Context, _ []byte) error {
		close(started)
		<-ctx.Done() // a long render, cut short
		return ctx.Err()
	}
	// snippet cancel: begin
	handler := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if err := render(ctx, d.Payload()); err != nil {
			if cause := context.Cause(ctx); errors.Is(cause, rowactor.ErrCancelled) {
				why <- cause
				return rowactor.Ack() // the row ends as cancelled whatever is returned
			}
			return rowactor.Fail(err)
		}
		return rowactor.Ack()
	}
	// snippet cancel: end
	if _, err := b.Subscribe(ctx, jobs, "reports", handler); err != nil {
		fmt.Println(err)
		return
	}
	<-started
	// snippet cancel-call: begin
	// In the process whose subscription holds the row:
	err = b.Cancel(ctx, jobs, id, "customer left") // nil once the row ended as cancelled
	// snippet cancel-call: end
	fmt.Println(err)
	fmt.Println(<-why)
	job, _ := b.Inspect(ctx, jobs, id)
	fmt.Printf("%s, error %q\n", job.State, job.Error)
	// Output:
	// <nil>
	// rowactor: row 1 of jobs cancelled: customer left: rowactor: the row was cancelled
	// cancelled, error "cancelled: customer left"
}

// Cancel of a row in work in another process, through the table's cancel-request table:
// here two brokers on one SQLite file, as two processes would be.
func ExampleBroker_Cancel_anotherProcess() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	url := "sqlite:" + filepath.Join(dir, "jobs.db")
	// snippet cancel-requests: begin
	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", LockedUntil: "locked_until", ProcessedAt: "processed_at",
		Error: "last_error", CancelRequests: "jobs_cancels"}
	// snippet cancel-requests: end
	worker, err := rowactor.Open(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer worker.Shutdown(ctx)
	if err := worker.ApplySchema(ctx, jobs); err != nil { // jobs and jobs_cancels
		fmt.Println(err)
		return
	}
	id, err := worker.Publish(ctx, jobs, "reports", []byte("report 7"))
	if err != nil {
		fmt.Println(err)
		return
	}
	started, why := make(chan struct{}), make(chan error, 1)
	if _, err := worker.Subscribe(ctx, jobs, "reports", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		close(started)
		<-ctx.Done()
		why <- context.Cause(ctx)
		return rowactor.Ack()
	}); err != nil {
		fmt.Println(err)
		return
	}
	<-started

	admin, err := rowactor.Open(ctx, url) // the other process
	if err != nil {
		fmt.Println(err)
		return
	}
	defer admin.Shutdown(ctx)
	fmt.Println(admin.Cancel(ctx, jobs, id, "customer left"))
	fmt.Println(<-why)
	job, _ := admin.Inspect(ctx, jobs, id)
	fmt.Printf("%s, error %q\n", job.State, job.Error)
	// Output:
	// <nil>
	// rowactor: row 1 of jobs cancelled: customer left: rowactor: the row was cancelled
	// cancelled, error "cancelled: customer left"
}
