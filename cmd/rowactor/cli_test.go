package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// TestHelp: rowactor, each command's -h and --help, and rowactor help [command] print
// help with examples to stdout and exit 0; no command at all is a usage error.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		code, out, errOut := cli(args...)
		if code != exitOK || !strings.Contains(out, "Commands:") || !strings.Contains(out, "Examples:") || errOut != "" {
			t.Errorf("rowactor %v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	for _, c := range commands {
		for _, args := range [][]string{{c.name, "-h"}, {c.name, "--help"}, {"help", c.name}} {
			code, out, errOut := cli(args...)
			if code != exitOK || !strings.HasPrefix(out, "Usage: rowactor "+c.name) || !strings.Contains(out, "Examples") || errOut != "" {
				t.Errorf("rowactor %v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
			}
		}
	}
	if code, out, errOut := cli("stats", "-h"); code != exitOK || !strings.Contains(out, "-retry-after") || !strings.Contains(out, "-json") {
		t.Errorf("stats -h lists no flags: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := cli(); code != exitUsage || !strings.Contains(errOut, "Commands:") {
		t.Errorf("rowactor alone: exit %d, stderr %q; want 2 and the help", code, errOut)
	}
}

// TestUsageErrors: what the command line alone shows is wrong exits 2, naming the fault,
// before any database is asked.
func TestUsageErrors(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	dsn := "-dsn=postgres://nobody@127.0.0.1:1/none" // never reached
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"help", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"stats", "-group", "queue"}, "no TABLE given"},
		{[]string{"stats", "jobs", "more"}, "one TABLE expected"},
		{[]string{"stats", "-no-such-flag", "jobs"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"stats", "jobs"}, "no database: give -dsn URL or set DATABASE_URL"},
		{[]string{"stats", dsn, "-id", "", "jobs"}, "the id column is required"},
		{[]string{"stats", dsn, "-advisory-key", "jobs-{id", "jobs"}, "(flag -advisory-key)"},
		{[]string{"schema", "jobs"}, "-db is required"},
		{[]string{"schema", "-db", "oracle", "jobs"}, `-db "oracle": unknown database`},
		{[]string{"schema", "-db", "postgres", "-locked-until", "lu", "-advisory-key", "k-{id}", "jobs"}, "not both"},
		{[]string{"requeue", dsn, "-group", "queue", "jobs"}, "name the dead letters"},
		{[]string{"requeue", dsn, "-group", "queue", "-from-group", "dead", "jobs"}, "-from-group needs -to-group"},
		{[]string{"requeue", dsn, "jobs", "--group", "queue", "--from-group", "dead"}, "-from-group needs -to-group"},
		{[]string{"requeue", dsn, "-group", "queue", "-from-group", "dead", "-from-table", "d", "jobs"}, "exclude each other"},
		{[]string{"requeue", dsn, "-from-group", "dead", "-to-group", "q", "jobs"}, "-from-group needs -group"},
		{[]string{"requeue", dsn, "-group", "queue", "-from-group", "q", "-to-group", "q", "jobs"}, "to itself"},
		{[]string{"requeue", dsn, "-from-table", "d", "-to-group", "q", "jobs"}, "keep their group"},
		{[]string{"requeue", dsn, "-from-table", "jobs", "jobs"}, "the dead-letter table is the queue table itself"},
		{[]string{"requeue", dsn, "-from-table", "d", "-chunk", "0", "jobs"}, "-chunk must be at least 1"},
	} {
		code, out, errOut := cli(c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) || out != "" {
			t.Errorf("rowactor %q: exit %d, stdout %q, stderr %q; want 2 and %q", c.args, code, out, errOut, c.want)
		}
	}
}

// TestDatabaseErrors: a database that cannot be reached exits 1, and a password in the
// DSN never reaches the output.
func TestDatabaseErrors(t *testing.T) {
	const secret = "s3cretPassw0rd"
	for _, dsn := range []string{
		"postgres://postgres:" + secret + "@127.0.0.1:1/test?sslmode=disable",
		"postgres://postgres:" + secret + "@127.0.0.1:notaport/test",
		"postgres://postgres@127.0.0.1:1/test?sslmode=disable&password=" + secret,
		"mysql://root:" + secret + "@tcp(127.0.0.1:1)/test",
		"mysql://root:" + secret + "@tcp(127.0.0.1:1/test",
		"oracle://scott:" + secret + "@db/orcl",
	} {
		code, out, errOut := cli("stats", "-dsn", dsn, "jobs")
		if code != exitFailed || out != "" || errOut == "" {
			t.Errorf("stats -dsn %s: exit %d, stdout %q, stderr %q; want 1 and an error", dsn, code, out, errOut)
		}
		if strings.Contains(errOut, secret) {
			t.Errorf("stats -dsn %s printed the password: %s", dsn, errOut)
		}
	}
	// A SQLite file that does not exist is not created.
	path := filepath.Join(t.TempDir(), "typo.db")
	for _, dsn := range []string{path, "sqlite:" + path} {
		code, _, errOut := cli("stats", "-dsn", dsn, "jobs")
		if code != exitFailed || !strings.Contains(errOut, "typo.db") {
			t.Errorf("stats -dsn %s: exit %d, stderr %q; want 1 and the file named", dsn, code, errOut)
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Fatalf("stats -dsn %s created the file: %v", dsn, err)
		}
	}
}

// TestSQLiteDSNForms: a bare SQLite path and DATABASE_URL name the database as -dsn does;
// a table without groups gets one line, empty or not.
func TestSQLiteDSNForms(t *testing.T) {
	f := newFixture(t, databases[0])
	path := strings.TrimPrefix(f.dsn, "sqlite:")
	tb := rowactor.Table{Name: f.tableName("ra_cli_"), ID: "id", Payload: "payload", LockedUntil: "locked_until"}
	f.create(tb)
	args := append(columnFlags(tb), tb.Name)

	t.Setenv("DATABASE_URL", f.dsn)
	code, out, errOut := cli(append([]string{"stats", "-json"}, args...)...)
	if want := `{"table":"` + tb.Name + `","group":null,"due":0,"delayed":null,"dead":null,"in_work":0,"processed":null,"cancelled":null,"oldest_due_id":null,"oldest_due_age_seconds":null}` + "\n"; code != exitOK || out != want {
		t.Errorf("stats of an empty table from DATABASE_URL: exit %d, stderr %q\ngot  %s\nwant %s", code, errOut, out, want)
	}
	t.Setenv("DATABASE_URL", "")
	f.publish(tb, "", "x")
	code, out, errOut = cli(append([]string{"stats", "-dsn", path}, args...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitOK || len(lines) != 2 || !strings.HasPrefix(lines[0], "DUE") || !strings.HasPrefix(lines[1], "1 ") {
		t.Errorf("stats -dsn %s: exit %d, stderr %q, stdout:\n%s", path, code, errOut, out)
	}
}

// TestStatsLine: the age of the oldest due row is read from the latest time the row
// keeps; without one it is unknown, and what a table cannot tell is null.
func TestStatsLine(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	published, _ := json.Marshal(map[string]string{"rowactor-published-at": now.Add(-90 * time.Second).Format(time.RFC3339Nano)})
	tb := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue", RetryAfter: "retry_after", Headers: "headers"}
	for _, c := range []struct {
		name string
		row  dialects.DueRow
		want string
	}{
		{"none due", dialects.DueRow{}, "-"},
		{"no time kept", dialects.DueRow{ID: 7}, "unknown (id 7)"},
		{"published", dialects.DueRow{ID: 7, Headers: published}, "1m30s (id 7)"},
		{"retried after publishing", dialects.DueRow{ID: 7, Headers: published, RetryAfter: now.Add(-2500 * time.Millisecond)}, "2.5s (id 7)"},
		{"lease ran out last", dialects.DueRow{ID: 7, RetryAfter: now.Add(-time.Hour), LockedUntil: now.Add(-time.Second)}, "1s (id 7)"},
		{"not json", dialects.DueRow{ID: 7, Headers: []byte("{")}, "unknown (id 7)"},
	} {
		l := newStatsLine(tb, dialects.GroupStats{Group: "q", Due: 1, Oldest: c.row}, now)
		if got := oldest(l); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
		if l.InWork != nil || l.Processed != nil || l.Delayed == nil {
			t.Errorf("%s: in_work %v processed %v delayed %v; want null, null and a count", c.name, l.InWork, l.Processed, l.Delayed)
		}
	}
	var buf bytes.Buffer
	if err := printStats(&buf, tb, nil); err != nil || !strings.Contains(buf.String(), "(no rows)") {
		t.Errorf("printStats of no groups: %q, %v", buf.String(), err)
	}
}

// TestProgress: no progress for one chunk; a line per tenth when stderr is no terminal.
func TestProgress(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, 1000)
	p.update(1000, 1000)
	p.end()
	if buf.Len() != 0 {
		t.Errorf("one chunk: %q, want nothing", buf.String())
	}
	p = newProgress(&buf, 10)
	for done := 10; done <= 1000; done += 10 {
		p.update(done, 1000)
	}
	p.end()
	if lines := strings.Split(strings.TrimSpace(buf.String()), "\n"); len(lines) != 10 || lines[9] != "requeue: 1000/1000 rows moved (not committed yet)" {
		t.Errorf("100 chunks: %d lines, want 10:\n%s", len(lines), buf.String())
	}
}

// TestBenchSourceTree: bench finds the source tree it runs the harness from, and away from
// one says what it needs.
func TestBenchSourceTree(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := moduleRoot(wd)
	if err != nil || root != filepath.Dir(filepath.Dir(wd)) {
		t.Errorf("moduleRoot(%s) = %q, %v; want the module root", wd, root, err)
	}
	// In the tree: the harness's own help, and its exit status passed on.
	code, _, errOut := cli("bench", "--", "-h")
	if code != exitOK || !strings.Contains(errOut, "Usage of bench") {
		t.Errorf("bench -- -h: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := cli("bench", "-no-such-flag"); code != exitUsage || !strings.Contains(errOut, "-no-such-flag") {
		t.Errorf("bench -no-such-flag: exit %d, stderr %q; want the harness's 2", code, errOut)
	}

	t.Chdir(t.TempDir())
	code, out, errOut := cli("bench", "-db", "sqlite")
	if code != exitFailed || out != "" || !strings.Contains(errOut, "inside a checkout of github.com/rowactor/rowactor") {
		t.Errorf("bench outside the source tree: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
