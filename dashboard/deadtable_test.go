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
		status, res = post(t, c, u+"/action", url.Values{"op": {"requeue"}, "table": {dead.Name}, "csrf": {token(t, body)}, "confirm": {"1"}})
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

// deadLetters makes n dead letters of a fresh table without groups, moved into its
// dead-letter table by a real subscription (MaxAttempts(1)), which is paused afterwards.
func deadLetters(t *testing.T, f *fixture, prefix string, n int) (tb, dead rowactor.Table) {
	t.Helper()
	tb = f.plainTable(prefix + strconv.FormatInt(time.Now().UnixNano()%1e9, 36))
	dead = f.plainTable(tb.Name + "_dead")
	sub, err := f.b.Subscribe(ctx, tb, "", func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		return rowactor.Fail(errors.New("provider down"))
	}, rowactor.PollInterval(50*time.Millisecond), rowactor.MaxAttempts(1), rowactor.DeadLetterTable(dead.Name))
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		f.publish(tb, "", "{}")
	}
	deadline := time.Now().Add(30 * time.Second)
	for f.count("SELECT count(*) FROM "+f.q(dead.Name)) != int64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("the subscription did not move its %d rows to the dead-letter table", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := sub.Pause(ctx); err != nil { // requeued rows stay due, for the checks
		t.Fatal(err)
	}
	return tb, dead
}

// A dead letter's page offers requeue only, and a cancel posted anyway is refused or, if
// accepted, never puts the row back into the queue as unfinished on the next requeue.
func TestDeadLetterRefusesCancel(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb, dead := deadLetters(t, f, "dash_r2c_", 2)
		d, err := New(f.b, []Table{{Table: tb, DeadLetterTable: dead.Name}})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "")
		_, list := get(t, c, u+"/jobs?table="+url.QueryEscape(dead.Name))
		ids := listed(t, list)
		if len(ids) != 2 {
			t.Fatalf("dead-letter list: %v", ids)
		}
		cancelled := ids[0]
		_, job := get(t, c, u+"/job?table="+url.QueryEscape(dead.Name)+"&id="+strconv.FormatInt(cancelled, 10))
		// A dead letter's page offers requeue only, and a cancel posted anyway is refused.
		if strings.Contains(job, `data-op="cancel"`) || strings.Contains(job, `data-op="retry"`) || !strings.Contains(job, `data-op="requeue"`) {
			t.Errorf("a dead letter's page offers cancel or retry, or no requeue:\n%s", job)
		}
		status, res := post(t, c, u+"/action", url.Values{"op": {"cancel"}, "table": {dead.Name}, "id": {strconv.FormatInt(cancelled, 10)}, "csrf": {token(t, job)}})
		if status == http.StatusBadRequest && strings.Contains(res, "requeue it") {
			if n := f.count("SELECT count(*) FROM "+f.q(dead.Name)+" WHERE id = ? AND processed_at IS NULL", cancelled); n != 1 {
				t.Errorf("a refused cancel changed dead letter %d", cancelled)
			}
			return
		}
		t.Logf("cancel of dead letter %d: %d %s", cancelled, status, resultOf(res))

		body := overviewOf(t, c, u)
		deadCount := counts(t, body, tb.Name, "")["dead"]
		status, res = post(t, c, u+"/action", url.Values{"op": {"requeue"}, "table": {dead.Name}, "csrf": {token(t, body)}, "confirm": {"1"}})
		if status != http.StatusOK {
			t.Fatalf("requeue all: %d %s", status, resultOf(res))
		}
		back := f.count("SELECT count(*) FROM "+f.q(tb.Name)+" WHERE id = ? AND processed_at IS NULL", cancelled)
		if deadCount != "1" || back != 0 {
			t.Errorf("dead letter %d was cancelled from the dashboard (200); then the overview counted %s dead letters (want 1), "+
				"and 'requeue dead letters' (%s) put the cancelled row back into %s as unfinished: %d (want 0: a cancelled job must not run again)",
				cancelled, deadCount, resultOf(res), tb.Name, back)
		}
	})
}

// A retry posted for a dead letter does not answer that the row is due now while it stays
// in the dead-letter table, which no subscription reads.
func TestDeadLetterRetryDoesNotClaimDue(t *testing.T) {
	f := newFixture(t, databases[1])
	tb, dead := deadLetters(t, f, "dash_r2r_", 1)
	d, err := New(f.b, []Table{{Table: tb, DeadLetterTable: dead.Name}})
	if err != nil {
		t.Fatal(err)
	}
	c, u := serve(t, d, "")
	_, list := get(t, c, u+"/jobs?table="+url.QueryEscape(dead.Name))
	ids := listed(t, list)
	status, res := post(t, c, u+"/action", url.Values{"op": {"retry"}, "table": {dead.Name}, "id": {strconv.FormatInt(ids[0], 10)}, "csrf": {token(t, list)}})
	if status == http.StatusOK && strings.Contains(res, "is due now") && f.count("SELECT count(*) FROM "+f.q(tb.Name)) == 0 {
		t.Errorf("retry of dead letter %d: %d %q, yet it is still in %s and no subscription reads that table", ids[0], status, resultOf(res), dead.Name)
	}
}

// On SQLite, where table names fold case, New refuses a dead-letter table that is also
// shown as a table, or shared by two tables, when the names differ only by case.
func TestDeadLetterTableNamesFoldCaseOnSQLite(t *testing.T) {
	f := newFixture(t, databases[0]) // sqlite
	queue := f.plainTable("dash_r2k_q")
	other := f.plainTable("dash_r2k_other")
	_, err := New(f.b, []Table{{Table: queue, DeadLetterTable: strings.ToUpper(other.Name)}, {Table: other}})
	var ce *dialects.ConfigError
	if !errors.As(err, &ce) {
		t.Errorf("sqlite: DeadLetterTable %q while %q (the same table on SQLite) is shown: New returned %v; want a *ConfigError", strings.ToUpper(other.Name), other.Name, err)
	}
	x := queue
	x.Name = "dash_r2k_q2"
	f.plainTable(x.Name)
	_, err = New(f.b, []Table{{Table: queue, DeadLetterTable: "dash_r2k_shared"}, {Table: x, DeadLetterTable: "DASH_R2K_SHARED"}})
	if !errors.As(err, &ce) {
		t.Errorf("sqlite: two tables' dead-letter table differing only by case (one table on SQLite): New returned %v; want a *ConfigError", err)
	}
}

// A dead-letter table the dashboard cannot count (one lacking a described column) is
// refused by New or leaves the queue's own numbers on the overview.
func TestBrokenDeadLetterTableKeepsQueueNumbers(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.plainTable("dash_r2b_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36))
		deadDesc := tb
		deadDesc.Name, deadDesc.Headers = tb.Name+"_dead", "" // no headers column
		f.t.Cleanup(func() { _, _ = f.sql.ExecContext(ctx, "DROP TABLE IF EXISTS "+f.q(deadDesc.Name)) })
		ddl, err := rowactor.Schema(f.b.Dialect(), deadDesc)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range strings.Split(ddl, ";\n") {
			if strings.TrimSpace(s) != "" {
				f.exec(s)
			}
		}
		f.publish(tb, "", "{}")
		f.publish(tb, "", "{}")
		d, err := New(f.b, []Table{{Table: tb, DeadLetterTable: deadDesc.Name}})
		if err != nil {
			t.Logf("New refused the dead-letter table: %v", err)
			return // refused up front: sane
		}
		c, u := serve(t, d, "")
		body := section(overviewOf(t, c, u), tb.Name)
		if !strings.Contains(body, `data-count="queued">2<`) {
			t.Errorf("a dead-letter table lacking the headers column hides the queue's own numbers (2 queued):\n%s", body)
		}
	})
}

// With the queue's count kept (every count slow), a requeue from the dead-letter table
// makes the queue's line due: no later render shows the pre-requeue numbers as live, and
// one shows the moved rows.
func TestDeadLetterRequeueInvalidatesKeptCount(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb, dead := deadLetters(t, f, "dash_r2i_", 3)
		d, err := New(f.b, []Table{{Table: tb, DeadLetterTable: dead.Name}}, func(c *config) {
			c.count = testPolicy(time.Nanosecond) // every count is slow: kept 10 s at least
			c.count.wait = 30 * time.Second
		})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "")
		body := overviewOf(t, c, u)
		if got := counts(t, body, tb.Name, ""); got["dead"] != "3" {
			t.Fatalf("first render: %v", got)
		}
		if body = overviewOf(t, c, u); !strings.Contains(body, `data-kept="`+tb.Name+`"`) {
			t.Fatalf("second render: want the kept count:\n%s", section(body, tb.Name))
		}
		status, res := post(t, c, u+"/action", url.Values{"op": {"requeue"}, "table": {dead.Name}, "csrf": {token(t, body)}, "confirm": {"1"}})
		if status != http.StatusOK {
			t.Fatalf("requeue: %d %s", status, resultOf(res))
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			body = overviewOf(t, c, u)
			got := counts(t, body, tb.Name, "")
			kept := strings.Contains(body, `data-kept="`+tb.Name+`"`)
			if got["dead"] == "3" && !kept {
				t.Fatalf("after the requeue, the pre-requeue numbers shown as live: %v", got)
			}
			if got["dead"] == "0" && got["queued"] == "3" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the queue's line never showed the requeued rows: %v", got)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// A requeue of the dead-letter table without a valid CSRF token, or on a read-only
// dashboard, is 403 and moves nothing.
func TestDeadLetterRequeueChecksTokenAndReadOnly(t *testing.T) {
	f := newFixture(t, databases[0])
	tb, dead := deadLetters(t, f, "dash_r2s_", 1)
	for _, ro := range []bool{false, true} {
		var opts []Option
		if ro {
			opts = append(opts, ReadOnly())
		}
		d, err := New(f.b, []Table{{Table: tb, DeadLetterTable: dead.Name}}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "")
		body := overviewOf(t, c, u)
		form := url.Values{"op": {"requeue"}, "table": {dead.Name}, "confirm": {"1"}}
		if m := csrfRE.FindStringSubmatch(body); m != nil {
			form.Set("csrf", m[1])
		}
		if !ro {
			form.Set("csrf", "00")
		}
		if status, _ := post(t, c, u+"/action", form); status != http.StatusForbidden {
			t.Errorf("read-only %v: requeue without a valid token: %d, want 403", ro, status)
		}
		if n := f.count("SELECT count(*) FROM " + f.q(dead.Name)); n != 1 {
			t.Fatalf("read-only %v: %d rows left in the dead-letter table, want 1", ro, n)
		}
	}
}
