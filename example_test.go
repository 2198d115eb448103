package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rowactor/rowactor"
	_ "github.com/rowactor/rowactor/dialects/sqlite"
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
	if err := b.ApplySchema(ctx, jobs); err != nil {
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

	// snippet configerror: begin
	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", LockedUntil: "locked_until"}
	_ = b.ApplySchema(ctx, jobs)

	jobs.Attempt = "attempts" // not a column of the table
	_, err := b.Subscribe(ctx, jobs, "jobs", func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	fmt.Println(err)
	// snippet configerror: end

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
	_ = b.ApplySchema(ctx, jobs)
	db, _ := b.DB()
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
	_ = b.ApplySchema(ctx, jobs)

	var mu sync.Mutex
	seen := map[string][]string{}
	done := make(chan struct{})
	// snippet workersbykey: begin
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
	// snippet workersbykey: end
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

// A handler that fails: the row comes back after the retry policy's delay, its error
// kept in the last_error column, logged once with its attributes, and told to the hook.
func ExampleFail() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	// The WARN line of the failure, without its time, on stdout.
	log := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	settled := make(chan rowactor.Settlement, 2)
	b, _ := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"), rowactor.WithLogger(log),
		rowactor.WithOnSettled(func(s rowactor.Settlement) { settled <- s }))
	defer b.Shutdown(ctx)

	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until", Error: "last_error"}
	_ = b.ApplySchema(ctx, jobs)
	db, _ := b.DB()

	seen := make(chan string, 1)
	_, err := b.Subscribe(ctx, jobs, "emails", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if d.Attempt() == 1 {
			return rowactor.Fail(errors.New("smtp: 451 try later"))
		}
		var lastError string
		_ = db.QueryRow("SELECT last_error FROM jobs WHERE id = ?", d.ID()).Scan(&lastError)
		seen <- lastError
		return rowactor.Ack()
	}, rowactor.RetryPolicy(func(attempt int, err error) time.Duration { return 10 * time.Millisecond }),
		rowactor.PollInterval(10*time.Millisecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	_, _ = b.Publish(ctx, jobs, "emails", []byte("welcome@example.com"))
	s := <-settled
	fmt.Println(s.Outcome, s.Step, s.HandlerErr)
	fmt.Println("the second delivery found:", <-seen)
	s = <-settled
	fmt.Println(s.Outcome, s.Step, s.HandlerErr)
	// Output:
	// level=WARN msg="rowactor: the handler failed; the row is retried" table=jobs queue=emails id=1 attempt=1 form=lease error="smtp: 451 try later" delay=10ms
	// fail retry_after smtp: 451 try later
	// the second delivery found: smtp: 451 try later
	// ack ack <nil>
}

// rateLimited is an error that says when to try again.
type rateLimited struct{ retryIn time.Duration }

func (e *rateLimited) Error() string { return fmt.Sprintf("rate limited: retry in %v", e.retryIn) }

// A retry policy that follows what the error says, and DefaultBackoff otherwise.
func ExampleRetryPolicy() {
	policy := func(attempt int, err error) time.Duration {
		var limited *rateLimited
		if errors.As(err, &limited) {
			return limited.retryIn
		}
		return rowactor.DefaultBackoff(attempt, err)
	}
	fmt.Println(policy(3, fmt.Errorf("send: %w", &rateLimited{retryIn: time.Minute})))
	d := policy(3, errors.New("connection reset")) // 4 s ± 20 %
	fmt.Println(d >= 3200*time.Millisecond && d <= 4800*time.Millisecond)
	d = policy(40, errors.New("connection reset")) // capped
	fmt.Println(d >= 48*time.Minute && d <= time.Hour)

	// Given to a subscription: rowactor.Fail(err) then waits policy(attempt, err).
	_ = rowactor.RetryPolicy(policy)
	// Output:
	// 1m0s
	// true
	// true
}

// A handler that is not ready for its row yet snoozes it: the row comes back later, and
// the snooze spends no attempt.
func ExampleSnooze() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	b, _ := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"))
	defer b.Shutdown(ctx)

	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until"}
	_ = b.ApplySchema(ctx, jobs)

	done := make(chan struct{})
	snoozed := false
	_, err := b.Subscribe(ctx, jobs, "reports", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if !snoozed {
			snoozed = true
			fmt.Println("attempt", d.Attempt(), "snoozed: the data is not in yet")
			return rowactor.Snooze(20 * time.Millisecond)
		}
		fmt.Println("attempt", d.Attempt(), "done")
		close(done)
		return rowactor.Ack()
	}, rowactor.PollInterval(10*time.Millisecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	_, _ = b.Publish(ctx, jobs, "reports", []byte("daily"))
	<-done
	// Output:
	// attempt 1 snoozed: the data is not in yet
	// attempt 1 done
}

// A handler of typed messages: JSON decodes each payload, nil acks, an error fails with
// the retry policy's backoff, and an Outcome can be returned as an error. A payload that
// does not decode goes to the dead letter at once, its decoding error kept.
func ExampleJSON() {
	// snippet json: begin
	// The program imports "github.com/rowactor/rowactor/dialects/sqlite": importing a
	// dialect registers it for rowactor.Open (import it blank when nothing else is used).
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	settled := make(chan rowactor.Settlement, 2)
	b, _ := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"),
		rowactor.WithOnSettled(func(s rowactor.Settlement) { settled <- s }))
	defer b.Shutdown(ctx)

	emails := rowactor.Table{Name: "email_jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until", Error: "last_error"}
	_ = b.ApplySchema(ctx, emails)

	type Email struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
	}
	_, err := b.Subscribe(ctx, emails, "emails",
		rowactor.JSON(func(ctx context.Context, d *rowactor.Delivery, m Email) error {
			if m.To == "" {
				return rowactor.DeadLetter(errors.New("no recipient")) // never succeeds: dead letter now
			}
			fmt.Println("sending", m.Subject, "to", m.To)
			return nil
		}), rowactor.MaxAttempts(5), rowactor.DeadLetterGroup("emails-dead"))
	if err != nil {
		fmt.Println(err)
		return
	}
	_, _ = rowactor.PublishJSON(ctx, b, emails, "emails", Email{To: "a@example.com", Subject: "welcome"})
	fmt.Println((<-settled).Step)
	_, _ = rowactor.PublishJSON(ctx, b, emails, "emails", Email{Subject: "lost"})
	s := <-settled
	fmt.Println(s.Outcome, s.Step, s.HandlerErr)
	// snippet json: end

	// Output:
	// sending welcome to a@example.com
	// ack
	// dead_letter dead_letter no recipient
}

// An ordinary function as a handler: Func acks on nil and fails on an error; Snooze and
// the other outcomes are errors too, so they can be returned (here wrapped with %w).
func ExampleFunc() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	settled := make(chan rowactor.Settlement, 1)
	b, _ := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"),
		rowactor.WithOnSettled(func(s rowactor.Settlement) { settled <- s }))
	defer b.Shutdown(ctx)

	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until"}
	_ = b.ApplySchema(ctx, jobs)

	_, err := b.Subscribe(ctx, jobs, "reports", rowactor.Func(func(ctx context.Context, d *rowactor.Delivery) error {
		return fmt.Errorf("the data is not in yet: %w", rowactor.Snooze(time.Hour))
	}))
	if err != nil {
		fmt.Println(err)
		return
	}
	_, _ = b.Publish(ctx, jobs, "reports", []byte("daily"))
	s := <-settled
	fmt.Println(s.Outcome, s.Step, s.Attempt)
	// Output:
	// snooze snooze 1
}

// A deadline per handler call: the handler's context ends at it, and a delivery that
// overran it fails, retried after the retry policy's delay. A handler that knows its row
// needs longer moves its own deadline.
func ExampleTimeout() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	settled := make(chan rowactor.Settlement, 2)
	b, _ := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"), rowactor.WithLogger(slog.New(slog.DiscardHandler)),
		rowactor.WithOnSettled(func(s rowactor.Settlement) { settled <- s }))
	defer b.Shutdown(ctx)

	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until", Error: "last_error"}
	_ = b.ApplySchema(ctx, jobs)

	// render stands for a call that takes 200 ms and honours its context.
	render := func(ctx context.Context) error {
		select {
		case <-time.After(200 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	_, err := b.Subscribe(ctx, jobs, "reports", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if d.Attempt() > 1 {
			d.SetTimeout(time.Minute) // it timed out once: give it all the time it needs
		}
		if err := render(ctx); err != nil {
			return rowactor.Fail(fmt.Errorf("render: %w", err))
		}
		return rowactor.Ack()
	}, rowactor.Timeout(50*time.Millisecond),
		rowactor.RetryPolicy(func(int, error) time.Duration { return 10 * time.Millisecond }),
		rowactor.PollInterval(10*time.Millisecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	_, _ = b.Publish(ctx, jobs, "reports", []byte("yearly"))
	s := <-settled
	fmt.Println(s.Attempt, s.Outcome, s.Step, s.HandlerErr)
	s = <-settled
	fmt.Println(s.Attempt, s.Outcome, s.Step, s.HandlerErr)
	// Output:
	// 1 fail retry_after render: context deadline exceeded
	// 2 ack ack <nil>
}
