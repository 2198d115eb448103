package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// syncBuffer is a writer the command writes to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serve serves the dashboard of tables with the column flags of tb plus extra flags on a
// free port, until SIGINT; it returns the dashboard's URL and waits for the command's
// exit status.
func serveCLI(t *testing.T, f *fixture, tb rowactor.Table, extra []string, tables ...string) (string, func() int) {
	t.Helper()
	args := append([]string{"serve", "-dsn", f.dsn, "-addr", "127.0.0.1:0"}, extra...)
	args = append(append(args, columnFlags(tb)...), tables...)
	var stdout, stderr syncBuffer
	code := make(chan int, 1)
	go func() { code <- run(args, &stdout, &stderr) }()
	addr := regexp.MustCompile(`on (http://[0-9.:]+)/ `)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := addr.FindStringSubmatch(stdout.String()); m != nil {
			return m[1], func() int {
				t.Helper()
				// The command's signal.NotifyContext holds SIGINT: the test process
				// lives on, and the command stops gracefully.
				if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
					t.Fatal(err)
				}
				select {
				case c := <-code:
					if !strings.Contains(stdout.String(), "stopped") {
						t.Errorf("no stop reported: %s", stdout.String())
					}
					return c
				case <-time.After(30 * time.Second):
					t.Fatal("serve did not stop on SIGINT")
					return -1
				}
			}
		}
		select {
		case c := <-code:
			t.Fatalf("serve exited %d before serving: %s", c, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start: %s %s", stdout.String(), stderr.String())
		}
	}
}

func fetch(t *testing.T, c *http.Client, method, u string, form url.Values) (int, string) {
	t.Helper()
	var (
		resp *http.Response
		err  error
	)
	if method == http.MethodPost {
		resp, err = c.PostForm(u, form)
	} else {
		resp, err = c.Get(u)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// rowactor serve serves the tables the column flags describe, with their counts, refuses a
// POST without its token, turns actions off with -read-only, and stops on SIGINT with exit
// status 0.
func TestServe(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			f := newFixture(t, db)
			tb := rowactor.Table{ID: "id", Payload: "payload", Group: "queue", Attempt: "attempt", RetryAfter: "retry_after",
				ProcessedAt: "processed_at", LockedUntil: "locked_until", Error: "error"}
			tb.Name = f.tableName("serve_a_")
			f.create(tb)
			other := tb
			other.Name = f.tableName("serve_b_")
			f.create(other)
			f.publish(tb, "emails", "{}")
			f.publish(tb, "emails", "{}", rowactor.After(time.Hour))
			dead := f.publish(tb, "emails-dead", "{}")
			f.publish(other, "sms", "{}")

			c := &http.Client{Timeout: 30 * time.Second}
			defer c.CloseIdleConnections()
			u, stop := serveCLI(t, f, tb, []string{"-dead-letters", "emails=emails-dead"}, tb.Name, other.Name)
			status, body := fetch(t, c, http.MethodGet, u+"/", nil)
			if status != http.StatusOK || !strings.Contains(body, `data-table="`+tb.Name+`"`) || !strings.Contains(body, `data-table="`+other.Name+`"`) ||
				!strings.Contains(body, `data-count="scheduled">1<`) || !strings.Contains(body, "dead letters of emails") {
				t.Errorf("overview: %d\n%s", status, body)
			}
			if status, _ := fetch(t, c, http.MethodPost, u+"/action", url.Values{"op": {"requeue"}, "table": {tb.Name}, "group": {"emails-dead"}}); status != http.StatusForbidden {
				t.Errorf("POST without a token: %d, want 403", status)
			}
			if n := len(f.rows(tb, tb.Name)); n != 3 || f.rows(tb, tb.Name)[dead]["Group"] != "emails-dead" {
				t.Error("a refused POST moved the dead letter")
			}
			if code := stop(); code != exitOK {
				t.Errorf("exit status %d after SIGINT, want 0", code)
			}

			u, stop = serveCLI(t, f, tb, []string{"-read-only"}, tb.Name)
			if status, body := fetch(t, c, http.MethodGet, u+"/jobs?table="+tb.Name, nil); status != http.StatusOK || strings.Contains(body, `method="post"`) {
				t.Errorf("read-only job list: %d, or it shows an action", status)
			}
			if status, _ := fetch(t, c, http.MethodPost, u+"/action", url.Values{"op": {"cancel"}}); status != http.StatusForbidden {
				t.Errorf("read-only POST: %d, want 403", status)
			}
			if code := stop(); code != exitOK {
				t.Errorf("exit status %d after SIGINT, want 0", code)
			}
		})
	}
}

// A table the column flags do not describe, or describe in a form the database cannot
// serve, fails the command before it serves, with the library's message and the flag; a
// command line without a table is a usage error.
func TestServeRefuses(t *testing.T) {
	f := newFixture(t, databases[0])
	tb := rowactor.Table{Name: f.tableName("serve_bad_"), ID: "id", Payload: "payload"}
	f.create(tb)
	if code, _, stderr := cli("serve", "-dsn", f.dsn, "-addr", "127.0.0.1:0", "-group", "queue", tb.Name); code != exitFailed || !strings.Contains(stderr, "queue") {
		t.Errorf("a column the table lacks: exit %d, %s", code, stderr)
	}
	// SQLite serves no row lock form (no -locked-until, no -advisory-key): refused as
	// Subscribe refuses it, rather than shown with buttons that all fail.
	if code, _, stderr := cli("serve", "-dsn", f.dsn, "-addr", "127.0.0.1:0", tb.Name); code != exitFailed || !strings.Contains(stderr, "row lock form") {
		t.Errorf("the row lock form on SQLite: exit %d, %s", code, stderr)
	}
	if code, _, stderr := cli("serve", "-dsn", f.dsn); code != exitUsage || !strings.Contains(stderr, "no TABLE") {
		t.Errorf("no table: exit %d, %s", code, stderr)
	}
	if code, _, stderr := cli("serve", "-dsn", f.dsn, "-dead-letters", "a=b", tb.Name); code != exitUsage || !strings.Contains(stderr, "-group") {
		t.Errorf("-dead-letters without -group: exit %d, %s", code, stderr)
	}
}

// -dead-letter-table TABLE=DEADTABLE shows a table without groups with its dead-letter
// table's rows counted on its line; it is refused with -group, and for a table not given.
func TestServeDeadLetterTable(t *testing.T) {
	f := newFixture(t, databases[0])
	tb := rowactor.Table{ID: "id", Payload: "payload", Attempt: "attempt", ProcessedAt: "processed_at", LockedUntil: "locked_until", Error: "error"}
	tb.Name = f.tableName("serve_dlt_")
	f.create(tb)
	dead := tb
	dead.Name = tb.Name + "_dead"
	f.create(dead)
	f.publish(tb, "", "{}")
	f.publish(dead, "", "{}")
	f.publish(dead, "", "{}")

	c := &http.Client{Timeout: 30 * time.Second}
	defer c.CloseIdleConnections()
	u, stop := serveCLI(t, f, tb, []string{"-dead-letter-table", tb.Name + "=" + dead.Name}, tb.Name)
	status, body := fetch(t, c, http.MethodGet, u+"/", nil)
	if status != http.StatusOK || !regexp.MustCompile(`data-count="dead"><a href="/jobs\?table=`+dead.Name+`"[^>]*>2<`).MatchString(body) {
		t.Errorf("overview: %d; want 2 dead letters linked to %s's job list\n%s", status, dead.Name, body)
	}
	if code := stop(); code != exitOK {
		t.Errorf("exit status %d after SIGINT, want 0", code)
	}
	if code, _, stderr := cli("serve", "-dsn", f.dsn, "-group", "queue", "-dead-letter-table", tb.Name+"="+dead.Name, tb.Name); code != exitUsage || !strings.Contains(stderr, "-dead-letters") {
		t.Errorf("-dead-letter-table with -group: exit %d, %s", code, stderr)
	}
	if code, _, stderr := cli("serve", "-dsn", f.dsn, "-dead-letter-table", "other="+dead.Name, tb.Name); code != exitUsage || !strings.Contains(stderr, "no TABLE given") {
		t.Errorf("-dead-letter-table of a table not given: exit %d, %s", code, stderr)
	}
}

// rowactor serve answers only its own hosts: a request whose Host names another (a
// DNS-rebinding page's) is refused, page and POST alike, even with the token a page of
// it handed out, and the row stays; localhost and the address are served; -allow-host
// adds a name.
func TestServeRefusesOtherHosts(t *testing.T) {
	f := newFixture(t, databases[0])
	tb := rowactor.Table{ID: "id", Payload: "payload", Group: "queue", Attempt: "attempt", RetryAfter: "retry_after",
		ProcessedAt: "processed_at", LockedUntil: "locked_until", Error: "error"}
	tb.Name = f.tableName("serve_host_")
	f.create(tb)
	id := f.publish(tb, "emails", `{"secret":"payload"}`)
	u, stop := serveCLI(t, f, tb, []string{"-allow-host", "queues.example.com"}, tb.Name)
	defer func() {
		if code := stop(); code != exitOK {
			t.Errorf("exit status %d after SIGINT, want 0", code)
		}
	}()
	c := &http.Client{Timeout: 30 * time.Second}
	defer c.CloseIdleConnections()
	port := u[strings.LastIndex(u, ":")+1:]
	var cookies []*http.Cookie // the CSRF nonce, sent on every request as a browser would
	as := func(method, host, path string, form url.Values) (int, string) {
		t.Helper()
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, err := http.NewRequest(method, u+path, body)
		if err != nil {
			t.Fatal(err)
		}
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		req.Host = host
		for _, ck := range cookies {
			req.AddCookie(ck)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		cookies = append(cookies, resp.Cookies()...)
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	job := fmt.Sprintf("/job?table=%s&id=%d", tb.Name, id)
	status, page := as(http.MethodGet, "localhost:"+port, job, nil)
	tok := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(page)
	if status != http.StatusOK || tok == nil {
		t.Fatalf("job page for localhost: %d\n%s", status, page)
	}
	rebind := "rebind.attacker.example:" + port
	if status, body := as(http.MethodGet, rebind, job, nil); status != http.StatusForbidden || strings.Contains(body, "secret") {
		t.Errorf("job page for %s: %d, want 403", rebind, status)
	}
	cancel := url.Values{"op": {"cancel"}, "table": {tb.Name}, "id": {strconv.FormatInt(id, 10)}, "csrf": {tok[1]}, "confirm": {"1"}}
	if status, _ := as(http.MethodPost, rebind, "/action", cancel); status != http.StatusForbidden {
		t.Errorf("cancel for %s: %d, want 403", rebind, status)
	}
	if r := f.rows(tb, tb.Name)[id]; r["ProcessedAt"] != "<nil>" {
		t.Errorf("a request for another host cancelled the row: %v", r)
	}
	for _, host := range []string{"127.0.0.1:" + port, "queues.example.com:" + port, "localhost"} {
		if status, _ := as(http.MethodGet, host, job, nil); status != http.StatusOK {
			t.Errorf("job page for %s: %d, want 200", host, status)
		}
	}
}

// A request whose body never comes frees its connection once serve's read timeout has
// passed, rather than holding it as long as the client likes.
func TestServeEndsAStalledRequest(t *testing.T) {
	old := serveTimeouts.read
	serveTimeouts.read = time.Second
	defer func() { serveTimeouts.read = old }()
	f := newFixture(t, databases[0])
	tb := rowactor.Table{ID: "id", Payload: "payload", LockedUntil: "locked_until"}
	tb.Name = f.tableName("serve_stall_")
	f.create(tb)
	u, stop := serveCLI(t, f, tb, nil, tb.Name)
	defer func() {
		if code := stop(); code != exitOK {
			t.Errorf("exit status %d after SIGINT, want 0", code)
		}
	}()
	addr := strings.TrimPrefix(u, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A POST with its cookie, so that the handler reads the body for the token.
	fmt.Fprintf(conn, "POST /action HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\n"+
		"Content-Length: 1000\r\nCookie: rowactor_dashboard_csrf=%s\r\n\r\nop=cancel", addr, strings.Repeat("0f", 16))
	if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(conn); err != nil {
		t.Errorf("the stalled request's connection was still open after 20 s (read timeout 1 s): %v", err)
	}
}

// serve checks the -dead-letter-table against the live database before serving: a name
// of a table that does not exist fails the command, naming that table.
func TestServeChecksDeadLetterTable(t *testing.T) {
	f := newFixture(t, databases[0])
	tb := rowactor.Table{ID: "id", Payload: "payload", Attempt: "attempt", ProcessedAt: "processed_at", Error: "error"}
	tb.Name = f.tableName("serve_r2_")
	f.create(tb)
	f.publish(tb, "", "{}")
	args := append([]string{"serve", "-dsn", f.dsn, "-addr", "127.0.0.1:0", "-dead-letter-table", tb.Name + "=" + tb.Name + "_deda"}, columnFlags(tb)...)
	args = append(args, tb.Name)
	var stdout, stderr syncBuffer
	code := make(chan int, 1)
	go func() { code <- run(args, &stdout, &stderr) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case c := <-code:
			if c != exitFailed || !strings.Contains(stderr.String(), tb.Name+"_deda") {
				t.Errorf("exit %d, stderr %q: want %d naming the dead-letter table", c, stderr.String(), exitFailed)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
		if strings.Contains(stdout.String(), "http://") || time.Now().After(deadline) {
			if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			<-code
			t.Fatalf("serve with -dead-letter-table naming a table that does not exist (%s_deda) started serving: %s", tb.Name, stdout.String())
		}
	}
}
