package dashboard

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// A row a failing handler moved into its dead-letter group reads as dead on every page:
// the overview counts it as its queue's dead letter and as its group's own, never as due
// nor as the oldest due; the job list and the job page show it dead with its time of
// death, and offer a requeue, never a cancel. A dashboard not told of the dead-letter
// group still shows the row dead (its dead_at says so), with no requeue, since it knows no
// queue to move it back to.
func TestDeadLettersReadDead(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_dead_")
		start := time.Now()
		dies := f.deadLetter(tb, "emails", "emails-dead")
		end := time.Now()
		due := f.publish(tb, "emails", "{}")
		d, err := New(f.b, []Table{{Table: tb, DeadLetters: map[string]string{"emails": "emails-dead"}}})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "")
		_, body := get(t, c, u+"/")
		if got := counts(t, body, tb.Name, "emails"); got["due"] != "1" || got["queued"] != "1" || got["dead"] != "1" ||
			!strings.Contains(body, fmt.Sprintf("&amp;id=%d\">#%d</a>", due, due)) {
			t.Errorf("emails: %v, want 1 due (the oldest, #%d), 1 dead letter", got, due)
		}
		if got := counts(t, body, tb.Name, "emails-dead"); got["due"] != "0" || got["queued"] != "0" || got["dead"] != "1" || got["oldest"] != "–" {
			t.Errorf("emails-dead: %v, want 1 dead, nothing due, no oldest due", got)
		}
		if strings.Contains(body, fmt.Sprintf("&amp;id=%d\">#%d</a>", dies, dies)) {
			t.Errorf("the dead letter #%d is shown as an oldest due row", dies)
		}

		// Both pages say when it died: between start and end, to the second.
		died := func(page string) bool {
			for at := start.Add(-time.Second).Truncate(time.Second); !at.After(end.Add(time.Second)); at = at.Add(time.Second) {
				if strings.Contains(page, "died "+at.UTC().Format(time.DateTime)+" UTC") {
					return true
				}
			}
			return false
		}
		_, list := get(t, c, u+"/jobs?table="+url.QueryEscape(tb.Name))
		line := jobLine(list, dies)
		if !strings.Contains(line, `data-state="dead"`) || !died(line) || !strings.Contains(line, `data-op="requeue"`) || strings.Contains(line, `data-op="cancel"`) {
			t.Errorf("the dead letter's line in the job list: want dead, its time of death, a requeue and no cancel:\n%s", line)
		}
		if line := jobLine(list, due); !strings.Contains(line, `data-state="due"`) || !strings.Contains(line, `data-op="cancel"`) || strings.Contains(line, `data-op="requeue"`) {
			t.Errorf("the queued row's line: want due with a cancel:\n%s", line)
		}
		_, list = get(t, c, u+"/jobs?table="+url.QueryEscape(tb.Name)+"&group=emails-dead&state=dead")
		if got := listed(t, list); len(got) != 1 || got[0] != dies {
			t.Errorf("the dead-letter group's dead rows: %v, want [%d]", got, dies)
		}
		if status, _ := get(t, c, u+"/jobs?table="+url.QueryEscape(tb.Name)+"&group=emails-dead&state=due"); status != http.StatusBadRequest {
			t.Errorf("filtering a dead-letter group's due rows: %d, want 400 (its rows are dead)", status)
		}
		_, page := get(t, c, fmt.Sprintf("%s/job?table=%s&id=%d", u, url.QueryEscape(tb.Name), dies))
		if !strings.Contains(page, `data-field="state">dead<`) || !died(page) || !strings.Contains(page, `data-op="requeue"`) || strings.Contains(page, `data-op="cancel"`) {
			t.Errorf("the dead letter's page: want dead, its time of death, a requeue and no cancel:\n%s", page)
		}

		// Told of no dead-letter group, the dashboard still reads the row's dead_at.
		blind, err := New(f.b, []Table{{Table: tb}})
		if err != nil {
			t.Fatal(err)
		}
		bc, bu := serve(t, blind, "")
		_, body = get(t, bc, bu+"/")
		if got := counts(t, body, tb.Name, "emails-dead"); got["due"] != "0" || got["dead"] != "1" {
			t.Errorf("emails-dead, told of no dead-letter group: %v, want 1 dead, nothing due", got)
		}
		_, page = get(t, bc, fmt.Sprintf("%s/job?table=%s&id=%d", bu, url.QueryEscape(tb.Name), dies))
		if !strings.Contains(page, `data-field="state">dead<`) || !strings.Contains(page, `data-no-requeue="1"`) || strings.Contains(page, `data-op="cancel"`) {
			t.Errorf("the dead letter's page, told of no dead-letter group: want dead, no requeue button and why, no cancel:\n%s", page)
		}
	})
}
