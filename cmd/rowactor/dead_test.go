package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// TestStatsAndInspectTellDeadLetters runs on every database and form: a row a failing
// handler moved into its dead-letter group counts as DEAD in stats, not as DUE (a dead
// letter whose retry_after is ahead not as DELAYED either), is never the oldest due, and
// inspect reads it as dead with its time of death. Without -dead-at nothing tells it, and
// stats says n/a.
func TestStatsAndInspectTellDeadLetters(t *testing.T) {
	for _, db := range databases {
		for _, form := range db.forms {
			t.Run(db.name+"/"+form.String(), func(t *testing.T) {
				f := newFixture(t, db)
				tb := queueTable(f.tableName("ra_cli_dead_"), form)
				tb.DeadAt = "dead_at"
				f.create(tb)
				start := time.Now()
				dies := f.moveToDeadGroup(tb, "jobs", "jobs-dead")
				end := time.Now()
				later := f.publish(tb, "jobs-dead", "dead, delayed", rowactor.After(time.Hour))
				f.set(tb, later, tb.DeadAt, start)
				due := f.publish(tb, "jobs", "due")

				// A claim in flight as Pause returned (advisory form) may hold the due row's key
				// a moment, and give it back: the row reads as in work until then.
				got := f.stats(tb)
				for deadline := time.Now().Add(5 * time.Second); got["jobs"].Due != 1 && time.Now().Before(deadline); got = f.stats(tb) {
					time.Sleep(20 * time.Millisecond)
				}
				if l := got["jobs-dead"]; l.Due != 0 || l.Dead == nil || *l.Dead != 2 || *l.Delayed != 0 || l.OldestDueID != nil {
					t.Errorf("jobs-dead: due %d, dead %v, delayed %d, oldest due %v; want 0, 2, 0 and none", l.Due, l.Dead, *l.Delayed, l.OldestDueID)
				}
				if l := got["jobs"]; l.Due != 1 || l.Dead == nil || *l.Dead != 0 || l.OldestDueID == nil || *l.OldestDueID != due {
					t.Errorf("jobs: due %d, dead %v, oldest due %v; want 1, 0 and row %d", l.Due, l.Dead, l.OldestDueID, due)
				}
				code, out, errOut := cli(append([]string{"stats", "-dsn", f.dsn}, append(columnFlags(tb), tb.Name)...)...)
				if code != exitOK || !strings.Contains(out, "DUE  DELAYED  DEAD  IN WORK") || !hasFields(out, "jobs-dead", "0", "0", "2") {
					t.Errorf("stats (text): exit %d, want jobs-dead with 0 due, 0 delayed, 2 dead\n%s%s", code, out, errOut)
				}

				inspect := append([]string{"inspect", "-dsn", f.dsn}, columnFlags(tb)...)
				code, out, errOut = cli(append(inspect, "-json", tb.Name, fmt.Sprint(dies))...)
				var l inspectLine
				if err := json.Unmarshal([]byte(out), &l); code != exitOK || err != nil {
					t.Fatalf("inspect -json: exit %d, %v: %s%s", code, err, out, errOut)
				}
				if l.State != "dead" || l.Group == nil || *l.Group != "jobs-dead" || l.DeadAt == nil ||
					l.DeadAt.Before(start.Add(-time.Second)) || l.DeadAt.After(end.Add(time.Second)) {
					t.Errorf("inspect of the dead letter: %+v (dead_at %v), want dead since between %v and %v", l, l.DeadAt, start, end)
				}
				code, out, errOut = cli(append(inspect, tb.Name, fmt.Sprint(dies))...)
				if code != exitOK || !hasFields(out, "STATE", "dead") || !strings.Contains(out, "DEAD AT") {
					t.Errorf("inspect (text): exit %d, want STATE dead and DEAD AT\n%s%s", code, out, errOut)
				}

				blind := tb
				blind.DeadAt = ""
				if l := f.stats(blind)["jobs-dead"]; l.Dead != nil || l.Due+*l.Delayed != 2 {
					t.Errorf("stats without -dead-at: dead %v, due %d, delayed %d; want null, and the dead letters due or delayed", l.Dead, l.Due, *l.Delayed)
				}
			})
		}
	}
}

// moveToDeadGroup publishes a row into queue and lets a subscription whose handler fails
// past MaxAttempts(1) move it into dead; it returns the row's id once it moved. The
// subscription is paused by then, so rows published afterwards stay where they are.
func (f *fixture) moveToDeadGroup(tb rowactor.Table, queue, dead string) int64 {
	f.t.Helper()
	sub, err := f.b.Subscribe(ctx, tb, queue, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Retry() },
		rowactor.MaxAttempts(1), rowactor.DeadLetterGroup(dead), rowactor.PollInterval(20*time.Millisecond))
	if err != nil {
		f.t.Fatal(err)
	}
	id := f.publish(tb, queue, "dies")
	deadline := time.Now().Add(30 * time.Second)
	for f.rows(tb, tb.Name)[id]["Group"] != dead {
		if time.Now().After(deadline) {
			f.t.Fatalf("row %d did not move into %s: %v", id, dead, f.rows(tb, tb.Name)[id])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := sub.Pause(ctx); err != nil {
		f.t.Fatal(err)
	}
	return id
}

// hasFields reports whether a line of out starts with these whitespace-separated fields.
func hasFields(out string, fields ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		got := strings.Fields(line)
		if len(got) >= len(fields) && strings.Join(got[:len(fields)], " ") == strings.Join(fields, " ") {
			return true
		}
	}
	return false
}
