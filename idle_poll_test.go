package rowactor_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

func init() {
	scenarios = append(scenarios,
		scenario{
			name: "idle subscriptions of one table are polled by one probe, and a row written by hand, a delayed row and an expired lease each reach a worker",
			run:  idlePollScenario,
		},
		scenario{
			name:   "the due probe answers per group: due, delayed, leased, finished, empty, and past one statement's groups",
			shapes: []tableShape{withProcessedAt},
			run:    dueProbeScenario,
		},
		scenario{
			name:   "the due probe of a table without groups",
			shapes: []tableShape{withoutGroup},
			run: func(t *testing.T, h *harness, form rowactor.Form) {
				p := h.d.(dialects.DueProber)
				ask := func(want bool) {
					t.Helper()
					got, err := p.DueQueues(context.Background(), h.table, form == rowactor.FormLease, []string{"", ""}, time.Now())
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(got, []bool{want, want}) {
						t.Fatalf("DueQueues = %v, want both %v", got, want)
					}
				}
				ask(false)
				h.exec(fmt.Sprintf("INSERT INTO %s (payload) VALUES (?)", h.table.Name), []byte("x"))
				ask(true)
			},
		},
	)
}

// idlePollScenario: five idle subscriptions (groups) on one table with a 50 ms poll. While
// idle they run no claims of their own (one probe serves them all). A row inserted with
// plain SQL (no Publish, so nothing wakes anybody), a row delayed by retry_after, and
// (lease form) a row whose lease a dead process left behind are each handled once they
// are due, by their group's subscription, and the delayed and leased rows not before.
func idlePollScenario(t *testing.T, h *harness, form rowactor.Form) {
	tb := newTelemetry(t)
	b := h.broker(tb.options()...)
	groups := []string{h.queue, "g1", "g2", "g3", "g4"}
	type handled struct {
		id    int64
		group string
		at    time.Time
	}
	got := make(chan handled, 16)
	for _, g := range groups {
		_, err := b.Subscribe(context.Background(), h.table, g, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			got <- handled{d.ID(), d.Queue(), time.Now()}
			return rowactor.Ack()
		}, rowactor.PollInterval(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond) // every subscription's first claim came back empty
	before := tb.sum(t, "rowactor.claim.duration")
	time.Sleep(time.Second)
	// Twenty polls each: 100 claims without the probe.
	if n := tb.sum(t, "rowactor.claim.duration") - before; n > int64(len(groups)) {
		t.Fatalf("%d claims in a second by %d idle subscriptions polled every 50 ms; the probe should leave them idle", n, len(groups))
	}

	insert := func(group string, set string, args ...any) int64 {
		t.Helper()
		cols, vals := "payload, grp", "?, ?"
		if set != "" {
			cols, vals = cols+", "+set, vals+", ?"
		}
		h.exec(fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s)", h.table.Name, cols, vals), append([]any{[]byte("by hand"), group}, args...)...)
		return int64(h.drv.count(t, h.d, fmt.Sprintf("SELECT max(id) FROM %s", h.table.Name)))
	}
	wait := func(id int64, group string, notBefore time.Time) {
		t.Helper()
		select {
		case d := <-got:
			if d.id != id || d.group != group {
				t.Fatalf("handled row %d of %s, want row %d of %s", d.id, d.group, id, group)
			}
			if d.at.Before(notBefore) {
				t.Fatalf("row %d handled %v before it was due", id, notBefore.Sub(d.at))
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("row %d of %s was never handled\nlogs:\n%s", id, group, h.logs.String())
		}
		h.waitSettled(1)
		if h.row(id).exists {
			t.Fatalf("row %d still exists after its ack", id)
		}
	}

	id := insert("g3", "")
	wait(id, "g3", time.Time{})

	due := time.Now().Add(400 * time.Millisecond)
	id = insert("g4", "retry_after", h.drv.timeValue(due))
	wait(id, "g4", due)

	if form == rowactor.FormLease {
		until := time.Now().Add(400 * time.Millisecond)
		id = insert("g1", "locked_until", h.drv.timeValue(until))
		wait(id, "g1", until)
	}
}

// dueProbeScenario checks DueQueues on rows written by hand, at one now.
func dueProbeScenario(t *testing.T, h *harness, form rowactor.Form) {
	p, ok := h.d.(dialects.DueProber)
	if !ok {
		t.Fatalf("the %s dialect does not probe", h.drv.name)
	}
	now := time.Now()
	ins := func(group, set string, v any) {
		t.Helper()
		cols, vals, args := "payload, grp", "?, ?", []any{[]byte("x"), group}
		if set != "" {
			cols, vals, args = cols+", "+set, vals+", ?", append(args, v)
		}
		h.exec(fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s)", h.table.Name, cols, vals), args...)
	}
	ins("due", "", nil)
	ins("due-at-now", "retry_after", h.drv.timeValue(now))
	ins("later", "retry_after", h.drv.timeValue(now.Add(time.Hour)))
	ins("done", "processed_at", h.drv.timeValue(now.Add(-time.Hour)))
	lease := form == rowactor.FormLease
	if lease {
		ins("leased", "locked_until", h.drv.timeValue(now.Add(time.Hour)))
		ins("lease-ran-out", "locked_until", h.drv.timeValue(now.Add(-time.Second)))
	}
	groups := []string{"due", "due-at-now", "later", "done", "empty"}
	want := []bool{true, true, false, false, false}
	if lease {
		groups = append(groups, "leased", "lease-ran-out")
		want = append(want, false, true)
	}
	// Past one statement's groups: the answer for the last of 70 comes from a second
	// statement, padded.
	for i := len(groups); i < 69; i++ {
		groups, want = append(groups, fmt.Sprintf("none-%d", i)), append(want, false)
	}
	groups, want = append(groups, "due"), append(want, true)
	got, err := p.DueQueues(context.Background(), h.table, lease, groups, now)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		for i := range want {
			if i < len(got) && got[i] != want[i] {
				t.Errorf("group %q: due %v, want %v", groups[i], got[i], want[i])
			}
		}
		t.Fatalf("DueQueues answered %d of %d", len(got), len(want))
	}
}
