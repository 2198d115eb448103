// Hello: the smallest whole program, the one README.md shows.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/rowactor/rowactor"
	_ "github.com/rowactor/rowactor/dialects/sqlite" // importing a dialect registers it for rowactor.Open
)

type Email struct{ To string }

func main() {
	if err := run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "hello-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir) // its error unchecked: what it leaves is in the system's temporary directory
	b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"))
	if err != nil {
		return err
	}

	// The columns named choose the claim form: LockedUntil is the lease form.
	emails := rowactor.Table{Name: "email_jobs", ID: "id", Payload: "payload",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until"}
	if err := b.ApplySchema(ctx, emails); err != nil { // CREATE TABLE and its claim index, once
		return err
	}

	sent := make(chan struct{})
	_, err = b.Subscribe(ctx, emails, "", rowactor.JSON(func(ctx context.Context, d *rowactor.Delivery, m Email) error {
		fmt.Println("sending to", m.To, "on attempt", d.Attempt())
		close(sent)
		return nil // acks: the row is deleted; an error would retry it after a backoff
	}))
	if err != nil {
		return err
	}
	if _, err := rowactor.PublishJSON(ctx, b, emails, "", Email{To: "a@example.com"}); err != nil {
		return err
	}
	<-sent
	report, err := b.Shutdown(ctx) // waits for the settlement
	if err != nil {
		return err
	}
	fmt.Println("drained:", report.Drained)
	return nil
}
