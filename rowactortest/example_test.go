package rowactortest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/sqlite"
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
	ddl, _ := rowactor.Schema(b.Dialect(), emails)
	_, _ = b.Dialect().(*sqlite.Dialect).DB().Exec(ddl)

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
