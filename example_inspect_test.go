package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rowactor/rowactor"
	_ "github.com/rowactor/rowactor/dialects/sqlite"
)

// Where one row stands: published with a delay, it reads as delayed until then.
func ExampleBroker_Inspect() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Shutdown(ctx)
	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until"}
	if err := b.ApplySchema(ctx, jobs); err != nil {
		fmt.Println(err)
		return
	}
	id, err := b.Publish(ctx, jobs, "emails", []byte("welcome@example.com"), rowactor.After(time.Hour))
	if err != nil {
		fmt.Println(err)
		return
	}
	job, err := b.Inspect(ctx, jobs, id)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s in %s: %s, %d attempts made\n", job.Payload, job.Group, job.State, job.Attempt)

	_, err = b.Inspect(ctx, jobs, id+1)
	fmt.Println(errors.Is(err, rowactor.ErrNotFound))
	// Output:
	// welcome@example.com in emails: delayed, 0 attempts made
	// true
}
