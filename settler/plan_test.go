package settler

import (
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
