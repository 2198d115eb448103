package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// Review of the idle probe (actors.IdlePoll, dialects.DueProber): a probe that answers
// "not due" for a group must never hide a row that the group's claim, run at the same now,
// would take. Each group below holds one row written by hand whose times sit around now
// closer than the databases store (a nanosecond to a millisecond either side), with group
// values and identifiers that need quoting; the probe is then compared group by group with
// a real claim at that now. Without FIFO the two must agree exactly; with FIFO the probe
// may say due where the claim takes nothing, never the reverse.

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

func TestReviewIdlePollProbeAgreesWithClaim(t *testing.T) {
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
