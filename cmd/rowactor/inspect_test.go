package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
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
					if l.ID != id || l.Table != tb.Name || l.InWorkCounted != counted || l.Attempt == nil || *l.Attempt != 1 {
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
