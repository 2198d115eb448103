package rowactortest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/rowactortest"
)

// The service under test: signing up publishes a welcome email, in the caller's
// transaction or not; the email handler fails on a bounced address.
var emails = rowactor.Table{Name: "emails", ID: "id", Payload: "payload", Group: "queue",
	Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until"}

type welcome struct {
	To string `json:"to"`
}

func signUp(ctx context.Context, b *rowactor.Broker, address string) error {
	if address == "" {
		return errors.New("no address")
	}
	_, err := rowactor.PublishJSON(ctx, b, emails, "welcome", welcome{To: address})
	return err
}

var errBounced = errors.New("bounced")

func sendWelcome(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
	var w welcome
	if err := json.Unmarshal(d.Payload(), &w); err != nil {
		return rowactor.Drop().WithError(err)
	}
	if w.To == "bounce@example.com" {
		return rowactor.Fail(errBounced)
	}
	return rowactor.Ack()
}

// A user's test written with the kit: what was published, and what the handler's
// outcome settled.
func TestSignUpPublishesAWelcome(t *testing.T) {
	ctx := context.Background()
	b := rowactortest.New(t, emails)
	if err := signUp(ctx, b, "a@example.com"); err != nil {
		t.Fatal(err)
	}
	id := rowactortest.RequirePublished(t, b, emails, "welcome", func(p []byte) bool {
		var w welcome
		return json.Unmarshal(p, &w) == nil && w.To == "a@example.com"
	})
	if id <= 0 {
		t.Fatalf("id %d", id)
	}
	if err := signUp(ctx, b, ""); err == nil {
		t.Fatal("a sign-up without an address succeeded")
	}
	rowactortest.RequireNotPublished(t, b, emails, "welcome", rowactortest.Payload([]byte(`{"to":""}`)))
	if n := len(rowactortest.Published(t, b, emails, "welcome", nil)); n != 1 {
		t.Fatalf("%d rows queued, want 1", n)
	}
}

func TestSendWelcome(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s := rowactortest.Work(ctx, t, sendWelcome, []byte(`{"to":"a@example.com"}`)); s.Step != "ack" || s.Err != nil || s.Attempt != 1 {
		t.Fatalf("a good address: %+v", s)
	}
	s := rowactortest.Work(ctx, t, sendWelcome, []byte(`{"to":"bounce@example.com"}`))
	if s.Step != "retry_after" || !errors.Is(s.HandlerErr, errBounced) || s.Err != nil {
		t.Fatalf("a bounced address: %+v", s)
	}
	if s := rowactortest.Work(ctx, t, sendWelcome, []byte(`not json`)); s.Step != "ack" || s.HandlerErr == nil {
		t.Fatalf("a malformed payload: %+v", s)
	}
}

// The kit's own refusals: a row published twice is not "exactly one".
func TestRequirePublishedCountsExactlyOne(t *testing.T) {
	ctx := context.Background()
	b := rowactortest.New(t, emails)
	for range 2 {
		if err := signUp(ctx, b, "twice@example.com"); err != nil {
			t.Fatal(err)
		}
	}
	if ids := rowactortest.Published(t, b, emails, "welcome", nil); len(ids) != 2 {
		t.Fatalf("Published: %v", ids)
	}
	if ids := rowactortest.Published(t, b, emails, "other", nil); len(ids) != 0 {
		t.Fatalf("Published in another queue: %v", ids)
	}
}

// fatalRecorder is a testing.TB whose Fatalf records the message and ends the goroutine
// that called it, as testing.T's does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fails runs f with a recorder and returns what it failed with ("" when it did not).
func fails(t *testing.T, f func(tb testing.TB)) string {
	r := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.msg
}

// The assertions fail a test when they should, naming what they found.
func TestAssertionsFail(t *testing.T) {
	ctx := context.Background()
	b := rowactortest.New(t, emails)
	if msg := fails(t, func(tb testing.TB) { rowactortest.RequirePublished(tb, b, emails, "welcome", nil) }); !strings.Contains(msg, "0 rows") {
		t.Errorf("RequirePublished on an empty queue: %q", msg)
	}
	if err := signUp(ctx, b, "a@example.com"); err != nil {
		t.Fatal(err)
	}
	if msg := fails(t, func(tb testing.TB) { rowactortest.RequireNotPublished(tb, b, emails, "welcome", nil) }); !strings.Contains(msg, "want none") {
		t.Errorf("RequireNotPublished of a queued row: %q", msg)
	}
	if msg := fails(t, func(tb testing.TB) { rowactortest.RequirePublished(tb, b, emails, "welcome", nil) }); msg != "" {
		t.Errorf("RequirePublished of the one queued row failed: %q", msg)
	}
}

// A retry an hour later and a delayed publish, tested without waiting: the clock jumps,
// and the subscription (which would not poll for an hour) claims at once.
func TestClockMakesRetriesAndDelaysDue(t *testing.T) {
	ctx := context.Background()
	clock := rowactortest.NewClock()
	b := rowactortest.NewWithClock(t, clock, emails)
	attempts := make(chan string, 8)
	_, err := b.Subscribe(ctx, emails, "welcome", func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		attempts <- fmt.Sprintf("%s#%d", d.Payload(), d.Attempt())
		if d.Attempt() == 1 && string(d.Payload()) == "retry" {
			return rowactor.RetryAfter(time.Hour)
		}
		return rowactor.Ack()
	}, rowactor.PollInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Publish(ctx, emails, "welcome", []byte("retry")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Publish(ctx, emails, "welcome", []byte("later"), rowactor.After(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	want := func(what string) {
		t.Helper()
		select {
		case got := <-attempts:
			if got != what {
				t.Fatalf("handled %s, want %s", got, what)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("waited 10 s for %s", what)
		}
	}
	none := func() {
		t.Helper()
		select {
		case got := <-attempts:
			t.Fatalf("handled %s before its time", got)
		case <-time.After(300 * time.Millisecond):
		}
	}
	want("retry#1")
	none()
	clock.Advance(time.Hour)
	want("retry#2")
	none()
	clock.Advance(time.Hour)
	want("later#1")
	for deadline := time.Now().Add(10 * time.Second); len(rowactortest.Published(t, b, emails, "welcome", nil)) > 0; {
		if time.Now().After(deadline) {
			t.Fatal("the acked rows are still queued after 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A Clock's zero value, which the type allows, is usable: Advance does not panic, and a
// broker going by it wakes at each Advance.
func TestZeroValueClockAdvancesAndWakesTheBroker(t *testing.T) {
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

// A daily report at three, tested by moving the clock to three.
func TestClockRunsAPeriodicJob(t *testing.T) {
	ctx := context.Background()
	reports := rowactor.Table{Name: "reports", ID: "id", Payload: "payload", Attempt: "attempt",
		LockedUntil: "locked_until", ProcessedAt: "processed_at", UniqueKey: "unique_key"}
	clock := rowactortest.NewClock()
	b := rowactortest.NewWithClock(t, clock, reports)
	daily, err := rowactor.Cron("CRON_TZ=UTC 0 3 * * *")
	if err != nil {
		t.Fatal(err)
	}
	p, err := b.Periodic(ctx, reports, "", daily, func(_ context.Context, at time.Time) ([]byte, error) {
		return []byte(at.UTC().Format(time.DateOnly)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	rowactortest.RequireNotPublished(t, b, reports, "", nil)
	three := daily.Next(clock.Now())
	clock.Advance(three.Sub(clock.Now()) + time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for p.Published() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	rowactortest.RequirePublished(t, b, reports, "", rowactortest.Payload([]byte(three.UTC().Format(time.DateOnly))))
}
