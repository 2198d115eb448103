package dashboard

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// TestMain fails the package if a goroutine outlives the tests: every test shuts its
// broker down and closes its server.
func TestMain(m *testing.M) {
	// Every count live and waited for: a count of a few rows slowed past countSlow by a
	// loaded machine would otherwise be kept, and a test reading the overview after a
	// change would see the kept numbers. The tests of countCache set their own policy.
	defaultCount.slow, defaultCount.wait = time.Hour, time.Minute
	goleak.VerifyTestMain(m, goleak.IgnoreCurrent())
}

var ctx = context.Background()

// database is one server the tests run on. The servers must be up: the tests fail, never
// skip, without them.
type database struct {
	name    string
	dsn     func(t *testing.T) string
	sqlDB   func(d dialects.Dialect) (db *sql.DB, closeIt bool)
	quote   func(name string) string
	rebind  func(query string) string
	timeArg func(t time.Time) any
}

func backtick(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

var databases = []database{
	{
		name: "sqlite",
		dsn: func(t *testing.T) string {
			return "sqlite:" + filepath.Join(t.TempDir(), "queue.db")
		},
		sqlDB:   func(d dialects.Dialect) (*sql.DB, bool) { return d.(*sqlite.Dialect).DB(), false },
		quote:   backtick,
		rebind:  func(q string) string { return q },
		timeArg: func(t time.Time) any { return t.UTC().Format(sqlite.TimeLayout) },
	},
	{
		name: "postgres",
		dsn: func(*testing.T) string {
			if u := os.Getenv("ROWACTOR_POSTGRES_URL"); u != "" {
				return u
			}
			return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
		},
		sqlDB: func(d dialects.Dialect) (*sql.DB, bool) {
			return stdlib.OpenDBFromPool(d.(*postgres.Dialect).Pool()), true
		},
		quote: func(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` },
		rebind: func(q string) string {
			var b strings.Builder
			n := 0
			for _, r := range q {
				if r == '?' {
					n++
					b.WriteString("$" + strconv.Itoa(n))
					continue
				}
				b.WriteRune(r)
			}
			return b.String()
		},
		timeArg: func(t time.Time) any { return t },
	},
	{
		name: "mysql",
		dsn: func(*testing.T) string {
			if dsn := os.Getenv("ROWACTOR_MYSQL_DSN"); dsn != "" {
				return "mysql://" + dsn
			}
			return "mysql://root@tcp(127.0.0.1:3306)/test?parseTime=true"
		},
		sqlDB:   func(d dialects.Dialect) (*sql.DB, bool) { return d.(*mysql.Dialect).DB(), false },
		quote:   backtick,
		rebind:  func(q string) string { return q },
		timeArg: func(t time.Time) any { return t.UTC().Truncate(time.Microsecond) },
	},
}

// eachDB runs fn as a subtest per database.
func eachDB(t *testing.T, fn func(t *testing.T, f *fixture)) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) { fn(t, newFixture(t, db)) })
	}
}

// fixture is a broker on one database, plain SQL beside it, and one table.
type fixture struct {
	t   *testing.T
	db  database
	b   *rowactor.Broker
	sql *sql.DB
}

func newFixture(t *testing.T, db database) *fixture {
	t.Helper()
	b, err := rowactor.Open(ctx, db.dsn(t), rowactor.WithPollOnly())
	if err != nil {
		t.Fatalf("rowactor.Open on %s (the server must be up; the tests never skip): %v", db.name, err)
	}
	t.Cleanup(func() {
		if _, err := b.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	sqlDB, closeIt := db.sqlDB(b.Dialect())
	if closeIt {
		t.Cleanup(func() { sqlDB.Close() })
	}
	return &fixture{t: t, db: db, b: b, sql: sqlDB}
}

// jobsTable is the lease form's table with every column the dashboard shows, under a
// name no other test (or earlier run) uses; it is dropped when the test ends.
func (f *fixture) jobsTable(prefix string) rowactor.Table {
	f.t.Helper()
	var r [5]byte
	if _, err := rand.Read(r[:]); err != nil {
		f.t.Fatal(err)
	}
	return f.jobsTableNamed(prefix + hex.EncodeToString(r[:]))
}

// jobsTableNamed is jobsTable under name, dropped when the test ends.
func (f *fixture) jobsTableNamed(name string) rowactor.Table {
	f.t.Helper()
	return f.createTable(rowactor.Table{Name: name, ID: "id", Payload: "payload", Group: "queue", Attempt: "attempt",
		RetryAfter: "retry_after", ProcessedAt: "processed_at", LockedUntil: "locked_until",
		Headers: "headers", Error: "error", DeadAt: "dead_at"})
}

// createTable creates tb as Schema renders it, dropped when the test ends.
func (f *fixture) createTable(tb rowactor.Table) rowactor.Table {
	f.t.Helper()
	f.t.Cleanup(func() {
		if _, err := f.sql.ExecContext(ctx, "DROP TABLE IF EXISTS "+f.db.quote(tb.Name)); err != nil {
			f.t.Errorf("drop %s: %v", tb.Name, err)
		}
	})
	ddl, err := rowactor.Schema(f.b.Dialect(), tb)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, s := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(s) != "" {
			f.exec(s)
		}
	}
	return tb
}

// finishedIndex creates the index the chart by processed_at needs, by the statement the
// dashboard shows without it.
func (f *fixture) finishedIndex(tb rowactor.Table) {
	f.t.Helper()
	f.exec(f.b.Dialect().(dialects.FinishedCounter).FinishedIndexStatement(tb))
}

func (f *fixture) exec(query string, args ...any) {
	f.t.Helper()
	for i, a := range args {
		if tv, ok := a.(time.Time); ok {
			args[i] = f.db.timeArg(tv)
		}
	}
	if _, err := f.sql.ExecContext(ctx, f.db.rebind(query), args...); err != nil {
		f.t.Fatalf("%s: %v", query, err)
	}
}

// count runs a SELECT count(*) (times bound as the database takes them).
func (f *fixture) count(query string, args ...any) int64 {
	f.t.Helper()
	for i, a := range args {
		if tv, ok := a.(time.Time); ok {
			args[i] = f.db.timeArg(tv)
		}
	}
	var n int64
	if err := f.sql.QueryRowContext(ctx, f.db.rebind(query), args...).Scan(&n); err != nil {
		f.t.Fatalf("%s: %v", query, err)
	}
	return n
}

func (f *fixture) q(name string) string { return f.db.quote(name) }

// ids runs a SELECT of ids.
func (f *fixture) ids(query string, args ...any) []int64 {
	f.t.Helper()
	rows, err := f.sql.QueryContext(ctx, f.db.rebind(query), args...)
	if err != nil {
		f.t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			f.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return ids
}

func (f *fixture) publish(tb rowactor.Table, group, payload string, opts ...rowactor.PublishOption) int64 {
	f.t.Helper()
	id, err := f.b.Publish(ctx, tb, group, []byte(payload), opts...)
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

// serve serves h on a test server at prefix (StripPrefix), and returns a client with a
// cookie jar and the server's URL with the prefix.
func serve(t *testing.T, h http.Handler, prefix string) (*http.Client, string) {
	t.Helper()
	mux := http.NewServeMux()
	if prefix == "" {
		mux.Handle("/", h)
	} else {
		mux.Handle(prefix+"/", http.StripPrefix(prefix, h))
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return c, srv.URL + prefix
}

// get fetches url and returns its status and body.
func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// post posts a form and returns its status and body.
func post(t *testing.T, c *http.Client, u string, form url.Values) (int, string) {
	t.Helper()
	resp, err := c.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// token reads a page's CSRF token (the client's jar keeps its cookie).
func token(t *testing.T, body string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token in the page:\n%s", body)
	}
	return m[1]
}

// counts reads the overview's numbers of one group of one table: data-count → text.
func counts(t *testing.T, body, table, group string) map[string]string {
	t.Helper()
	i := strings.Index(body, `data-table="`+table+`"`)
	if i < 0 {
		t.Fatalf("no section for table %s", table)
	}
	sec := body[i:]
	if end := strings.Index(sec, "</section>"); end >= 0 {
		sec = sec[:end]
	}
	j := strings.Index(sec, `<tr data-group="`+group+`"`)
	if j < 0 {
		t.Fatalf("no line for group %q of %s in:\n%s", group, table, sec)
	}
	row := sec[j:]
	row = row[:strings.Index(row, "</tr>")]
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`data-count="([a-z-]+)">(?:<a [^>]*>)?([^<]*)`).FindAllStringSubmatch(row, -1) {
		out[m[1]] = strings.TrimSpace(m[2])
	}
	return out
}

var idRE = regexp.MustCompile(`<tr data-id="(\d+)" data-state="([a-z-]+)"`)

// listed reads a job list page's ids.
func listed(t *testing.T, body string) []int64 {
	t.Helper()
	var ids []int64
	for _, m := range idRE.FindAllStringSubmatch(body, -1) {
		id, _ := strconv.ParseInt(m[1], 10, 64)
		ids = append(ids, id)
	}
	return ids
}

var hrefRE = func(id string) *regexp.Regexp { return regexp.MustCompile(`id="` + id + `" href="([^"]+)"`) }

// link reads the href of the element with id, unescaped, or "".
func link(body, id string) string {
	m := hrefRE(id).FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return strings.ReplaceAll(m[1], "&amp;", "&")
}

var inputRE = regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)

func htmlUnescape(s string) string { return html.UnescapeString(s) }

// deadLetter publishes a row into queue of tb and lets a subscription whose handler fails
// past MaxAttempts(1) move it into dead, as a service's would; it returns the row's id
// once it moved. The subscription is paused by then, so rows published afterwards stay
// where they are.
func (f *fixture) deadLetter(tb rowactor.Table, queue, dead string) int64 {
	f.t.Helper()
	// A broker of its own on the fixture's pool, shut down once the row is dead: a
	// paused subscription's claim in flight could still claim a row the test publishes
	// next (Pause's contract), which the dashboard would then show in work.
	b, err := rowactor.New(f.b.Dialect(), rowactor.WithPollOnly())
	if err != nil {
		f.t.Fatal(err)
	}
	_, err = b.Subscribe(ctx, tb, queue, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Retry() },
		rowactor.MaxAttempts(1), rowactor.DeadLetterGroup(dead), rowactor.PollInterval(20*time.Millisecond))
	if err != nil {
		f.t.Fatal(err)
	}
	id := f.publish(tb, queue, `{"dies":true}`)
	deadline := time.Now().Add(30 * time.Second)
	for f.count("SELECT count(*) FROM "+f.q(tb.Name)+" WHERE id = ? AND queue = ? AND dead_at IS NOT NULL", id, dead) != 1 {
		if time.Now().After(deadline) {
			f.t.Fatalf("row %d did not move into %s", id, dead)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := b.Shutdown(ctx); err != nil {
		f.t.Fatal(err)
	}
	return id
}

// jobLine is the job list's line of row id, or "" when the page lists no such row.
func jobLine(body string, id int64) string {
	i := strings.Index(body, `<tr data-id="`+strconv.FormatInt(id, 10)+`"`)
	if i < 0 {
		return ""
	}
	line := body[i:]
	return line[:strings.Index(line, "</tr>")]
}
