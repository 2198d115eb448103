// Hello: the smallest whole program, the one README.md shows.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/sqlite" // importing a dialect registers it for rowactor.Open
)

type Email struct{ To string }

func main() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "hello-")
	defer os.RemoveAll(dir)
	b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"))
	if err != nil {
		log.Fatal(err)
	}

	// The columns named choose the claim form: LockedUntil is the lease form.
	emails := rowactor.Table{Name: "email_jobs", ID: "id", Payload: "payload",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until"}
	ddl, _ := rowactor.Schema(b.Dialect(), emails) // CREATE TABLE and its claim index
	if _, err := b.Dialect().(*sqlite.Dialect).DB().ExecContext(ctx, ddl); err != nil {
		log.Fatal(err)
	}

	sent := make(chan struct{})
	_, err = b.Subscribe(ctx, emails, "", rowactor.JSON(func(ctx context.Context, d *rowactor.Delivery, m Email) error {
		fmt.Println("sending to", m.To, "on attempt", d.Attempt())
		close(sent)
		return nil // acks: the row is deleted; an error would retry it after a backoff
	}))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := rowactor.PublishJSON(ctx, b, emails, "", Email{To: "a@example.com"}); err != nil {
		log.Fatal(err)
	}
	<-sent
	report, err := b.Shutdown(ctx) // waits for the settlement
	fmt.Println("drained:", report.Drained, err)
}
