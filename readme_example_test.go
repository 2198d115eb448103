package rowactor_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// The README's "Use" section is this function's code between the markers, so that go
// vet and go test compile it; TestReadmeUseIsExampleCode keeps the two the same. It is not
// run (no Output): the names it leaves to the reader are stand-ins here.
func Example_readmeUse() {
	ctx := context.Background()
	var (
		quota   = struct{ Exhausted func() bool }{func() bool { return false }}
		send    = func(ctx context.Context, to, subject string) error { return nil }
		payload = []byte(`{"to":"a@example.com"}`)
		tx      *sql.Tx
	)
	// README Use: begin
	b, err := rowactor.Open(ctx, "sqlite:jobs.db") // or "./jobs.db", "file:jobs.db"; or rowactor.New(sqlite.New(db))

	emails := rowactor.Table{
		Name: "email_jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", ProcessedAt: "processed_at",
		Headers: "headers", Error: "last_error",
		LockedUntil: "locked_until", // the lease form; or AdvisoryKey: "email-{id}"
	}
	ddl, err := rowactor.Schema(b.Dialect(), emails) // CREATE TABLE + claim index, if you need one

	type Email struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
	}

	// A plain Go function: nil acks; an error fails the row, which comes back after 1 s, 2 s,
	// 4 s… (RetryPolicy) with the error kept in last_error, and moves to the dead letter when
	// its attempts are spent. A payload that is not an Email's JSON goes there at once.
	sub, err := b.Subscribe(ctx, emails, "emails",
		rowactor.JSON(func(ctx context.Context, d *rowactor.Delivery, m Email) error {
			if quota.Exhausted() {
				return rowactor.Snooze(time.Minute) // later, without spending an attempt
			}
			return send(ctx, m.To, m.Subject)
		}),
		rowactor.Workers(8), rowactor.Lease(time.Minute),
		rowactor.MaxAttempts(5), rowactor.DeadLetterGroup("emails-dead"),
		rowactor.Timeout(30*time.Second), // ctx ends at 30 s; a handler past it fails, one past a grace more is given up on
	)
	sub.SetWorkers(16) // retune while running

	id, err := rowactor.PublishJSON(ctx, b, emails, "emails", Email{To: "a@example.com"}) // wakes local subscribers at once
	// raw bytes, committed with the caller's *sql.Tx:
	id, err = b.PublishTx(ctx, tx, emails, "emails", payload)

	report, err := b.Shutdown(ctx) // drains until ctx ends, then releases what is left
	// err is nil when it drained; when ctx ended with rows in work it matches
	// rowactor.ErrNotDrained and ctx.Err(), and report.Released counts what was given back
	// README Use: end
	_, _, _, _, _ = ddl, sub, id, report, err
}

func TestReadmeUseIsExampleCode(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	r := string(readme)
	start := strings.Index(r, "## Use\n\n```go\n")
	if start < 0 {
		t.Fatal("README.md has no Go block right under ## Use")
	}
	r = r[start+len("## Use\n\n```go\n"):]
	snippet := r[:strings.Index(r, "```")]

	src, err := os.ReadFile("readme_example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	s := string(src)
	const begin, end = "\t// README Use: begin\n", "\t// README Use: end\n"
	s = s[strings.Index(s, begin)+len(begin) : strings.Index(s, end)]
	var code []string
	for _, l := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		code = append(code, strings.TrimPrefix(l, "\t"))
	}
	if got := strings.Join(code, "\n") + "\n"; got != snippet {
		t.Fatalf("README.md's Use block and Example_readmeUse differ; copy one to the other.\nREADME:\n%s\nexample:\n%s", snippet, got)
	}
}
