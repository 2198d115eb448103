package rowactortest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	_ "github.com/rowactor/rowactor/dialects/sqlite"
	"github.com/rowactor/rowactor/rowactortest"
)

// A row published to be due in an hour is handled as soon as the clock jumps an hour (in
// a test, rowactortest.NewWithClock(t, clock, tables...) makes the broker in one line).
func ExampleClock() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactortest-example-")
	defer os.RemoveAll(dir)
	clock := rowactortest.NewClock()
	b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"), rowactor.WithClock(clock))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Shutdown(ctx)
	_ = b.ApplySchema(ctx, emails)

	handled := make(chan string, 1)
	_, _ = b.Subscribe(ctx, emails, "welcome", func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		handled <- string(d.Payload())
		return rowactor.Ack()
	})
	_, _ = b.Publish(ctx, emails, "welcome", []byte("in an hour"), rowactor.After(time.Hour))
	clock.Advance(time.Hour)
	fmt.Println("handled", <-handled)
	// Output:
	// handled in an hour
}

// workerTest is the test function ExampleWorker writes; TestExampleWorker runs it, so the
// example is proven as well as compiled.
var workerTest func(t *testing.T)

// A service's test of its welcome handler with the subscription's own options: a bounced
// address is retried after the retry policy's delay, which the clock skips, and its
// second attempt moves it to the dead-letter group.
func ExampleWorker() {
	workerTest = func(t *testing.T) {
		// snippet worker: begin
		ctx := t.Context()
		clock := rowactortest.NewClock()
		b := rowactortest.NewWithClock(t, clock, welcomes)
		w := rowactortest.Worker{Broker: b, Table: welcomes, Queue: "welcome", Handler: sendWelcome,
			Options: []rowactor.SubscribeOption{rowactor.MaxAttempts(2), rowactor.DeadLetterGroup("welcome-dead")}}

		r := w.Work(ctx, t, []byte(`{"to":"bounce@example.com"}`))
		if r.Step != "retry_after" || r.Row.Error != "bounced" || r.Row.State != rowactor.JobDelayed {
			t.Fatalf("first attempt: %v", r)
		}
		clock.Advance(time.Hour) // past the retry policy's delay
		r = w.WorkRow(ctx, t, r.ID)
		if r.Step != "dead_letter" || !r.Dead || r.Row.Group != "welcome-dead" || r.Row.Error != "bounced" {
			t.Fatalf("second attempt: %v", r)
		}
		// snippet worker: end
	}
}

func TestExampleWorker(t *testing.T) {
	t.Parallel()
	ExampleWorker()
	workerTest(t)
}
