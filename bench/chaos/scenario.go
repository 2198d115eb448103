package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rowactor/rowactor"
)

// result is one scenario's line.
type result struct {
	DB        string `json:"db"`
	Form      string `json:"form"`
	Procs     int    `json:"procs"`
	Workers   int    `json:"workers"`
	Rows      int    `json:"rows"`
	KillEvery string `json:"kill_every"`
	Seed      uint64 `json:"seed"`

	Published  int `json:"published"`
	Handled    int `json:"handled"`
	Unrecorded int `json:"unrecorded"`
	// Unrecorded, by cause (see tallyFiles).
	UnrecordedSIGKILL       int `json:"unrecorded_sigkill"`
	UnrecordedCommitUnknown int `json:"unrecorded_commit_unknown"`
	UnrecordedMisreported   int `json:"unrecorded_misreported"`
	Redelivered             int `json:"redelivered"`
	Duplicates              int `json:"duplicates"`
	Lost                    int `json:"lost"`
	LeftInTable             int `json:"left_in_table"`

	ProcessKills      int `json:"process_kills"`
	SessionKillRounds int `json:"session_kill_rounds"`
	SessionsKilled    int `json:"sessions_killed"`
	UnexpectedExits   int `json:"unexpected_exits"`
	SettleErrors      int `json:"settle_errors"`
	LeaseLost         int `json:"lease_lost"`
	// AckMisreported counts acks that took effect but reached WithOnSettled with an error
	// (only the advisory unlock after them failed): a library bug.
	AckMisreported int `json:"ack_misreported"`
	// ShutdownErrors counts consumers whose Broker.Shutdown (on SIGTERM at the end)
	// reported not drained or returned an error.
	ShutdownErrors int `json:"shutdown_errors"`
	Warnings       int `json:"warnings"`

	Seconds  float64 `json:"seconds"`
	TimedOut bool    `json:"timed_out,omitempty"`
	Error    string  `json:"error,omitempty"`
	Note     string  `json:"note,omitempty"`
	OK       bool    `json:"ok"`

	details []string
}

func (r result) line() string {
	status := "ok"
	if !r.OK {
		status = "FAIL"
	}
	s := fmt.Sprintf("%-8s %-8s procs=%d published=%d handled=%d unrecorded=%d (sigkill %d, commit unknown %d, misreported %d) redelivered=%d duplicates=%d lost=%d | process_kills=%d session_kills=%d/%d rounds unexpected_exits=%d settle_errors=%d lease_lost=%d ack_misreported=%d shutdown_errors=%d warnings=%d %.1fs %s",
		r.DB, r.Form, r.Procs, r.Published, r.Handled, r.Unrecorded, r.UnrecordedSIGKILL, r.UnrecordedCommitUnknown, r.UnrecordedMisreported,
		r.Redelivered, r.Duplicates, r.Lost,
		r.ProcessKills, r.SessionsKilled, r.SessionKillRounds, r.UnexpectedExits, r.SettleErrors, r.LeaseLost, r.AckMisreported, r.ShutdownErrors, r.Warnings, r.Seconds, status)
	if r.TimedOut {
		s += " (timed out)"
	}
	if r.Error != "" {
		s += " error: " + r.Error
	}
	return s
}

func (r *result) problem(format string, args ...any) {
	if len(r.details) < 40 {
		r.details = append(r.details, fmt.Sprintf(format, args...))
	}
}

func runScenario(ctx context.Context, cfg config, s scenario, seed uint64, dir string) (r result) {
	r = result{DB: s.db, Form: s.form, Procs: s.procs, Workers: cfg.workers, Rows: cfg.rows,
		KillEvery: cfg.killEvery.String(), Seed: seed, Note: s.note}
	started := time.Now()
	defer func() { r.Seconds = time.Since(started).Seconds() }()
	fail := func(err error) result {
		r.Error = err.Error()
		return r
	}

	url := defaultURL(s.db, cfg.dsn, dir)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	b, err := rowactor.Open(octx, url, rowactor.WithPollOnly(), rowactor.WithLogger(log))
	cancel()
	if err != nil {
		return fail(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = b.Shutdown(sctx)
	}()
	be, err := newBackend(s.db, url, b, cfg.workers)
	if err != nil {
		return fail(err)
	}

	name := fmt.Sprintf("chaos_%s_%d", s.form, os.Getpid())
	table := rowactor.Table{Name: name, ID: "id", Payload: "payload", Attempt: "attempt"}
	switch s.form {
	case "lease":
		table.LockedUntil = "locked_until"
	case "advisory":
		table.AdvisoryKey = name + "-{id}" // PostgreSQL's and MySQL's keys are server-wide
	}
	ddl, err := rowactor.Schema(b.Dialect(), table)
	if err != nil {
		return fail(err)
	}
	if err := be.exec(ctx, "DROP TABLE IF EXISTS "+be.quote(name)); err != nil {
		return fail(err)
	}
	for _, stmt := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(stmt) != "" {
			if err := be.exec(ctx, stmt); err != nil {
				return fail(fmt.Errorf("create table: %w", err))
			}
		}
	}
	keepTable := cfg.keep
	defer func() {
		// Runs before the deferred r.Seconds: decide OK here.
		r.OK = r.Error == "" && !r.TimedOut && r.Duplicates == 0 && r.Lost == 0 && r.Published == cfg.rows
		if keepTable || !r.OK {
			fmt.Fprintf(os.Stderr, "chaos: %s/%s: table %s kept on %s\n", s.db, s.form, name, url)
			return
		}
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = be.exec(dctx, "DROP TABLE IF EXISTS "+be.quote(name))
	}()

	exe, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	spec := consumerSpec{URL: be.consumerURL(), Table: table, Queue: "chaos", Workers: cfg.workers,
		Poll: cfg.poll, Work: cfg.work}
	if s.form == "lease" {
		spec.Lease = cfg.lease
	}
	events, err := os.Create(filepath.Join(dir, "events.txt"))
	if err != nil {
		return fail(err)
	}
	defer events.Close()
	event := func(format string, args ...any) {
		fmt.Fprintf(events, "%s %s\n", time.Since(started).Round(time.Millisecond), fmt.Sprintf(format, args...))
	}
	fl := &fleet{exe: exe, spec: spec, dir: dir, event: event}
	defer fl.killAll()
	for range s.procs {
		if err := fl.start(); err != nil {
			return fail(err)
		}
	}

	// Publish while the consumers drain.
	var (
		pubMu     sync.Mutex
		published []int64
	)
	pubDone := make(chan error, 1)
	pctx, stopPublishing := context.WithCancel(ctx)
	defer stopPublishing()
	go func() {
		for sent := 0; sent < cfg.rows; {
			n := min(cfg.batch, cfg.rows-sent)
			payloads := make([][]byte, n)
			for i := range payloads {
				payloads[i] = fmt.Appendf(nil, "chaos-%d", sent+i)
			}
			ids, err := be.publish(pctx, b, table, "chaos", payloads)
			if err != nil {
				pubDone <- fmt.Errorf("publish: %w", err)
				return
			}
			pubMu.Lock()
			published = append(published, ids...)
			pubMu.Unlock()
			sent += n
		}
		event("published %d rows", cfg.rows)
		pubDone <- nil
	}()

	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var chaos <-chan time.Time
	if cfg.killEvery > 0 {
		t := time.NewTicker(cfg.killEvery)
		defer t.Stop()
		chaos = t.C
	}
	check := time.NewTicker(100 * time.Millisecond)
	defer check.Stop()
	deadline := time.NewTimer(cfg.timeout)
	defer deadline.Stop()
	publishing := true
	var countErrs int
loop:
	for {
		select {
		case <-ctx.Done():
			r.Error = "interrupted"
			break loop
		case <-deadline.C:
			r.TimedOut = true
			event("timed out")
			break loop
		case err := <-pubDone:
			if err != nil {
				r.Error = err.Error()
				break loop
			}
			publishing = false
		case <-chaos:
			if err := fl.chaos(ctx, rng, be, &r); err != nil {
				r.problem("fault injection: %v", err)
			}
		case <-check.C:
			for _, c := range fl.unexpectedExits() {
				r.UnexpectedExits++
				r.problem("consumer %d (pid %d) exited on its own: %v; stderr: %s", c.n, c.pid, c.err, tail(c.errPath, 400))
				if err := fl.start(); err != nil {
					r.Error = err.Error()
					break loop
				}
			}
			if publishing {
				continue
			}
			n, err := be.count(ctx, name)
			if err != nil {
				if countErrs++; countErrs > 50 {
					r.Error = fmt.Sprintf("count: %v", err)
					break loop
				}
				continue
			}
			if n == 0 {
				event("table empty")
				break loop
			}
		}
	}
	stopPublishing()
	if publishing && r.Error == "" {
		if err := <-pubDone; err != nil && !errors.Is(err, context.Canceled) {
			r.Error = err.Error()
		}
	}

	// Stop the consumers gracefully: Shutdown lets settlements in flight write their lines.
	fl.stopAll(30 * time.Second)
	for _, c := range fl.all {
		if c.hung {
			r.problem("consumer %d (pid %d) did not stop within 30 s of SIGTERM and was killed", c.n, c.pid)
		}
	}

	pubMu.Lock()
	ids := published
	pubMu.Unlock()
	r.Published = len(ids)
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	left, err := be.remaining(rctx, name)
	cancel()
	if err != nil {
		return fail(fmt.Errorf("read what is left: %w", err))
	}
	tallyFiles(fl, ids, left, &r)
	r.Warnings = countWarnings(fl, &r)
	if r.Error != "" || r.TimedOut || r.Duplicates > 0 || r.Lost > 0 {
		keepTable = true
	}
	return r
}

// ---- consumer processes

type consumer struct {
	n       int
	pid     int
	cmd     *exec.Cmd
	out     string
	errPath string
	done    chan struct{}
	err     error
	killed  bool // SIGKILLed by the chaos
	stopped bool // told to stop, or reported as an unexpected exit
	hung    bool
}

type fleet struct {
	exe   string
	spec  consumerSpec
	dir   string
	event func(string, ...any)
	all   []*consumer
	live  []*consumer
}

func (f *fleet) start() error {
	n := len(f.all) + 1
	spec := f.spec
	spec.Out = filepath.Join(f.dir, fmt.Sprintf("consumer%03d.txt", n))
	text, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	errPath := filepath.Join(f.dir, fmt.Sprintf("consumer%03d.stderr", n))
	stderr, err := os.Create(errPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(f.exe)
	cmd.Env = append(os.Environ(), consumerEnv+"="+string(text))
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		stderr.Close()
		return fmt.Errorf("start consumer: %w", err)
	}
	stderr.Close()
	c := &consumer{n: n, pid: cmd.Process.Pid, cmd: cmd, out: spec.Out, errPath: errPath, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	f.all = append(f.all, c)
	f.live = append(f.live, c)
	f.event("start consumer %d pid %d", c.n, c.pid)
	return nil
}

func (f *fleet) remove(c *consumer) {
	for i, x := range f.live {
		if x == c {
			f.live = append(f.live[:i], f.live[i+1:]...)
			return
		}
	}
}

func (f *fleet) pids() []int {
	var pids []int
	for _, c := range f.live {
		pids = append(pids, c.pid)
	}
	return pids
}

// chaos injects one fault, chosen at random: SIGKILL a consumer and start another, or
// kill a random half of the consumers' sessions, or all of them.
func (f *fleet) chaos(ctx context.Context, rng *rand.Rand, be backend, r *result) error {
	action := 0
	if be.canKillSessions() {
		action = rng.IntN(3)
	}
	switch action {
	case 0:
		if len(f.live) == 0 {
			return nil
		}
		c := f.live[rng.IntN(len(f.live))]
		c.killed, c.stopped = true, true
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.done
		f.remove(c)
		r.ProcessKills++
		f.event("SIGKILL consumer %d pid %d", c.n, c.pid)
		return f.start()
	default:
		kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := be.killSessions(kctx, rng, f.pids(), action == 2)
		r.SessionKillRounds++
		r.SessionsKilled += n
		f.event("killed %d sessions (all=%v)", n, action == 2)
		return err
	}
}

// unexpectedExits returns the consumers that exited without being told to.
func (f *fleet) unexpectedExits() []*consumer {
	var out []*consumer
	for _, c := range append([]*consumer(nil), f.live...) {
		select {
		case <-c.done:
			c.stopped = true
			f.remove(c)
			f.event("consumer %d pid %d exited: %v", c.n, c.pid, c.err)
			out = append(out, c)
		default:
		}
	}
	return out
}

// stopAll sends SIGTERM to every live consumer and waits; one still running after wait is
// SIGKILLed and marked hung.
func (f *fleet) stopAll(wait time.Duration) {
	for _, c := range f.live {
		c.stopped = true
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(wait)
	for _, c := range f.live {
		select {
		case <-c.done:
		case <-deadline:
			c.hung = true
			_ = c.cmd.Process.Signal(syscall.SIGKILL)
			<-c.done
		}
		if c.err != nil && !c.hung {
			f.event("consumer %d pid %d stopped: %v", c.n, c.pid, c.err)
		}
	}
	f.live = nil
}

// killAll is the deferred safety net: no consumer outlives its scenario.
func (f *fleet) killAll() {
	for _, c := range f.live {
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.done
	}
	f.live = nil
}

// countWarnings counts the WARN and ERROR records in the consumers' stderr and notes the
// most frequent messages.
func countWarnings(fl *fleet, r *result) int {
	msgs := map[string]int{}
	total := 0
	for _, c := range fl.all {
		data, err := os.ReadFile(c.errPath)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if !strings.Contains(line, "level=WARN") && !strings.Contains(line, "level=ERROR") {
				continue
			}
			total++
			msg := line
			if i := strings.Index(line, "msg="); i >= 0 {
				msg = line[i+4:]
				// Keep the message and the error's first words: enough to group them.
				if len(msg) > 160 {
					msg = msg[:160]
				}
			}
			msgs[msg]++
		}
	}
	type kv struct {
		k string
		v int
	}
	var list []kv
	for k, v := range msgs {
		list = append(list, kv{k, v})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].v > list[j].v })
	for i, x := range list {
		if i == 3 {
			break
		}
		r.problem("note: %d× consumer log: %s", x.v, x.k)
	}
	return total
}

// tail returns the last n bytes of a file, on one line.
func tail(path string, n int) string {
	data, _ := os.ReadFile(path)
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return strings.ReplaceAll(strings.TrimSpace(string(data)), "\n", " | ")
}
