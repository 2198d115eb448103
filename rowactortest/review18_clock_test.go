package rowactortest_test

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/rowactortest"
)

// Review 18: a Clock's zero value, which the type allows, must be usable: Advance must not
// panic, and a broker going by it must wake at each Advance.
func TestReview18ZeroValueClock(t *testing.T) {
	ctx := context.Background()
	var clock rowactortest.Clock
	func() {
		defer func() {
			if v := recover(); v != nil {
				t.Fatalf("Advance of a zero Clock panicked: %v", v)
			}
		}()
		clock.Advance(time.Minute)
	}()
	if got := time.Until(clock.Now()); got < 59*time.Second {
		t.Fatalf("a zero Clock advanced by a minute reads %v ahead", got)
	}
	b := rowactortest.NewWithClock(t, &clock, emails)
	attempts := make(chan int, 4)
	if _, err := b.Subscribe(ctx, emails, "welcome", func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		attempts <- d.Attempt()
		return rowactor.Ack()
	}, rowactor.PollInterval(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Publish(ctx, emails, "welcome", []byte("later"), rowactor.After(time.Hour)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the subscription's claim came back short
	clock.Advance(time.Hour)
	select {
	case <-attempts:
	case <-time.After(10 * time.Second):
		t.Fatal("the delayed row was not handled 10 s after Advance made it due: the broker did not wake")
	}
}
