package settler

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

func TestPlanNamesTheEventsThatReplaceSettlements(t *testing.T) {
	now := time.Now()
	own := Rules{MaxAttempts: 3, HasRetryAfter: false,
		Events: map[string]bool{"ack": true, "retry_after": true, "dead_letter": true, "audit": true}}
	for _, c := range []struct {
		rules   Rules
		o       Outcome
		attempt int
		kind    dialects.StepKind
		event   string
	}{
		{own, Outcome{Verdict: Ack}, 1, dialects.StepAck, "ack"},
		{own, Outcome{Verdict: Drop}, 1, dialects.StepAck, ""}, // drop is not replaced
		{own, Outcome{Verdict: Retry}, 1, dialects.StepRetry, ""},
		// No retry_after column, but an event that stores the delay: a native delay.
		{own, Outcome{Verdict: RetryAfter, Delay: time.Minute}, 1, dialects.StepRetryAfter, "retry_after"},
		{own, Outcome{Verdict: Retry}, 3, dialects.StepDeadLetter, "dead_letter"},
		{own, Outcome{Verdict: Custom, Event: "audit", Args: []any{1}}, 1, dialects.StepCustom, "audit"},
		{own, Outcome{}, 1, dialects.StepRelease, ""},
		{Rules{}, Outcome{Verdict: RetryAfter, Delay: time.Minute}, 1, dialects.StepRetry, ""},
	} {
		step, _ := c.rules.Plan(c.o, c.attempt, now)
		if step.Kind != c.kind || step.Event != c.event {
			t.Errorf("%v at attempt %d: step %v event %q, want %v %q", c.o.Verdict, c.attempt, step.Kind, step.Event, c.kind, c.event)
		}
		if step.Attempt != c.attempt {
			t.Errorf("%v: step attempt %d, want %d", c.o.Verdict, step.Attempt, c.attempt)
		}
		if c.kind == dialects.StepRetryAfter && !step.At.Equal(now.Add(time.Minute)) {
			t.Errorf("retry_after at %v, want %v", step.At, now.Add(time.Minute))
		}
	}
	step, _ := own.Plan(Outcome{Verdict: Retry, Error: "boom"}, 1, now)
	if step.Error != "boom" {
		t.Errorf("step error %q, want the outcome's", step.Error)
	}
}

// Cancel ends the row as Broker.Cancel does, whatever the dead letter and the events:
// the ack step, its reason after CancelledPrefix. DeadLetter moves the row at once where
// there is a dead letter, and drops it where there is none.
func TestPlanCancelAndDeadLetter(t *testing.T) {
	now := time.Now()
	dead := Rules{MaxAttempts: 10, Events: map[string]bool{"drop": true, "dead_letter": true}}
	for _, c := range []struct {
		name  string
		rules Rules
		o     Outcome
		kind  dialects.StepKind
		event string
		err   string
		note  Note
	}{
		{"cancel with a dead letter", dead, Outcome{Verdict: Cancel, Error: "unwanted"}, dialects.StepAck, "", "cancelled: unwanted", NoteCancelled},
		{"cancel without one", Rules{}, Outcome{Verdict: Cancel, Error: "unwanted"}, dialects.StepAck, "", "cancelled: unwanted", NoteCancelled},
		{"dead letter at the first attempt", dead, Outcome{Verdict: DeadLetter, Error: "bad"}, dialects.StepDeadLetter, "dead_letter", "bad", NoteDeadLettered},
		{"dead letter without one drops", Rules{}, Outcome{Verdict: DeadLetter, Error: "bad"}, dialects.StepAck, "", "bad", NoteDeadLettered},
	} {
		step, note := c.rules.Plan(c.o, 1, now)
		if step.Kind != c.kind || step.Event != c.event || step.Error != c.err || note != c.note {
			t.Errorf("%s: step %v event %q error %q note %v, want %v %q %q %v", c.name, step.Kind, step.Event, step.Error, note, c.kind, c.event, c.err, c.note)
		}
	}
	if Cancel.String() != "cancel" || DeadLetter.String() != "dead_letter" {
		t.Errorf("verdicts read %q and %q", Cancel, DeadLetter)
	}
}

func TestPlanFailAndSnooze(t *testing.T) {
	now := time.Now()
	boom := errors.New("boom")
	var asked []int
	backoff := func(attempt int, err error) time.Duration {
		if !errors.Is(err, boom) {
			t.Errorf("the policy got error %v, want the handler's", err)
		}
		asked = append(asked, attempt)
		return time.Duration(attempt) * time.Minute
	}
	table := Rules{MaxAttempts: 3, HasRetryAfter: true, Backoff: backoff}
	lease := Rules{MaxAttempts: 3, LeaseDelays: true, Backoff: backoff}
	bare := Rules{MaxAttempts: 3, Backoff: backoff}
	fail := Outcome{Verdict: Fail, Err: boom, Error: "boom"}
	snooze := Outcome{Verdict: Snooze, Delay: time.Hour}
	for _, c := range []struct {
		name    string
		rules   Rules
		o       Outcome
		attempt int
		kind    dialects.StepKind
		at      time.Time // zero: not checked
		note    Note
	}{
		{"fail waits the policy's delay", table, fail, 2, dialects.StepRetryAfter, now.Add(2 * time.Minute), NoteNone},
		{"fail at the cap moves the row", table, fail, 3, dialects.StepDeadLetter, time.Time{}, NoteAttemptsSpent},
		{"fail waits in the lease without retry_after", lease, fail, 1, dialects.StepRetryAfter, now.Add(time.Minute), NoteNone},
		{"fail retries at once without retry_after outside the lease form", bare, fail, 1, dialects.StepRetry, time.Time{}, NoteFailNoRetryAfter},
		{"a negative delay is none", Rules{HasRetryAfter: true, Backoff: func(int, error) time.Duration { return -time.Hour }}, fail, 1, dialects.StepRetryAfter, now, NoteNone},
		{"no policy returns the row at once", Rules{HasRetryAfter: true}, fail, 1, dialects.StepRetryAfter, now, NoteNone},
		{"snooze waits its delay", table, snooze, 1, dialects.StepSnooze, now.Add(time.Hour), NoteNone},
		{"snooze at the cap is no dead letter", table, snooze, 7, dialects.StepSnooze, now.Add(time.Hour), NoteNone},
		{"snooze waits in the lease without retry_after", lease, snooze, 1, dialects.StepSnooze, now.Add(time.Hour), NoteNone},
		{"snooze is refused without retry_after outside the lease form", bare, snooze, 1, dialects.StepRelease, time.Time{}, NoteSnoozeNoRetryAfter},
		{"a retry after without retry_after keeps its rule in the lease form", lease, Outcome{Verdict: RetryAfter, Delay: time.Hour}, 1, dialects.StepRetry, time.Time{}, NoteNoRetryAfter},
	} {
		step, note := c.rules.Plan(c.o, c.attempt, now)
		if step.Kind != c.kind || note != c.note || (!c.at.IsZero() && !step.At.Equal(c.at)) {
			t.Errorf("%s: step %v at %v note %v, want %v at %v note %v", c.name, step.Kind, step.At, note, c.kind, c.at, c.note)
		}
		if step.Error != c.o.Error {
			t.Errorf("%s: step error %q, want %q", c.name, step.Error, c.o.Error)
		}
	}
	if want := []int{2, 1, 1}; !slices.Equal(asked, want) {
		t.Errorf("the policy was asked for attempts %v, want %v (never for a dead letter)", asked, want)
	}
	// A step carrying an error never joins a batch: the batch statements write no error.
	if Batchable(dialects.Step{Kind: dialects.StepRetry, Error: "boom"}) || !Batchable(dialects.Step{Kind: dialects.StepRetry}) {
		t.Error("a retry with an error must run alone, one without may join a batch")
	}
}
