package dashboard

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// plainTable creates a lease table without a group column under name (dropped when the
// test ends): the kind of table whose dead letters go to a table of their own.
func (f *fixture) plainTable(name string) rowactor.Table {
	f.t.Helper()
	return f.createTable(rowactor.Table{Name: name, ID: "id", Payload: "payload", Attempt: "attempt",
		RetryAfter: "retry_after", ProcessedAt: "processed_at", LockedUntil: "locked_until",
		Headers: "headers", Error: "error", DeadAt: "dead_at"})
}

// A table without groups moves its dead letters to a table of its own: the overview
// counts that table's rows on the queue's line, its job list and job pages are served, and
// "requeue" moves one or all of them back (attempt 1, due), on every database.
func TestDeadLetterTable(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.plainTable("dash_dlt_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36))
		dead := f.plainTable(tb.Name + "_dead")
		sub, err := f.b.Subscribe(ctx, tb, "", func(context.Context, *rowactor.Delivery) rowactor.Outcome {
			return rowactor.Fail(errors.New("provider down"))
		}, rowactor.PollInterval(50*time.Millisecond), rowactor.MaxAttempts(1), rowactor.DeadLetterTable(dead.Name))
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			f.publish(tb, "", "{}")
		}
		deadline := time.Now().Add(30 * time.Second)
		for f.count("SELECT count(*) FROM "+f.q(dead.Name)) != 3 {
			if time.Now().After(deadline) {
				t.Fatal("the subscription did not move its 3 rows to the dead-letter table")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := sub.Pause(ctx); err != nil { // requeued rows stay due, for the checks
			t.Fatal(err)
		}

		d, err := New(f.b, []Table{{Table: tb, DeadLetterTable: dead.Name}})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "/q")
		_, body := get(t, c, u+"/")
		if got := counts(t, body, tb.Name, ""); got["dead"] != "3" || got["queued"] != "0" {
			t.Fatalf("overview line %v: want 3 dead letters (the dead-letter table's rows) and 0 queued\n%s", got, body)
		}
		if !strings.Contains(body, `href="/q/jobs?table=`+url.QueryEscape(dead.Name)+`"`) {
			t.Errorf("the dead-letter count does not link to the dead-letter table's job list:\n%s", body)
		}

		_, list := get(t, c, u+"/jobs?table="+url.QueryEscape(dead.Name))
		ids := listed(t, list)
		if len(ids) != 3 || !strings.Contains(list, "dead letters of "+tb.Name) || strings.Count(list, `data-state="dead"`) != 3 || strings.Contains(list, `name="state"`) {
			t.Fatalf("the dead-letter table's job list shows %v; want its 3 rows in state dead, marked as %s's dead letters, and no state filter\n%s", ids, tb.Name, list)
		}
		status, job := get(t, c, u+"/job?table="+url.QueryEscape(dead.Name)+"&id="+strconv.FormatInt(ids[0], 10))
		if status != http.StatusOK || !strings.Contains(job, "provider down") || !strings.Contains(job, `data-op="requeue"`) || !strings.Contains(job, `data-field="state">dead<`) {
			t.Fatalf("a dead letter's page: %d; want its error and a requeue button\n%s", status, job)
		}

		// Requeue one, from its page's form.
		status, res := post(t, c, u+"/action", url.Values{"op": {"requeue"}, "table": {dead.Name}, "id": {strconv.FormatInt(ids[0], 10)}, "csrf": {token(t, job)}})
		if status != http.StatusOK || !strings.Contains(res, "Moved 1 dead letter") {
			t.Fatalf("requeue one: %d\n%s", status, res)
		}
		if n := f.count("SELECT count(*) FROM "+f.q(tb.Name)+" WHERE id = ? AND attempt = 1 AND processed_at IS NULL AND dead_at IS NULL AND locked_until IS NULL", ids[0]); n != 1 {
			t.Errorf("the requeued row is not back in %s, due at attempt 1", tb.Name)
		}
		if got := counts(t, overviewOf(t, c, u), tb.Name, ""); got["dead"] != "2" || got["queued"] != "1" || got["due"] != "1" {
			t.Errorf("after requeuing one: %v, want 2 dead, 1 queued and due", got)
		}

		// Requeue the rest, from the overview's button.
		status, res = post(t, c, u+"/action", url.Values{"op": {"requeue"}, "table": {dead.Name}, "csrf": {token(t, body)}})
		if status != http.StatusOK || !strings.Contains(res, "Moved 2 dead letter") {
			t.Fatalf("requeue all: %d\n%s", status, res)
		}
		if n := f.count("SELECT count(*) FROM " + f.q(dead.Name)); n != 0 {
			t.Errorf("%d rows left in the dead-letter table after requeue all", n)
		}
		if got := counts(t, overviewOf(t, c, u), tb.Name, ""); got["dead"] != "0" || got["queued"] != "3" {
			t.Errorf("after requeuing all: %v, want 0 dead and 3 queued", got)
		}
	})
}

func overviewOf(t *testing.T, c *http.Client, u string) string {
	t.Helper()
	_, body := get(t, c, u+"/")
	return body
}

// A dead-letter table the dashboard cannot serve is refused at New, naming the fix.
func TestDeadLetterTableRefused(t *testing.T) {
	f := newFixture(t, databases[0])
	grouped := f.jobsTable("dash_dltr_")
	plain := f.plainTable("dash_dltr_plain")
	for _, c := range []struct {
		name   string
		tables []Table
		want   string
	}{
		{"a table with groups", []Table{{Table: grouped, DeadLetterTable: "x_dead"}}, "keeps its dead letters in a group"},
		{"the table itself", []Table{{Table: plain, DeadLetterTable: plain.Name}}, "DeadLetterTable"},
		{"a table also shown", []Table{{Table: plain, DeadLetterTable: grouped.Name}, {Table: grouped}}, "named as a dead-letter table and as a table to show"},
		{"two tables' dead-letter table", []Table{{Table: plain, DeadLetterTable: "shared_dead"}, {Table: func() rowactor.Table { x := plain; x.Name = "other"; return x }(), DeadLetterTable: "shared_dead"}}, "dead-letter table of two tables"},
	} {
		_, err := New(f.b, c.tables)
		var ce *dialects.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New returned %v; want a *ConfigError saying %q", c.name, err, c.want)
		}
	}
}
