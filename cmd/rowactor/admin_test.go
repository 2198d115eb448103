package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// queueTable describes a table of the form with every optional column the form allows.
func queueTable(name string, form rowactor.Form) rowactor.Table {
	tb := rowactor.Table{Name: name, ID: "id", Payload: "payload", Group: "grp", Attempt: "attempt",
		RetryAfter: "retry_after", ProcessedAt: "processed_at", Headers: "headers"}
	switch form {
	case rowactor.FormLease:
		tb.LockedUntil = "locked_until"
	case rowactor.FormAdvisory:
		tb.AdvisoryKey = name + "-{id}"
	}
	return tb
}

// counts is what stats should report for a group; inWork -1 is "n/a".
type counts struct{ due, delayed, inWork, processed int64 }

func (f *fixture) stats(tb rowactor.Table) map[string]statsLine {
	f.t.Helper()
	code, out, errOut := cli(append([]string{"stats", "-dsn", f.dsn, "-json"}, append(columnFlags(tb), tb.Name)...)...)
	if code != exitOK {
		f.t.Fatalf("stats: exit %d: %s", code, errOut)
	}
	got := map[string]statsLine{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var l statsLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			f.t.Fatalf("stats -json line %q: %v", line, err)
		}
		if l.Table != tb.Name || l.Group == nil {
			f.t.Fatalf("stats -json line %q: want table %s and a group", line, tb.Name)
		}
		got[*l.Group] = l
	}
	return got
}

func checkCounts(t *testing.T, group string, l statsLine, want counts) {
	t.Helper()
	inWork := int64(-1)
	if l.InWork != nil {
		inWork = *l.InWork
	}
	got := counts{due: l.Due, delayed: *l.Delayed, inWork: inWork, processed: *l.Processed}
	if got != want {
		t.Errorf("group %s: got due=%d delayed=%d in_work=%d processed=%d, want due=%d delayed=%d in_work=%d processed=%d",
			group, got.due, got.delayed, got.inWork, got.processed, want.due, want.delayed, want.inWork, want.processed)
	}
}

// TestStatsAndRequeueByGroup runs on every database and form: stats counts what was
// published due, delayed (rowactor.After), held (a lease, or an advisory key held by
// another session), processed, and dead-lettered; requeue -dry-run changes nothing; a
// requeue ended after its first chunk rolls back whole; requeue moves exactly the dead
// letters, starting them afresh, and leaves every other row alone.
func TestStatsAndRequeueByGroup(t *testing.T) {
	for _, db := range databases {
		for _, form := range db.forms {
			t.Run(db.name+"/"+form.String(), func(t *testing.T) {
				f := newFixture(t, db)
				tb := queueTable(f.tableName("ra_cli_"), form)
				f.create(tb)
				now := time.Now()
				// Whether this database can tell rows in work in this form.
				counted := form == rowactor.FormLease || (form == rowactor.FormAdvisory && db.holdKey != nil)
				advisoryHeld := form == rowactor.FormAdvisory && db.holdKey != nil
				hold := func(id int64) {
					switch {
					case form == rowactor.FormLease:
						f.set(tb, id, tb.LockedUntil, now.Add(time.Hour))
					case advisoryHeld:
						db.holdKey(t, f.sql, fmt.Sprintf("%s-%d", tb.Name, id))
					}
				}
				inWork := func(n int64) int64 {
					if counted {
						return n
					}
					return -1
				}

				// The queue's group: two fresh rows, one delayed, one processed, one held.
				first := f.publish(tb, "jobs", "fresh-1")
				f.publish(tb, "jobs", "fresh-2")
				f.publish(tb, "jobs", "delayed", rowactor.After(time.Hour))
				f.set(tb, f.publish(tb, "jobs", "processed"), tb.ProcessedAt, now)
				hold(f.publish(tb, "jobs", "held"))
				wantJobs := counts{due: 2, delayed: 1, inWork: inWork(1), processed: 1}
				if !counted {
					wantJobs.due++ // the held row reads as due
				}
				if form == rowactor.FormLease {
					// A lease that ran out: due again.
					f.set(tb, f.publish(tb, "jobs", "expired"), tb.LockedUntil, now.Add(-time.Minute))
					wantJobs.due++
				}
				// Dead letters in every state.
				dead := []int64{
					f.publish(tb, "jobs-dead", "dead-1"),
					f.publish(tb, "jobs-dead", "dead-delayed"),
					f.publish(tb, "jobs-dead", "dead-processed"),
					f.publish(tb, "jobs-dead", "dead-held"),
				}
				for _, id := range dead {
					f.set(tb, id, tb.Attempt, 5)
				}
				f.set(tb, dead[1], tb.RetryAfter, now.Add(time.Hour))
				f.set(tb, dead[2], tb.ProcessedAt, now)
				hold(dead[3])
				wantDead := counts{due: 1, delayed: 1, inWork: inWork(1), processed: 1}
				if !counted {
					wantDead.due++
				}

				got := f.stats(tb)
				if len(got) != 2 {
					t.Fatalf("stats: %d groups, want jobs and jobs-dead: %v", len(got), got)
				}
				checkCounts(t, "jobs", got["jobs"], wantJobs)
				checkCounts(t, "jobs-dead", got["jobs-dead"], wantDead)
				if l := got["jobs"]; l.OldestDueID == nil || *l.OldestDueID != first || l.OldestDueAge == nil ||
					*l.OldestDueAge < 0 || *l.OldestDueAge > 60 {
					t.Errorf("jobs: oldest due %v, age %v; want row %d, published a moment ago", l.OldestDueID, l.OldestDueAge, first)
				}

				code, out, errOut := cli(append([]string{"stats", "-dsn", f.dsn}, append(columnFlags(tb), tb.Name)...)...)
				if code != exitOK || !strings.Contains(out, "GROUP") || !strings.Contains(out, "jobs-dead") {
					t.Errorf("stats (text): exit %d\n%s%s", code, out, errOut)
				}

				// A column the table lacks is refused with the library's error, naming the flag.
				bad := tb
				bad.RetryAfter = "not_a_column"
				code, _, errOut = cli(append([]string{"stats", "-dsn", f.dsn}, append(columnFlags(bad), tb.Name)...)...)
				if code != exitFailed || !strings.Contains(errOut, `column "not_a_column"`) || !strings.Contains(errOut, "-retry-after") {
					t.Errorf("stats with a wrong column: exit %d, stderr %q; want 1 and the column and its flag named", code, errOut)
				}
				_, err := f.b.Dialect().(dialects.Admin).Stats(ctx, bad, now)
				if !errors.Is(err, dialects.ErrConfig) {
					t.Errorf("Stats with a wrong column: %v, want a *ConfigError", err)
				}

				requeue := append([]string{"requeue", "-dsn", f.dsn, "-from-group", "jobs-dead", "-to-group", "jobs"}, columnFlags(tb)...)
				before := f.rows(tb, tb.Name)

				code, out, errOut = cli(append(requeue, "-dry-run", tb.Name)...)
				if code != exitOK || !strings.Contains(out, "would move 4 rows") {
					t.Errorf("requeue -dry-run: exit %d, stdout %q, stderr %q", code, out, errOut)
				}
				if after := f.rows(tb, tb.Name); !maps.EqualFunc(before, after, maps.Equal) {
					t.Errorf("requeue -dry-run changed the table:\nbefore %v\nafter  %v", before, after)
				}

				// Ended after its first chunk: the transaction rolls back whole.
				cctx, cancel := context.WithCancel(ctx)
				defer cancel()
				_, err = f.b.Dialect().(dialects.Admin).Requeue(cctx,
					dialects.RequeueSpec{Table: tb, FromGroup: "jobs-dead", ToGroup: "jobs", Chunk: 1},
					func(done, total int) {
						if done == 1 {
							cancel()
						}
					})
				if !errors.Is(err, context.Canceled) {
					t.Errorf("requeue cancelled after a chunk: %v, want context.Canceled", err)
				}
				if after := f.rows(tb, tb.Name); !maps.EqualFunc(before, after, maps.Equal) {
					t.Errorf("a requeue cancelled after its first chunk left changes:\nbefore %v\nafter  %v", before, after)
				}

				code, out, errOut = cli(append(requeue, "-chunk", "2", tb.Name)...)
				if code != exitOK || out != fmt.Sprintf("moved 4 rows from group \"jobs-dead\" to group \"jobs\" in table %s\n", tb.Name) {
					t.Fatalf("requeue: exit %d, stdout %q, stderr %q", code, out, errOut)
				}
				if !strings.Contains(errOut, "requeue: 2/4 rows") || !strings.Contains(errOut, "requeue: 4/4 rows") {
					t.Errorf("requeue in chunks of 2: stderr %q, want progress lines", errOut)
				}
				after := f.rows(tb, tb.Name)
				if len(after) != len(before) {
					t.Fatalf("requeue: %d rows, want %d", len(after), len(before))
				}
				for id, was := range before {
					now := after[id]
					if was["Group"] != "jobs-dead" {
						if !maps.Equal(was, now) {
							t.Errorf("row %d is no dead letter, yet it changed: %v -> %v", id, was, now)
						}
						continue
					}
					want := maps.Clone(was)
					want["Group"], want["Attempt"], want["RetryAfter"], want["ProcessedAt"] = "jobs", "1", "<nil>", "<nil>"
					if tb.LockedUntil != "" {
						want["LockedUntil"] = "<nil>"
					}
					if !maps.Equal(now, want) {
						t.Errorf("dead letter %d after requeue: %v, want %v", id, now, want)
					}
				}

				// Every dead letter is due again, except one whose key is still held.
				got = f.stats(tb)
				want := wantJobs
				want.due += 4
				if advisoryHeld {
					want.due--
					want.inWork++
				}
				if len(got) != 1 {
					t.Errorf("stats after requeue: %v, want the jobs group only", got)
				}
				checkCounts(t, "jobs", got["jobs"], want)

				// The dead-letter group is empty now, and a misspelt one always was: each
				// says so on stderr and exits 1, changing nothing.
				before = f.rows(tb, tb.Name)
				for _, args := range [][]string{
					slices.Concat(requeue, []string{tb.Name}),
					slices.Concat(requeue, []string{"-dry-run", tb.Name}),
					slices.Concat([]string{"requeue", "-dsn", f.dsn, "-from-group", "jobs-daed", "-to-group", "jobs"}, columnFlags(tb), []string{tb.Name}),
				} {
					code, out, errOut = cli(args...)
					if code != exitFailed || out != "" || !strings.Contains(errOut, "no rows in group") || !strings.Contains(errOut, tb.Name) {
						t.Errorf("rowactor %v of an empty group: exit %d, stdout %q, stderr %q; want 1 and the empty group named", args, code, out, errOut)
					}
				}
				if after := f.rows(tb, tb.Name); !maps.EqualFunc(before, after, maps.Equal) {
					t.Errorf("a requeue of an empty group changed the table:\nbefore %v\nafter  %v", before, after)
				}
			})
		}
	}
}

// TestRequeueFromTable runs on every database: rows of a dead-letter table move back
// with their ids, starting afresh; -dry-run changes nothing; an id already in the queue
// table fails the move after earlier chunks succeeded, and nothing moves.
func TestRequeueFromTable(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			f := newFixture(t, db)
			tb := rowactor.Table{Name: f.tableName("ra_cli_"), ID: "id", Payload: "payload", Attempt: "attempt",
				RetryAfter: "retry_after", ProcessedAt: "processed_at", LockedUntil: "locked_until", Headers: "headers"}
			dl := tb
			dl.Name = f.tableName("ra_cli_dead_")
			f.create(tb)
			f.create(dl)
			now := time.Now()
			var ids []int64
			for i := range 6 {
				ids = append(ids, f.publish(tb, "", fmt.Sprintf("job-%d", i)))
			}
			// Four rows die, moved with their ids as rowactor's dead-letter move does.
			cols := tb.DistinctColumns(true)
			names := make([]string, len(cols))
			for i, c := range cols {
				names[i] = db.quote(c.Name)
			}
			list := strings.Join(names, ", ")
			moveOut := func(id int64) {
				f.exec("INSERT INTO "+db.quote(dl.Name)+" ("+list+") SELECT "+list+" FROM "+db.quote(tb.Name)+" WHERE id = ?", id)
				f.exec("DELETE FROM "+db.quote(tb.Name)+" WHERE id = ?", id)
			}
			dead := ids[1:5]
			for _, id := range dead {
				moveOut(id)
				f.set(dl, id, dl.Attempt, 5)
			}
			f.set(dl, dead[0], dl.RetryAfter, now.Add(time.Hour))
			f.set(dl, dead[1], dl.LockedUntil, now.Add(time.Hour))
			f.set(dl, dead[2], dl.ProcessedAt, now)
			beforeQ, beforeD := f.rows(tb, tb.Name), f.rows(tb, dl.Name)
			unchanged := func(what string) {
				t.Helper()
				if q, d := f.rows(tb, tb.Name), f.rows(tb, dl.Name); !maps.EqualFunc(beforeQ, q, maps.Equal) || !maps.EqualFunc(beforeD, d, maps.Equal) {
					t.Errorf("%s changed the tables:\nqueue %v -> %v\ndead  %v -> %v", what, beforeQ, q, beforeD, d)
				}
			}
			requeue := append([]string{"requeue", "-dsn", f.dsn, "-from-table", dl.Name}, columnFlags(tb)...)

			code, out, errOut := cli(append(requeue, "-dry-run", tb.Name)...)
			if code != exitOK || !strings.Contains(out, "would move 4 rows from table "+dl.Name) {
				t.Errorf("requeue -dry-run: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
			unchanged("requeue -dry-run")

			// A fifth dead letter whose id the queue table holds: the last chunk fails.
			f.exec("INSERT INTO "+db.quote(dl.Name)+" ("+list+") SELECT "+list+" FROM "+db.quote(tb.Name)+" WHERE id = ?", ids[5])
			beforeD = f.rows(tb, dl.Name)
			code, _, errOut = cli(append(requeue, "-chunk", "1", tb.Name)...)
			if code != exitFailed {
				t.Errorf("requeue onto an id the queue holds: exit %d (%s), want 1", code, errOut)
			}
			unchanged("a requeue that failed in its last chunk")
			f.exec("DELETE FROM "+db.quote(dl.Name)+" WHERE id = ?", ids[5])

			code, out, errOut = cli(append(requeue, tb.Name)...)
			if code != exitOK || out != fmt.Sprintf("moved 4 rows from table %s into table %s\n", dl.Name, tb.Name) {
				t.Fatalf("requeue: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
			if errOut != "" {
				t.Errorf("requeue of one chunk: stderr %q, want no progress", errOut)
			}
			if d := f.rows(tb, dl.Name); len(d) != 0 {
				t.Errorf("the dead-letter table still holds %v", d)
			}
			q := f.rows(tb, tb.Name)
			for _, id := range ids {
				want, ok := beforeQ[id]
				if !ok {
					want = maps.Clone(beforeD[id])
					want["Attempt"], want["RetryAfter"], want["LockedUntil"], want["ProcessedAt"] = "1", "<nil>", "<nil>", "<nil>"
				}
				if !maps.Equal(q[id], want) {
					t.Errorf("row %d after requeue: %v, want %v", id, q[id], want)
				}
			}
		})
	}
}

// TestSchemaWithoutDatabase: schema prints what the connected dialect's Schema renders,
// from the zero dialect, for every database and form.
func TestSchemaWithoutDatabase(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			f := newFixture(t, db)
			for _, form := range db.forms {
				tb := queueTable("jobs", form)
				want, err := rowactor.Schema(f.b.Dialect(), tb)
				if err != nil {
					t.Fatal(err)
				}
				code, out, errOut := cli(append([]string{"schema", "-db", db.name}, append(columnFlags(tb), tb.Name)...)...)
				if code != exitOK || out != want {
					t.Errorf("schema -db %s (%s): exit %d, stderr %q\ngot  %q\nwant %q", db.name, form, code, errOut, out, want)
				}
			}
		})
	}
}

// TestStatsMinimalTable runs on every database: a table of an id and a payload alone (and
// a key on SQLite, which has no row locks) has every row due, and nothing else to tell.
func TestStatsMinimalTable(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			f := newFixture(t, db)
			tb := rowactor.Table{Name: f.tableName("ra_cli_"), ID: "id", Payload: "payload"}
			if db.forms[0] != rowactor.FormRowLock {
				tb.AdvisoryKey = tb.Name + "-{id}"
			}
			f.create(tb)
			first := f.publish(tb, "", "a")
			f.publish(tb, "", "b")
			code, out, errOut := cli(append([]string{"stats", "-json", "-dsn", f.dsn}, append(columnFlags(tb), tb.Name)...)...)
			want := fmt.Sprintf(`{"table":"%s","group":null,"due":2,"delayed":null,"dead":null,"in_work":null,"processed":null,"cancelled":null,"oldest_due_id":%d,"oldest_due_age_seconds":null}`+"\n", tb.Name, first)
			if code != exitOK || out != want {
				t.Errorf("stats: exit %d, stderr %q\ngot  %s\nwant %s", code, errOut, out, want)
			}
		})
	}
}

// nullableGroupDDL creates a table of the service's own whose group column allows NULL.
var nullableGroupDDL = map[string]string{
	"sqlite":   "CREATE TABLE %s (id INTEGER PRIMARY KEY AUTOINCREMENT, payload BLOB NOT NULL, grp TEXT, locked_until TEXT)",
	"postgres": "CREATE TABLE %s (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, payload bytea NOT NULL, grp text, locked_until timestamptz)",
	"mysql":    "CREATE TABLE %s (id BIGINT AUTO_INCREMENT PRIMARY KEY, payload LONGBLOB NOT NULL, grp VARCHAR(191) NULL, locked_until DATETIME(6) NULL)",
}

// TestStatsNullGroup runs on every database: rows whose group is NULL (never claimed)
// are reported apart from the empty group's.
func TestStatsNullGroup(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			f := newFixture(t, db)
			tb := rowactor.Table{Name: f.tableName("ra_cli_"), ID: "id", Payload: "payload", Group: "grp", LockedUntil: "locked_until"}
			f.exec(fmt.Sprintf(nullableGroupDDL[db.name], db.quote(tb.Name)))
			f.exec("INSERT INTO "+db.quote(tb.Name)+" (payload, grp) VALUES (?, NULL), (?, NULL), (?, '')", []byte("a"), []byte("b"), []byte("c"))
			args := append(columnFlags(tb), tb.Name)
			code, out, errOut := cli(append([]string{"stats", "-json", "-dsn", f.dsn}, args...)...)
			nullLine := fmt.Sprintf(`{"table":"%s","group":null,"null_group":true,"due":2,"delayed":null,"dead":null,"in_work":0,"processed":null,"cancelled":null,"oldest_due_id":1,"oldest_due_age_seconds":null}`, tb.Name)
			emptyLine := fmt.Sprintf(`{"table":"%s","group":"","due":1,"delayed":null,"dead":null,"in_work":0,"processed":null,"cancelled":null,"oldest_due_id":3,"oldest_due_age_seconds":null}`, tb.Name)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if code != exitOK || len(lines) != 2 || !slices.Contains(lines, nullLine) || !slices.Contains(lines, emptyLine) {
				t.Errorf("stats: exit %d, stderr %q\ngot\n%s\nwant\n%s\n%s", code, errOut, out, nullLine, emptyLine)
			}
			code, out, errOut = cli(append([]string{"stats", "-dsn", f.dsn}, args...)...)
			if code != exitOK || !strings.Contains(out, "\nNULL ") || !strings.Contains(out, "\n'' ") {
				t.Errorf("stats (text): exit %d, stderr %q\n%s", code, errOut, out)
			}
		})
	}
}
