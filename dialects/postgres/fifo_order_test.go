package postgres

import (
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// FIFO order across delays: a group's head is its unfinished row with the lowest id,
// whatever its retry_after, and a head not yet due holds its whole group.

// fifoAttempt is the attempt column of a row in its nth delivery: the lease form counts
// at the claim, the row lock form when a retry returns the row.
func fifoAttempt(tbl dialects.Table, n int) int {
	if tbl.Form() == dialects.FormLease {
		return n + 1
	}
	return n
}

// A head published with a delay holds its group though the rows behind it are due; other
// groups go on; at its time the head comes first.
func TestFIFODelayedHeadHoldsItsGroup(t *testing.T) {
	fifoForms(t, func(t *testing.T, d *Dialect, tbl dialects.Table) {
		a := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("a"), NotBefore: t0.Add(time.Hour)})
		b := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("b")})
		x := publish(t, d, tbl, dialects.Message{Group: "other", Payload: []byte("x")})
		q := openFIFO(t, d, tbl, "g")
		other := openFIFO(t, d, tbl, "other")
		if got := q.claim(t0); got != 0 {
			t.Fatalf("claimed row %d while the head %d is not due", got, a)
		}
		if s, _ := stateOf(t, d, tbl, b); s.Attempt != 1 || s.LockedUntil != nil {
			t.Fatalf("row %d behind the delayed head: %+v", b, s)
		}
		if got := other.claim(t0); got != x {
			t.Fatalf("another group's claim took %d, want %d", got, x)
		}
		other.ack(x, t0)
		if got := q.claim(t0.Add(time.Hour)); got != a {
			t.Fatalf("claimed %d at the head's time, want %d", got, a)
		}
		q.ack(a, t0.Add(time.Hour))
		if got := q.claim(t0.Add(time.Hour)); got != b {
			t.Fatalf("claimed %d after the head's ack, want %d", got, b)
		}
	})
}

// A head that answered RetryAfter holds its group until it is due; moved to the dead letter
// at its next delivery, it leaves the group and the next row is the head.
func TestFIFORetryAfterHeadThenDeadLetter(t *testing.T) {
	fifoForms(t, func(t *testing.T, d *Dialect, tbl dialects.Table) {
		a := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("a")})
		b := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("b")})
		q := openFIFO(t, d, tbl, "g")
		if got := q.claim(t0); got != a {
			t.Fatalf("claimed %d, want %d", got, a)
		}
		q.settle(a, dialects.Step{Kind: dialects.StepRetryAfter, Now: t0, At: t0.Add(time.Minute)})
		if got := q.claim(t0.Add(time.Second)); got != 0 {
			t.Fatalf("claimed row %d while the head %d waits for its retry_after", got, a)
		}
		if got := q.claim(t0.Add(time.Minute)); got != a {
			t.Fatalf("claimed %d at the head's time, want %d", got, a)
		}
		q.settle(a, dialects.Step{Kind: dialects.StepDeadLetter, Now: t0.Add(time.Minute)})
		if s, _ := stateOf(t, d, tbl, a); s.Group != "dead" || s.ProcessedAt != nil || s.LockedUntil != nil {
			t.Fatalf("row %d after the dead letter: %+v", a, s)
		}
		if got := q.claim(t0.Add(time.Minute + time.Second)); got != b {
			t.Fatalf("claimed %d after the head moved to the dead letter, want %d", got, b)
		}
		if s, _ := stateOf(t, d, tbl, b); s.Attempt != fifoAttempt(tbl, 1) || s.RetryAfter != nil {
			t.Fatalf("row %d: %+v", b, s)
		}
	})
}
