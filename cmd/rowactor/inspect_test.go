package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// TestInspect runs on every database and form: inspect tells a due, a delayed, a held and
// a processed row apart as stats counts them, prints the columns the flags name, and is an
// error (exit 1) for an id the table does not hold.
func TestInspect(t *testing.T) {
	for _, db := range databases {
		for _, form := range db.forms {
			t.Run(db.name+"/"+form.String(), func(t *testing.T) {
				f := newFixture(t, db)
				tb := queueTable(f.tableName("ra_insp_"), form)
				f.create(tb)
				now := time.Now()
				counted := form == rowactor.FormLease || (form == rowactor.FormAdvisory && db.holdKey != nil)
				due := f.publish(tb, "jobs", "fresh")
				delayed := f.publish(tb, "jobs", "later", rowactor.After(time.Hour))
				processed := f.publish(tb, "other", "done")
				f.set(tb, processed, tb.ProcessedAt, now)
				held := f.publish(tb, "jobs", "held")
				switch {
				case form == rowactor.FormLease:
					f.set(tb, held, tb.LockedUntil, now.Add(time.Hour))
				case form == rowactor.FormAdvisory && db.holdKey != nil:
					db.holdKey(t, f.sql, fmt.Sprintf("%s-%d", tb.Name, held))
				}
				inspect := func(id int64) inspectLine {
					t.Helper()
					code, out, errOut := cli(append([]string{"inspect", "-dsn", f.dsn, "-json"}, append(columnFlags(tb), tb.Name, fmt.Sprint(id))...)...)
					if code != exitOK {
						t.Fatalf("inspect %d: exit %d: %s", id, code, errOut)
					}
					var l inspectLine
					if err := json.Unmarshal([]byte(out), &l); err != nil {
						t.Fatalf("inspect -json %q: %v", out, err)
					}
					// Every row's column reads 1, as published: the calls made read 0, but
					// for a finished row of the row lock form, whose column counts them.
					want := dialects.AttemptsMade(form, 1, id == processed)
					if l.ID != id || l.Table != tb.Name || l.InWorkCounted != counted || l.Attempt == nil || *l.Attempt != want {
						t.Fatalf("inspect %d: %+v", id, l)
					}
					return l
				}
				if l := inspect(due); l.State != "due" || l.Payload == nil || *l.Payload != "fresh" || *l.Group != "jobs" || l.RetryAfter != nil {
					t.Errorf("due row: %+v", l)
				}
				if l := inspect(delayed); l.State != "delayed" || l.RetryAfter == nil || l.RetryAfter.Before(now.Add(50*time.Minute)) {
					t.Errorf("delayed row: %+v", l)
				}
				if l := inspect(processed); l.State != "processed" || l.ProcessedAt == nil || *l.Group != "other" {
					t.Errorf("processed row: %+v", l)
				}
				wantHeld := "in work"
				if !counted {
					wantHeld = "due"
				}
				if l := inspect(held); l.State != wantHeld {
					t.Errorf("held row: %+v, want %s", l, wantHeld)
				}
				// The text form says what it cannot tell.
				code, out, errOut := cli(append([]string{"inspect", "-dsn", f.dsn}, append(columnFlags(tb), tb.Name, fmt.Sprint(held))...)...)
				if code != exitOK || !strings.Contains(out, `"held"`) || counted == strings.Contains(out, "cannot tell") {
					t.Errorf("inspect text: exit %d\n%s%s", code, out, errOut)
				}
				code, _, errOut = cli(append([]string{"inspect", "-dsn", f.dsn}, append(columnFlags(tb), tb.Name, "999999")...)...)
				if code != exitFailed || !strings.Contains(errOut, "no row") || !strings.Contains(errOut, tb.Name) {
					t.Errorf("inspect of a missing id: exit %d: %s", code, errOut)
				}
			})
		}
	}
}

// TestRequeueRows runs on every database: -rows moves only the dead letters it names, from
// a group and from a table; naming a row that is not a dead letter of the source moves
// nothing and fails; -dry-run counts the named rows.
func TestRequeueRows(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			f := newFixture(t, db)
			tb := queueTable(f.tableName("ra_rows_"), rowactor.FormLease)
			f.create(tb)
			live := f.publish(tb, "jobs", "live")
			var dead []int64
			for i := range 3 {
				id := f.publish(tb, "jobs-dead", fmt.Sprintf("dead-%d", i))
				f.set(tb, id, tb.Attempt, 5)
				dead = append(dead, id)
			}
			requeue := append([]string{"requeue", "-dsn", f.dsn, "-from-group", "jobs-dead", "-to-group", "jobs"}, columnFlags(tb)...)
			groupOf := func() map[int64]string {
				got := map[int64]string{}
				for id, r := range f.rows(tb, tb.Name) {
					got[id] = r["Group"] + "/" + r["Attempt"]
				}
				return got
			}
			before := groupOf()
			for _, bad := range []string{fmt.Sprint(live), fmt.Sprintf("%d,%d", dead[0], 999999)} {
				code, _, errOut := cli(append(requeue, "-rows", bad, tb.Name)...)
				if code != exitFailed || !strings.Contains(errOut, "is not in dead-letter group") {
					t.Errorf("requeue -rows %s: exit %d: %s", bad, code, errOut)
				}
			}
			code, out, errOut := cli(append(requeue, "-rows", fmt.Sprintf("%d,%d", dead[2], dead[0]), "-dry-run", tb.Name)...)
			if code != exitOK || !strings.Contains(out, "would move 2 rows") {
				t.Errorf("requeue -rows -dry-run: exit %d: %s%s", code, out, errOut)
			}
			if got := groupOf(); fmt.Sprint(got) != fmt.Sprint(before) {
				t.Fatalf("refused and dry runs changed rows: %v -> %v", before, got)
			}
			code, out, errOut = cli(append(requeue, "-rows", fmt.Sprint(dead[1]), tb.Name)...)
			if code != exitOK || !strings.Contains(out, "moved 1 row ") {
				t.Fatalf("requeue -rows %d: exit %d: %s%s", dead[1], code, out, errOut)
			}
			want := map[int64]string{live: "jobs/1", dead[0]: "jobs-dead/5", dead[1]: "jobs/1", dead[2]: "jobs-dead/5"}
			if got := groupOf(); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("after requeue -rows %d: %v, want %v", dead[1], got, want)
			}
		})
	}
}

// TestRetryAndCancel runs on every database in the lease form: retry makes a delayed row
// due, cancel marks a queued row processed with its reason, and both refuse a row whose
// lease runs (exit 1, the row unchanged).
func TestRetryAndCancel(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			f := newFixture(t, db)
			tb := queueTable(f.tableName("ra_jc_"), rowactor.FormLease)
			tb.Error = "error"
			f.create(tb)
			delayed := f.publish(tb, "jobs", "later", rowactor.After(time.Hour))
			held := f.publish(tb, "jobs", "held")
			f.set(tb, held, tb.LockedUntil, time.Now().Add(time.Hour))
			run := func(args ...string) (int, string, string) {
				return cli(append(append([]string{args[0], "-dsn", f.dsn}, columnFlags(tb)...), args[1:]...)...)
			}
			state := func(id int64) inspectLine {
				t.Helper()
				code, out, errOut := run("inspect", "-json", tb.Name, fmt.Sprint(id))
				var l inspectLine
				if code != exitOK || json.Unmarshal([]byte(out), &l) != nil {
					t.Fatalf("inspect %d: exit %d: %s%s", id, code, out, errOut)
				}
				return l
			}
			if code, out, errOut := run("retry", tb.Name, fmt.Sprint(delayed)); code != exitOK || !strings.Contains(out, "due now") {
				t.Fatalf("retry: exit %d: %s%s", code, out, errOut)
			}
			if l := state(delayed); l.State != "due" || l.RetryAfter != nil {
				t.Errorf("after retry: %+v", l)
			}
			for _, c := range []string{"retry", "cancel"} {
				code, _, errOut := run(c, tb.Name, fmt.Sprint(held))
				if code != exitFailed || !strings.Contains(errOut, "in work") {
					t.Errorf("%s of a row in work: exit %d: %s", c, code, errOut)
				}
				if c == "cancel" && !strings.Contains(errOut, "without -cancel-requests") {
					t.Errorf("cancel of a row in work does not say it cannot cancel a delivery: %s", errOut)
				}
			}
			if l := state(held); l.State != "in work" || l.ProcessedAt != nil {
				t.Errorf("the row in work after refusals: %+v", l)
			}
			if code, out, errOut := run("cancel", "-reason", "customer left", tb.Name, fmt.Sprint(delayed)); code != exitOK || !strings.Contains(out, "cancelled") {
				t.Fatalf("cancel: exit %d: %s%s", code, out, errOut)
			}
			if l := state(delayed); l.State != "cancelled" || l.Error == nil || *l.Error != "cancelled: customer left" {
				t.Errorf("after cancel: %+v", l)
			}
		})
	}
}

// TestCancelReachesARowInWorkInAnotherProcess runs on every database in the lease form:
// with -cancel-requests, cancel of a row that a subscription of another process (here the
// test's broker) holds cancels its handler's context with the reason, and the row ends
// cancelled; with a -wait too short, the request is withdrawn and the command says so.
func TestCancelReachesARowInWorkInAnotherProcess(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			f := newFixture(t, db)
			tb := queueTable(f.tableName("ra_cr_"), rowactor.FormLease)
			tb.Error, tb.ProcessedAt = "error", "processed_at"
			tb.CancelRequests = f.tableName("ra_crq_")
			f.create(tb)
			id := f.publish(tb, "jobs", "held")
			cause := make(chan error, 1)
			started := make(chan struct{})
			if _, err := f.b.Subscribe(ctx, tb, "jobs", func(hctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				close(started)
				<-hctx.Done()
				cause <- context.Cause(hctx)
				return rowactor.Ack()
			}); err != nil {
				t.Fatal(err)
			}
			<-started
			run := func(args ...string) (int, string, string) {
				return cli(append(append([]string{args[0], "-dsn", f.dsn}, columnFlags(tb)...), args[1:]...)...)
			}
			code, out, errOut := run("cancel", "-reason", "customer left", "-wait", "15s", tb.Name, fmt.Sprint(id))
			if code != exitOK || !strings.Contains(out, "cancelled") {
				t.Fatalf("cancel of a row in work in another process: exit %d: %s%s", code, out, errOut)
			}
			if c := <-cause; !errors.Is(c, rowactor.ErrCancelled) || !strings.Contains(c.Error(), "customer left") {
				t.Fatalf("the handler's context ended with %v, want ErrCancelled and the reason", c)
			}
			code, out, errOut = run("inspect", "-json", tb.Name, fmt.Sprint(id))
			var l inspectLine
			if code != exitOK || json.Unmarshal([]byte(out), &l) != nil {
				t.Fatalf("inspect: exit %d: %s%s", code, out, errOut)
			}
			if l.State != "cancelled" || l.Error == nil || *l.Error != "cancelled: customer left" {
				t.Fatalf("after cancel: %+v", l)
			}

			// A row in work whose holder is gone (a lease and no process): -wait ends the
			// command, and the request is withdrawn.
			gone := f.publish(tb, "later", "held by nobody")
			f.set(tb, gone, tb.LockedUntil, time.Now().Add(time.Hour))
			code, _, errOut = run("cancel", "-wait", "200ms", tb.Name, fmt.Sprint(gone))
			if code != exitFailed || !strings.Contains(errOut, "request is withdrawn") {
				t.Fatalf("cancel whose -wait ran out: exit %d: %s", code, errOut)
			}
		})
	}
}
