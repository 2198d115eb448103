// Mailer: a small email service, written once, that runs on SQLite, PostgreSQL and
// MySQL/MariaDB by its URL alone.
//
//	go run ./examples/mailer                                   # a SQLite file in a temporary directory
//	go run ./examples/mailer -url 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run ./examples/mailer -url 'mysql://root@127.0.0.1:3306/test'
//
// It creates its queue table through the broker and its own tables through b.DB(), then:
//
//   - signs three people up, each in a transaction of its own that inserts the signup
//     and publishes its welcome email (PublishTx); a fourth signup rolls back, and
//     leaves neither;
//   - sends the welcome emails with a transactional handler, which records each email
//     sent through the delivery's transaction (d.Tx()): one address succeeds at once,
//     one fails its first attempt and is retried after the default backoff (about a
//     second), one always fails and goes to the dead-letter group after MaxAttempts(2).
//     A failed attempt's record rolls back with it;
//   - publishes a daily digest with a unique key, twice: the second publish is told it
//     is a duplicate;
//   - runs a periodic heartbeat every second;
//   - cancels a reminder scheduled for an hour later;
//   - mounts the dashboard and reads its overview's counts.
//
// It checks every result in SQL, through Inspect and on the dashboard, drops its tables,
// prints one line, and exits 1 if anything differs from what it expects.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dashboard"
	// Each dialect registers its URLs for rowactor.Open when imported.
	_ "github.com/rowactor/rowactor/dialects/mysql"
	_ "github.com/rowactor/rowactor/dialects/postgres"
	_ "github.com/rowactor/rowactor/dialects/sqlite"
)

func main() {
	url := flag.String("url", os.Getenv("DATABASE_URL"), "the database: postgres://…, mysql://… or sqlite:<file> (default $DATABASE_URL; neither: a SQLite file in a temporary directory)")
	flag.Parse()
	if *url == "" {
		dir, err := os.MkdirTemp("", "rowactor-mailer-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "mailer:", err)
			os.Exit(1)
		}
		defer os.RemoveAll(dir)
		*url = "sqlite:" + filepath.Join(dir, "mailer.db")
	}
	summary, err := run(context.Background(), *url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mailer:", err)
		os.Exit(1)
	}
	fmt.Println(summary)
}

// The queues of the one queue table.
const (
	welcome   = "welcome"
	dead      = "welcome-dead"
	digest    = "digest"
	heartbeat = "heartbeat"
)

// The addresses, and what their welcome email meets.
const (
	ada    = "ada@example.com"    // sent at once
	flaky  = "flaky@example.com"  // the first attempt fails, the second is sent
	bounce = "bounce@example.com" // always fails: a dead letter after two attempts
	ghost  = "ghost@example.com"  // its signup rolls back
)

// service is the mailer: its broker, its tables, and what its handlers saw.
type service struct {
	b                     *rowactor.Broker
	emails                rowactor.Table
	signups, sent         string
	mu                    sync.Mutex
	steps                 map[string]int // settlement steps of the welcome queue
	heartbeats, digests   int
	settleErrs            []error
	welcomeDone, digested chan struct{}
}

func run(ctx context.Context, url string) (string, error) {
	s := &service{steps: map[string]int{}, welcomeDone: make(chan struct{}, 16), digested: make(chan struct{}, 4)}
	// Dead-letter moves log a warning each; this program expects one.
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	b, err := rowactor.Open(ctx, url, rowactor.WithOnSettled(s.settled), rowactor.WithLogger(quiet))
	if err != nil {
		return "", err
	}
	s.b = b
	shut := false
	defer func() {
		if !shut { // an early return: stop the subscriptions before their table goes
			_, _ = b.Shutdown(context.Background())
		}
	}()

	if err := s.createTables(ctx); err != nil {
		return "", err
	}
	defer func() {
		if !shut {
			_, _ = b.Shutdown(context.Background())
			shut = true
		}
		s.dropTables(url)
	}()

	if err := s.signUp(ctx); err != nil {
		return "", err
	}
	if err := s.subscribe(ctx); err != nil {
		return "", err
	}
	digestID, err := s.publishDigest(ctx)
	if err != nil {
		return "", err
	}
	reminder, err := s.cancelReminder(ctx)
	if err != nil {
		return "", err
	}
	if err := s.waitAll(ctx); err != nil {
		return "", err
	}
	if err := s.check(ctx, digestID, reminder); err != nil {
		return "", err
	}
	if err := s.checkDashboard(ctx); err != nil {
		return "", err
	}
	rep, err := b.Shutdown(ctx)
	shut = true
	if err != nil {
		return "", fmt.Errorf("shutdown: %w", err)
	}
	if !rep.Drained {
		return "", fmt.Errorf("shutdown did not drain: %+v", rep)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("mailer on %s: 3 signups, 2 welcome emails sent (1 after a retry), 1 dead letter, 1 digest (its duplicate refused), %d heartbeats, 1 reminder cancelled, dashboard checked",
		b.Dialect().Name(), s.heartbeats), nil
}

// settled counts what the database recorded of each delivery.
func (s *service) settled(st rowactor.Settlement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.Err != nil {
		s.settleErrs = append(s.settleErrs, fmt.Errorf("row %d (%s, %s): %w", st.ID, st.Queue, st.Step, st.Err))
		return
	}
	switch st.Queue {
	case welcome:
		s.steps[st.Step]++
		if st.Step == "ack" || st.Step == "dead_letter" {
			s.welcomeDone <- struct{}{}
		}
	case digest:
		s.digests++
		s.digested <- struct{}{}
	case heartbeat:
		s.heartbeats++
	}
}

// createTables applies the queue table's schema through the broker, and creates the
// service's own tables through b.DB(): the same statements on every database.
func (s *service) createTables(ctx context.Context) error {
	p := fmt.Sprintf("mailer_%x_", time.Now().UnixNano()&0xffffffffff)
	s.emails = rowactor.Table{
		Name: p + "emails", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until",
		ProcessedAt: "processed_at", Error: "last_error", UniqueKey: "unique_key", DeadAt: "dead_at",
	}
	s.signups, s.sent = p+"signups", p+"sent"
	if err := s.b.ApplySchema(ctx, s.emails); err != nil {
		return err
	}
	db, err := s.b.DB()
	if err != nil {
		return err
	}
	for _, stmt := range []string{
		"CREATE TABLE " + s.signups + " (address VARCHAR(200) PRIMARY KEY)",
		"CREATE TABLE " + s.sent + " (email_id BIGINT PRIMARY KEY, address VARCHAR(200) NOT NULL, attempt INTEGER NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return nil
}

// dropTables drops the tables once the broker is shut down (its Shutdown closed the
// database it opened), through a broker of its own.
func (s *service) dropTables(url string) {
	ctx := context.Background()
	b, err := rowactor.Open(ctx, url)
	if err != nil {
		return
	}
	defer b.Shutdown(ctx)
	db, err := b.DB()
	if err != nil {
		return
	}
	for _, t := range []string{s.emails.Name, s.signups, s.sent} {
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t)
	}
}

// bind numbers the ? placeholders on PostgreSQL ($1, $2, …): the one thing this
// program's SQL text differs in between the databases.
func (s *service) bind(q string) string {
	if s.b.Dialect().Name() != "postgres" {
		return q
	}
	var out strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			out.WriteString("$" + strconv.Itoa(n))
			continue
		}
		out.WriteRune(r)
	}
	return out.String()
}

// signUp inserts each signup and publishes its welcome email in one transaction. The
// ghost's transaction rolls back, leaving neither.
func (s *service) signUp(ctx context.Context) error {
	db, err := s.b.DB()
	if err != nil {
		return err
	}
	for _, addr := range []string{ada, flaky, bounce, ghost} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.bind("INSERT INTO "+s.signups+" (address) VALUES (?)"), addr); err != nil {
			_ = tx.Rollback()
			return err
		}
		if _, err := s.b.PublishTx(ctx, tx, s.emails, welcome, []byte(addr)); err != nil {
			_ = tx.Rollback()
			return err
		}
		if addr == ghost {
			err = tx.Rollback()
		} else {
			err = tx.Commit()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// subscribe starts the three queues' handlers and the periodic heartbeat.
func (s *service) subscribe(ctx context.Context) error {
	if _, err := s.b.Subscribe(ctx, s.emails, welcome, s.sendWelcome,
		rowactor.Transactional(), rowactor.MaxAttempts(2), rowactor.DeadLetterGroup(dead)); err != nil {
		return err
	}
	ack := func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }
	if _, err := s.b.Subscribe(ctx, s.emails, heartbeat, ack); err != nil {
		return err
	}
	_, err := s.b.Periodic(ctx, s.emails, heartbeat, rowactor.Every(time.Second),
		func(_ context.Context, at time.Time) ([]byte, error) { return []byte(at.Format(time.RFC3339)), nil })
	return err
}

// sendWelcome records the email as sent through the delivery's transaction, then
// "sends" it: the record commits with the Ack, and rolls back with a failure.
func (s *service) sendWelcome(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
	addr := string(d.Payload())
	if _, err := d.Tx().ExecContext(ctx, s.bind("INSERT INTO "+s.sent+" (email_id, address, attempt) VALUES (?, ?, ?)"),
		d.ID(), addr, d.Attempt()); err != nil {
		return rowactor.Fail(err)
	}
	switch {
	case addr == bounce:
		return rowactor.Fail(errors.New("smtp: 550 no such user"))
	case addr == flaky && d.Attempt() == 1:
		return rowactor.Fail(errors.New("smtp: 421 try again later"))
	}
	return rowactor.Ack()
}

// publishDigest publishes today's digest twice under one unique key; the second is a
// duplicate. The digest queue's subscription starts after both.
func (s *service) publishDigest(ctx context.Context) (int64, error) {
	key := "digest:" + time.Now().UTC().Format(time.DateOnly)
	id, err := s.b.Publish(ctx, s.emails, digest, []byte("today's digest"), rowactor.Unique(key))
	if err != nil {
		return 0, err
	}
	again, err := s.b.Publish(ctx, s.emails, digest, []byte("today's digest, again"), rowactor.Unique(key))
	if !errors.Is(err, rowactor.ErrDuplicate) || again != id {
		return 0, fmt.Errorf("the digest's second publish returned %d, %v; want row %d and ErrDuplicate", again, err, id)
	}
	_, err = s.b.Subscribe(ctx, s.emails, digest, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	return id, err
}

// cancelReminder schedules a reminder an hour out, then cancels it.
func (s *service) cancelReminder(ctx context.Context) (int64, error) {
	id, err := s.b.Publish(ctx, s.emails, welcome, []byte("reminder for "+ada), rowactor.After(time.Hour))
	if err != nil {
		return 0, err
	}
	return id, s.b.Cancel(ctx, s.emails, id, "unsubscribed")
}

// waitAll waits for the three welcome emails' ends, the digest and two heartbeats.
func (s *service) waitAll(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for range 3 {
		select {
		case <-s.welcomeDone:
		case <-ctx.Done():
			return fmt.Errorf("the welcome emails did not all end within 30 s: %v", s.stepsNow())
		}
	}
	select {
	case <-s.digested:
	case <-ctx.Done():
		return errors.New("the digest was not handled within 30 s")
	}
	for {
		s.mu.Lock()
		n := s.heartbeats
		s.mu.Unlock()
		if n >= 2 {
			return nil
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("%d heartbeats within 30 s, want 2", n)
		}
	}
}

func (s *service) stepsNow() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for k, v := range s.steps {
		out[k] = v
	}
	return out
}

// check compares the tables, the rows' states and the settlements with what the run
// should have left.
func (s *service) check(ctx context.Context, digestID, reminder int64) error {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	s.mu.Lock()
	if len(s.settleErrs) > 0 {
		bad("settlements failed: %v", s.settleErrs)
	}
	// flaky's and bounce's first attempts wait out the backoff; bounce's second dies.
	if want := map[string]int{"retry_after": 2, "ack": 2, "dead_letter": 1}; fmt.Sprint(s.steps) != fmt.Sprint(want) {
		bad("welcome settlements %v, want %v", s.steps, want)
	}
	if s.digests != 1 {
		bad("the digest was handled %d times, want once", s.digests)
	}
	s.mu.Unlock()

	db, err := s.b.DB()
	if err != nil {
		return err
	}
	// What the welcome handler recorded: the failed attempts' records rolled back.
	rows, err := db.QueryContext(ctx, "SELECT address, attempt FROM "+s.sent+" ORDER BY address")
	if err != nil {
		return err
	}
	var sent []string
	for rows.Next() {
		var addr string
		var attempt int
		if err := rows.Scan(&addr, &attempt); err != nil {
			rows.Close()
			return err
		}
		sent = append(sent, fmt.Sprintf("%s@%d", addr, attempt))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if want := []string{ada + "@1", flaky + "@2"}; fmt.Sprint(sent) != fmt.Sprint(want) {
		bad("sent records %v, want %v (address@attempt)", sent, want)
	}
	var signups int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+s.signups).Scan(&signups); err != nil {
		return err
	}
	if signups != 3 {
		bad("%d signups, want 3 (the ghost's rolled back)", signups)
	}
	// ada's and flaky's rows kept processed, the reminder kept cancelled; the bounce moved
	// to its dead-letter group, and the ghost's was never committed.
	var kept int
	if err := db.QueryRowContext(ctx, s.bind("SELECT COUNT(*) FROM "+s.emails.Name+" WHERE queue = ?"), welcome).Scan(&kept); err != nil {
		return err
	}
	if kept != 3 {
		bad("%d rows in the welcome queue, want 3 (two processed, one cancelled)", kept)
	}

	// Each row's state, as Inspect reads it.
	var deadID int64
	if err := db.QueryRowContext(ctx, s.bind("SELECT id FROM "+s.emails.Name+" WHERE queue = ?"), dead).Scan(&deadID); err != nil {
		bad("no dead letter in %s: %v", dead, err)
	} else if j, err := s.b.Inspect(ctx, s.emails, deadID); err != nil {
		return err
	} else if j.State != rowactor.JobDead || j.Attempt != 2 || !strings.Contains(j.Error, "550") || string(j.Payload) != bounce {
		bad("the dead letter reads %s, attempt %d, error %q, payload %q; want dead after 2 attempts with the 550", j.State, j.Attempt, j.Error, j.Payload)
	}
	if j, err := s.b.Inspect(ctx, s.emails, reminder); err != nil {
		return err
	} else if j.State != rowactor.JobCancelled || !strings.Contains(j.Error, "unsubscribed") {
		bad("the reminder reads %s, error %q; want cancelled, unsubscribed", j.State, j.Error)
	}
	if j, err := s.b.Inspect(ctx, s.emails, digestID); err != nil {
		return err
	} else if j.State != rowactor.JobProcessed || string(j.Payload) != "today's digest" {
		bad("the digest reads %s, payload %q; want processed, the first publish's payload", j.State, j.Payload)
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// countCell reads one count of a group's line on the dashboard's overview.
var countCell = regexp.MustCompile(`(?s)<tr data-group="([^"]*)"[^>]*>.*?data-count="dead">(?:<a[^>]*>)?([0-9–]+)`)

// checkDashboard mounts the dashboard as a service would and reads the welcome queue's
// dead letters off its overview.
func (s *service) checkDashboard(ctx context.Context) error {
	d, err := dashboard.New(s.b, []dashboard.Table{{Table: s.emails, DeadLetters: map[string]string{welcome: dead}}})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/queues/", http.StripPrefix("/admin/queues", d))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/admin/queues/", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the dashboard's overview answered %s", resp.Status)
	}
	for _, m := range countCell.FindAllStringSubmatch(string(body), -1) {
		if m[1] == welcome {
			if m[2] != "1" {
				return fmt.Errorf("the dashboard shows %s dead letters for %s, want 1", m[2], welcome)
			}
			return nil
		}
	}
	return fmt.Errorf("the dashboard's overview has no line for %s:\n%s", welcome, body)
}
