package rowactor_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

var idlePollScenarios = []scenario{
	{
		name: "idle subscriptions of one table are polled by one probe, and a row written by hand, a delayed row and an expired lease each reach a worker",
		run:  idlePollScenario,
	},
	{
		name:   "the due probe answers per group: due, delayed, leased, finished, empty, and past one statement's groups",
		shapes: []tableShape{withProcessedAt},
		run:    dueProbeScenario,
	},
	{
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
	// Ten polls each would be 50 claims in half a second without the probe. The first
	// claims, each subscription's own, come back empty at their own pace under load: a
	// window may still see some of them, so the probe has three windows to show idle.
	for window := 1; ; window++ {
		before := tb.sum(t, "rowactor.claim.duration")
		time.Sleep(500 * time.Millisecond)
		n := tb.sum(t, "rowactor.claim.duration") - before
		if n <= int64(len(groups)) {
			break
		}
		if window == 3 {
			t.Fatalf("%d claims in half a second by %d idle subscriptions polled every 50 ms; the probe should leave them idle", n, len(groups))
		}
	}

	insert := func(group string, set string, args ...any) int64 {
		t.Helper()
		var v any
		if len(args) > 0 {
			v = args[0]
		}
		return insertByHandSetting(t, h, group, set, v)
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

// probeCase is one group's row.
type probeCase struct {
	group               string
	retry, locked, proc *time.Duration // offsets from now; nil: NULL
	noRow               bool
}

func dur(d time.Duration) *time.Duration { return &d }

func probeCases(lease, processed bool) []probeCase {
	offsets := []time.Duration{-time.Millisecond, -time.Microsecond, -999 * time.Nanosecond, -500 * time.Nanosecond, -time.Nanosecond, 0,
		time.Nanosecond, 500 * time.Nanosecond, 999 * time.Nanosecond, time.Microsecond, time.Millisecond}
	var cs []probeCase
	odd := []string{"", " ", "g ", "O'Brien", `a"b`, "a`b", "ü-ß", "%", "_", `back\slash`, "x;DROP", strings.Repeat("l", 60)}
	n := 0
	name := func() string {
		n++
		if n <= len(odd) {
			return odd[n-1]
		}
		return fmt.Sprintf("g%03d", n)
	}
	// The group without rows is named apart: MySQL's PAD SPACE collations make " " and ""
	// one group, to the claim and the probe alike.
	cs = append(cs, probeCase{group: name()}, probeCase{group: "no rows", noRow: true})
	for _, o := range offsets {
		cs = append(cs, probeCase{group: name(), retry: dur(o)})
		if lease {
			cs = append(cs, probeCase{group: name(), locked: dur(o)})
			cs = append(cs, probeCase{group: name(), retry: dur(-time.Second), locked: dur(o)})
			cs = append(cs, probeCase{group: name(), retry: dur(o), locked: dur(-o)})
		}
	}
	if processed {
		cs = append(cs, probeCase{group: name(), proc: dur(-time.Hour)}, probeCase{group: name(), proc: dur(time.Hour)})
	}
	return cs
}

// quoteFor quotes an identifier the way the suite's driver expects it in a hand-written
// statement.
func quoteFor(drv string, name string) string {
	if drv == "postgres" {
		return pgQuote(name)
	}
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

// TestIdlePollProbeAgreesWithClaim proves that the due probe never answers "not due" for a
// group whose claim at the same now would take a row: rows whose times sit within a
// millisecond of now, in groups and tables whose names need quoting, are probed and claimed
// group by group; without FIFO the two agree exactly, with FIFO the probe may only err
// towards "due".
func TestIdlePollProbeAgreesWithClaim(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			for _, variant := range []string{"plain", "processed", "odd-names", "fifo", "no-retry-after"} {
				if variant == "fifo" && (form == rowactor.FormAdvisory) {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/%s", drv.name, form, variant), func(t *testing.T) {
					var shapes []tableShape
					switch variant {
					case "processed":
						shapes = append(shapes, withProcessedAt)
					case "no-retry-after":
						shapes = append(shapes, withoutRetryAfter, withProcessedAt)
					case "fifo":
						shapes = append(shapes, func(tb *rowactor.Table) { tb.FIFO = true })
					case "odd-names":
						shapes = append(shapes, func(tb *rowactor.Table) {
							tb.Name = tb.Name + ` o"d'd`
							tb.Group = `g"r'p`
							tb.RetryAfter = "retry after"
							if tb.LockedUntil != "" {
								tb.LockedUntil = `locked"until`
							}
							if tb.AdvisoryKey != "" {
								tb.AdvisoryKey = "k-{" + tb.ID + "}"
							}
						})
					}
					h := newHarness(t, drv, form, shapes...)
					probeAgreesWithClaim(t, h, form, variant == "fifo")
				})
			}
		}
	}
}

func probeAgreesWithClaim(t *testing.T, h *harness, form rowactor.Form, fifo bool) {
	ctx := context.Background()
	tb := h.table
	lease := form == rowactor.FormLease
	cases := probeCases(lease, tb.ProcessedAt != "")
	// A now with a sub-microsecond part, truncated nowhere.
	now := time.Now().UTC().Truncate(time.Second).Add(-time.Minute + 123456789*time.Nanosecond)
	q := func(s string) string { return quoteFor(h.drv.name, s) }
	tv := func(d *time.Duration) any {
		if d == nil {
			return nil
		}
		return h.drv.timeValue(now.Add(*d))
	}
	for _, c := range cases {
		if c.noRow {
			continue
		}
		cols := []string{q(tb.Payload), q(tb.Group)}
		args := []any{[]byte("x"), c.group}
		if tb.RetryAfter != "" {
			cols, args = append(cols, q(tb.RetryAfter)), append(args, tv(c.retry))
		}
		if lease {
			cols, args = append(cols, q(tb.LockedUntil)), append(args, tv(c.locked))
		}
		if tb.ProcessedAt != "" {
			cols, args = append(cols, q(tb.ProcessedAt)), append(args, tv(c.proc))
		}
		h.exec(fmt.Sprintf("INSERT INTO %s (%s) VALUES (?%s)", q(tb.Name), strings.Join(cols, ", "), strings.Repeat(", ?", len(cols)-1)), args...)
	}
	groups := make([]string, len(cases))
	for i, c := range cases {
		groups[i] = c.group
	}
	due, err := h.d.(dialects.DueProber).DueQueues(ctx, tb, lease, groups, now)
	if err != nil {
		t.Fatalf("DueQueues: %v", err)
	}
	if len(due) != len(groups) {
		t.Fatalf("DueQueues answered %d of %d", len(due), len(groups))
	}
	for i, c := range cases {
		took := claimOnce(t, h, form, c.group, now)
		switch {
		case !due[i] && took:
			t.Errorf("group %q (retry %v, locked %v, processed %v): the probe says not due but the claim took its row", c.group, show(c.retry), show(c.locked), show(c.proc))
		case due[i] && !took && !fifo:
			t.Errorf("group %q (retry %v, locked %v, processed %v): the probe says due but the claim took nothing", c.group, show(c.retry), show(c.locked), show(c.proc))
		}
	}
}

func show(d *time.Duration) string {
	if d == nil {
		return "NULL"
	}
	return d.String()
}

// claimOnce runs one claim of group's queue at now and reports whether it took a row (a
// row lock claim is rolled back; a lease claim leases the row, which no later case reads).
func claimOnce(t *testing.T, h *harness, form rowactor.Form, group string, now time.Time) bool {
	t.Helper()
	ctx := context.Background()
	q, err := h.d.Open(ctx, dialects.QueueSpec{Table: h.table, Group: group})
	if err != nil {
		t.Fatalf("Open %q: %v", group, err)
	}
	defer q.Close()
	switch form {
	case rowactor.FormLease:
		rows, err := q.(dialects.LeaseQueue).ClaimLeases(ctx, now, now.Add(time.Hour), 1)
		if err != nil {
			t.Fatalf("ClaimLeases %q: %v", group, err)
		}
		return len(rows) > 0
	case rowactor.FormAdvisory:
		cs, err := q.(dialects.AdvisoryQueue).Candidates(ctx, now, 1)
		if err != nil {
			t.Fatalf("Candidates %q: %v", group, err)
		}
		return len(cs) > 0
	default:
		cl, ok, err := q.(dialects.RowLockQueue).ClaimLocked(ctx, now)
		if err != nil {
			t.Fatalf("ClaimLocked %q: %v", group, err)
		}
		if ok {
			if err := cl.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return ok
	}
}
