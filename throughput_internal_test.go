package rowactor

import (
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor/actors"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/settler"
)

// The ring counts each settlement that took effect in its minute, failed or handled, keeps
// queues apart, and forgets a slot's count once its minute is an hour old.
func TestThroughputRing(t *testing.T) {
	t.Parallel()
	var c throughput
	k, other := throughputKey{"jobs", "emails"}, throughputKey{"jobs", "sms"}
	t0 := time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC)
	ack := actors.Result{Step: dialects.StepAck}
	fail := actors.Result{Step: dialects.StepRetryAfter, Outcome: settler.Outcome{Err: errors.New("boom")}}
	c.note(k, ack, t0.Add(time.Second))
	c.note(k, ack, t0.Add(59*time.Second))
	c.note(k, fail, t0.Add(30*time.Second))
	c.note(k, actors.Result{Step: dialects.StepRetry, Panic: "oops"}, t0.Add(2*time.Minute))
	c.note(k, actors.Result{Step: dialects.StepRelease, Released: true}, t0)      // released: not counted
	c.note(k, actors.Result{Step: dialects.StepAck, Err: errors.New("lost")}, t0) // did not take effect
	c.note(other, ack, t0)

	got := c.minutes(k, t0.Add(2*time.Minute+time.Second))
	if len(got) != ThroughputMinutes {
		t.Fatalf("%d minutes, want %d", len(got), ThroughputMinutes)
	}
	last := got[len(got)-3:]
	want := []ThroughputMinute{{Minute: t0, Handled: 2, Failed: 1}, {Minute: t0.Add(time.Minute)}, {Minute: t0.Add(2 * time.Minute), Failed: 1}}
	for i := range want {
		if !last[i].Minute.Equal(want[i].Minute) || last[i].Handled != want[i].Handled || last[i].Failed != want[i].Failed {
			t.Errorf("minute %d: %+v, want %+v", i, last[i], want[i])
		}
	}
	if !got[0].Minute.Equal(t0.Add(-57 * time.Minute)) {
		t.Errorf("first minute %v, want an hour's minutes up to now", got[0].Minute)
	}
	// An hour on, the slot of t0 is reused by t0+1h and t0's counts are gone.
	c.note(k, ack, t0.Add(time.Hour))
	for _, m := range c.minutes(k, t0.Add(time.Hour)) {
		if m.Minute.Equal(t0.Add(time.Hour)) && (m.Handled != 1 || m.Failed != 0) {
			t.Errorf("t0+1h: %+v, want 1 handled", m)
		}
		if m.Minute.Before(t0.Add(time.Hour)) && m.Minute.After(t0.Add(time.Minute)) && m.Minute.Equal(t0.Add(2*time.Minute)) && m.Failed != 1 {
			t.Errorf("t0+2m still in the hour: %+v", m)
		}
	}
	if o := c.minutes(other, t0)[ThroughputMinutes-1]; o.Handled != 1 {
		t.Errorf("the other queue: %+v, want its own count", o)
	}
}
