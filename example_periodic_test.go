package rowactor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rowactor/rowactor"
	_ "github.com/rowactor/rowactor/dialects/sqlite"
)

// A report every day at three, published once a day however many processes run the
// job; here, a tick every second, handled once.
func ExampleBroker_Periodic() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Shutdown(ctx)

	// snippet periodic: begin
	// The runs' rows are the job's memory: finished rows stay (processed_at) with their
	// unique keys, "reports@2030-01-02T03:00:00Z".
	jobs := rowactor.Table{
		Name: "jobs", ID: "id", Payload: "payload", Group: "queue", Attempt: "attempt",
		RetryAfter: "retry_after", LockedUntil: "locked_until",
		ProcessedAt: "processed_at", UniqueKey: "unique_key",
	}
	_ = b.ApplySchema(ctx, jobs)

	daily, err := rowactor.Cron("CRON_TZ=UTC 0 3 * * *")
	if err != nil {
		fmt.Println(err)
		return
	}
	report := func(_ context.Context, at time.Time) ([]byte, error) {
		return []byte(`{"day":"` + at.Format(time.DateOnly) + `"}`), nil
	}
	if _, err := b.Periodic(ctx, jobs, "reports", daily, report, rowactor.PeriodicName("reports")); err != nil {
		fmt.Println(err)
		return
	}
	// snippet periodic: end

	handled := make(chan string, 1)
	_, _ = b.Subscribe(ctx, jobs, "ticks", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		select {
		case handled <- "a tick":
		default:
		}
		return rowactor.Ack()
	})
	tick, _ := b.Periodic(ctx, jobs, "ticks", rowactor.Every(time.Second), func(context.Context, time.Time) ([]byte, error) { return []byte("tick"), nil })
	fmt.Println("handled", <-handled)
	tick.Stop()
	// Output:
	// handled a tick
}
