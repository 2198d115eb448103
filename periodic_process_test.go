package rowactor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/rowactortest"
)

// periodicChildMode picks what runPeriodicChild does: "" is TestPeriodicAcrossProcesses's
// child; "hang" and "takeover" are TestPeriodicTakeoverAcrossProcesses's (runTakeoverChild).
const periodicChildMode = "ROWACTOR_PERIODIC_CHILD_MODE"

// runPeriodicChild runs job.Periodic every second until job.StopAt. Each run's payload
// takes 200 ms to make, holding the job's lock, so that a kill can land mid-run.
func runPeriodicChild(job childJob, out *os.File) int {
	if mode := os.Getenv(periodicChildMode); mode != "" {
		return runTakeoverChild(job, out, mode)
	}
	ctx := context.Background()
	b, err := rowactor.Open(ctx, job.URL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	p, err := b.Periodic(ctx, job.Table, job.Queue, rowactor.Every(time.Second), func(_ context.Context, at time.Time) ([]byte, error) {
		fmt.Fprintf(out, "run %s\n", at.UTC().Format(keyTime)) // unbuffered: the parent watches it
		time.Sleep(200 * time.Millisecond)
		return []byte(at.UTC().Format(keyTime)), nil
	}, rowactor.PeriodicName(job.Periodic))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	time.Sleep(time.Until(job.StopAt))
	p.Stop()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := b.Shutdown(sctx); err != nil {
		fmt.Fprintln(os.Stderr, "child: shutdown:", err)
		return 1
	}
	return 0
}

// TestPeriodicAcrossProcesses: three OS processes run one periodic job every second for
// 20 s; after 8 s the process publishing a run is killed mid-run (SIGKILL, holding the
// job's lock). Every second from the first run to the last has exactly one row, on
// every database.
func TestPeriodicAcrossProcesses(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		if drv.url == nil {
			continue
		}
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease, withUniqueKey, withProcessedAt)
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			stop := start.Add(20 * time.Second)
			procs := make([]*exec.Cmd, 3)
			outs := make([]string, 3)
			for i := range procs {
				job := childJob{URL: drv.url(t, h.d), Table: h.table, Queue: h.queue, Periodic: "tick", StopAt: stop,
					Out: filepath.Join(t.TempDir(), fmt.Sprintf("periodic%d.txt", i))}
				spec, _ := json.Marshal(job)
				cmd := exec.Command(exe, "-test.run=^$")
				cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				procs[i], outs[i] = cmd, job.Out
			}
			t.Cleanup(func() {
				for _, cmd := range procs {
					_ = cmd.Process.Kill()
				}
			})
			// After 8 s, kill the first process seen making a run's payload.
			time.Sleep(time.Until(start.Add(8 * time.Second)))
			lines := make([]int, 3)
			for i, path := range outs {
				lines[i] = runLines(t, path)
			}
			killed, killedRun := -1, ""
			for killed < 0 && time.Now().Before(start.Add(15*time.Second)) {
				for i, path := range outs {
					if n := runLines(t, path); n > lines[i] {
						_ = procs[i].Process.Signal(syscall.SIGKILL)
						killed, killedRun = i, lastLine(t, path)
						break
					}
				}
				time.Sleep(2 * time.Millisecond)
			}
			if killed < 0 {
				t.Fatal("no process made a run's payload between 8 s and 15 s")
			}
			_ = procs[killed].Wait()
			for i, cmd := range procs {
				if i != killed {
					if err := cmd.Wait(); err != nil {
						t.Fatalf("periodic process %d: %v", i, err)
					}
				}
			}
			runs := h.runsOf("tick", start.Add(-time.Second), stop.Add(time.Second))
			// Every second from the first run to the last, across the kill (8–15 s in):
			// the window checks below bound where they start and stop, so 13 runs at least.
			first, last := wantEverySecond(t, runs, 13)
			// The first run waits for the children to start: seconds under the suite's load.
			if first.After(start.Add(5*time.Second)) || last.Before(stop.Add(-3*time.Second)) {
				t.Fatalf("runs from %v to %v, want them from the start (%v) to the stop (%v)", first, last, start, stop)
			}
			if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != len(runs) {
				t.Fatalf("%d rows for %d runs", n, len(runs))
			}
			t.Logf("%d runs from %s to %s; process %d killed making %s", len(runs), first.Format(keyTime), last.Format(keyTime), killed, killedRun)
		})
	}
}

func runLines(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Count(string(data), "run ")
}

func lastLine(t *testing.T, path string) string {
	t.Helper()
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	return lines[len(lines)-1]
}

// runTakeoverChild runs job.Periodic every 2 s until job.StopAt, going by a
// rowactortest.Clock (see childJob.ClockFrom). In mode "hang" (the old process of a
// rolling deploy) it makes its first run's payload, writing "run TIME", and hangs in the
// second, writing "hang TIME", holding the job's lock until it is killed; its clock jumps
// to each of those runs instead of waiting for it. In mode "takeover" (the new process)
// it runs the job with SkipMissed and writes its debug log, whose rounds say whether they
// led.
func runTakeoverChild(job childJob, out *os.File, mode string) int {
	ctx := context.Background()
	clock := rowactortest.NewClock()
	if ahead := time.Until(job.ClockFrom); !job.ClockFrom.IsZero() && ahead > 0 {
		clock.Advance(ahead)
	}
	opts := []rowactor.Option{rowactor.WithClock(clock)}
	popts := []rowactor.PeriodicOption{rowactor.PeriodicName(job.Periodic)}
	if mode == "takeover" {
		opts = append(opts, rowactor.WithLogger(slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))))
		popts = append(popts, rowactor.SkipMissed())
	}
	b, err := rowactor.Open(ctx, job.URL, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	var calls atomic.Int32
	p, err := b.Periodic(ctx, job.Table, job.Queue, rowactor.Every(2*time.Second), func(_ context.Context, at time.Time) ([]byte, error) {
		if mode == "hang" && calls.Add(1) > 1 {
			fmt.Fprintf(out, "hang %s\n", at.UTC().Format(keyTime))
			select {} // until killed
		}
		fmt.Fprintf(out, "run %s\n", at.UTC().Format(keyTime))
		return []byte(at.UTC().Format(keyTime)), nil
	}, popts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	if mode == "hang" {
		toNextRun := func() { // a jump to 100 ms past the job's next run
			now := clock.Now()
			clock.Advance(now.Truncate(2 * time.Second).Add(2100 * time.Millisecond).Sub(now))
		}
		toNextRun()
		for p.Published() < 1 && time.Now().Before(job.StopAt) {
			time.Sleep(10 * time.Millisecond)
		}
		toNextRun() // to the run it hangs in
	}
	time.Sleep(time.Until(job.StopAt))
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := b.Shutdown(sctx); err != nil {
		fmt.Fprintln(os.Stderr, "child: shutdown:", err)
		return 1
	}
	return 0
}

// TestPeriodicTakeoverAcrossProcesses, a rolling deploy (issue 29, item 4): process a
// runs an Every(2s) job and hangs making run T, holding the job's lock; process b
// (SkipMissed) starts 4.5 s after T and waits in line; a is SIGKILLed. Each process goes
// by a test clock: a's jumps to its runs, and b's reads T+4.5 s as it starts. b publishes T, T+2
// and T+4 as themselves, once each. PostgreSQL and MariaDB: SQLite's lock is in the
// process, so a process started later never waits in line behind another (docs/periodic.md).
func TestPeriodicTakeoverAcrossProcesses(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		if drv.url == nil || drv.keyLocked == nil {
			continue
		}
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease, withUniqueKey, withProcessedAt)
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			stop := time.Now().Add(40 * time.Second)
			start := func(mode string, clockFrom time.Time) (*exec.Cmd, string) {
				job := childJob{URL: drv.url(t, h.d), Table: h.table, Queue: h.queue, Periodic: "tick", StopAt: stop,
					ClockFrom: clockFrom, Out: filepath.Join(t.TempDir(), mode+".txt")}
				spec, _ := json.Marshal(job)
				cmd := exec.Command(exe, "-test.run=^$")
				cmd.Env = append(os.Environ(), childEnv+"="+string(spec), periodicChildMode+"="+mode)
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
				return cmd, job.Out
			}
			read := func(path string) string {
				data, err := os.ReadFile(path)
				if err != nil && !os.IsNotExist(err) {
					t.Fatal(err)
				}
				return string(data)
			}
			a, aOut := start("hang", time.Time{})
			var run time.Time // T
			waitUntil(t, "process a to hang making a run", func() bool {
				for _, l := range strings.Split(read(aOut), "\n") {
					if at, ok := strings.CutPrefix(l, "hang "); ok {
						run, err = time.Parse(keyTime, at)
						return err == nil
					}
				}
				return false
			})
			// b's clock reads T+4.5 s as it starts (a's clock jumped to T).
			_, bOut := start("takeover", run.Add(4500*time.Millisecond))
			waitUntil(t, "process b to wait in line behind a", func() bool { return strings.Contains(read(bOut), "led=false") })
			if err := a.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = a.Wait()
			for _, r := range []time.Time{run, run.Add(2 * time.Second), run.Add(4 * time.Second)} {
				key := "tick@" + r.UTC().Format(keyTime)
				waitUntil(t, fmt.Sprintf("process b to publish the run of T+%v", r.Sub(run)), func() bool { return h.countKey(key) >= 1 })
			}
			for r := run.Add(-2 * time.Second); !r.After(run.Add(4 * time.Second)); r = r.Add(2 * time.Second) {
				if n := h.countKey("tick@" + r.UTC().Format(keyTime)); n != 1 {
					t.Errorf("the run of %s has %d rows, want 1", r.Format(keyTime), n)
				}
			}
		})
	}
}

const (
	periodicProcessModeEnv   = "ROWACTOR_PERIODIC_PROCESS_MODE"
	periodicProcessDriverEnv = "ROWACTOR_PERIODIC_PROCESS_DRIVER"
)

// TestPeriodicJobSurvivesPayloadPanicSelfStopAndLocalZone runs each child mode in a process
// of its own, re-running this binary with TestPeriodicJobChild:
//
//   - panic: a payload function that panics once fails that round, is logged, and the job
//     goes on with its lock let go; the process lives.
//   - stop: a payload function that calls PeriodicJob.Stop returns (no deadlock on the
//     round it runs in).
//   - tz: in a process with TZ=Asia/Kolkata, Cron("0 * * * *") (local hours) continuing
//     from a stored run publishes the missed local hour (see TestCronRunsInItsZoneAfterAStoredUTCKey).
func TestPeriodicJobSurvivesPayloadPanicSelfStopAndLocalZone(t *testing.T) {
	t.Parallel()
	if os.Getenv(periodicProcessModeEnv) != "" {
		t.Skip("in a child")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ mode, driver, tz string }{
		{"panic", "postgres", ""}, {"panic", "mysql", ""}, {"panic", "sqlite", ""},
		{"stop", "sqlite", ""},
		{"tz", "postgres", "Asia/Kolkata"}, {"tz", "sqlite", "Asia/Kolkata"},
	}
	for _, c := range cases {
		t.Run(c.mode+"/"+c.driver, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, exe, "-test.run=^TestPeriodicJobChild$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), periodicProcessModeEnv+"="+c.mode, periodicProcessDriverEnv+"="+c.driver)
			if c.tz != "" {
				cmd.Env = append(cmd.Env, "TZ="+c.tz)
			}
			out, err := cmd.CombinedOutput()
			text := string(out)
			switch {
			case ctx.Err() != nil:
				t.Fatalf("%s: the child hung for 40 s (deadlock) and was killed:\n%s", c.mode, tail(text, 3000))
			case strings.Contains(text, "panic: test payload"):
				t.Fatalf("%s: a payload function's panic killed the process (%v):\n%s", c.mode, err, tail(text, 3000))
			case err != nil:
				t.Fatalf("%s: child failed (%v):\n%s", c.mode, err, tail(text, 3000))
			case strings.Contains(text, "--- SKIP"):
				t.Skipf("the child skipped:\n%s", tail(text, 1000))
			}
		})
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// TestPeriodicJobChild is the child of TestPeriodicJobSurvivesPayloadPanicSelfStopAndLocalZone.
func TestPeriodicJobChild(t *testing.T) {
	t.Parallel()
	mode := os.Getenv(periodicProcessModeEnv)
	if mode == "" {
		t.Skip("run by TestPeriodicJobSurvivesPayloadPanicSelfStopAndLocalZone")
	}
	h := newHarness(t, driverNamed(t, os.Getenv(periodicProcessDriverEnv)), rowactor.FormLease, withUniqueKey, withProcessedAt)
	switch mode {
	case "panic":
		periodicChildPanic(t, h)
	case "stop":
		periodicChildSelfStop(t, h)
	case "tz":
		periodicChildLocalZone(t, h)
	}
}

func periodicChildPanic(t *testing.T, h *harness) {
	ctx := context.Background()
	b := h.broker()
	var calls atomic.Int64
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), func(ctx context.Context, at time.Time) ([]byte, error) {
		if calls.Add(1) == 1 {
			panic("test payload: the report's template is missing")
		}
		return periodicPayload(ctx, at)
	}, rowactor.PeriodicName("panicky"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3500 * time.Millisecond)
	stopWithin(t, p, 5*time.Second)
	if n := h.countPrefix("panicky"); n < 2 {
		t.Errorf("after one panicking payload the job published %d runs in 3.5 s, want it to go on (at least 2)", n)
	}
	if h.drv.keyLocked != nil && h.drv.keyLocked(t, h.d, dialects.LockKey("periodic:"+h.table.Name+":panicky")) {
		t.Error("the job's lock is still held after a panicking payload and Stop")
	}
	if n := inUse(h.d); n != 0 {
		t.Errorf("%d pool connections still lent out", n)
	}
}

func periodicChildSelfStop(t *testing.T, h *harness) {
	ctx := context.Background()
	b := h.broker()
	var job atomic.Pointer[rowactor.PeriodicJob]
	stopped := make(chan struct{})
	var calls atomic.Int64
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), func(ctx context.Context, at time.Time) ([]byte, error) {
		if calls.Add(1) == 1 {
			for job.Load() == nil {
				time.Sleep(time.Millisecond)
			}
			job.Load().Stop() // "this was the last report we need"
			close(stopped)
		}
		return periodicPayload(ctx, at)
	}, rowactor.PeriodicName("selfstop"))
	if err != nil {
		t.Fatal(err)
	}
	job.Store(p)
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		fmt.Println("CHILD: PeriodicJob.Stop called from the payload function has not returned in 5 s (deadlock)")
		os.Exit(3) // cleanup's Shutdown would wait for the same round for ever
	}
}

func periodicChildLocalZone(t *testing.T, h *harness) {
	if time.Local.String() == "UTC" {
		t.Fatal("the child runs with TZ set")
	}
	now := time.Now()
	cut := now.Add(-time.Minute)
	if m := now.Minute(); m == 59 || m <= 1 {
		t.Skip("too near a local hour; run again")
	}
	exp := time.Date(cut.Year(), cut.Month(), cut.Day(), cut.Hour(), 0, 0, 0, time.Local) // the latest local hour
	prior := exp.Add(-time.Hour)
	h.exec(fmt.Sprintf("INSERT INTO %s (grp, payload, unique_key, processed_at) VALUES (?, ?, ?, ?)", h.table.Name),
		h.queue, []byte("prior"), "hourly@"+prior.UTC().Format(keyTime), h.drv.timeValue(prior))
	hourly, err := rowactor.Cron("0 * * * *")
	if err != nil {
		t.Fatal(err)
	}
	b := h.broker()
	p, err := b.Periodic(context.Background(), h.table, h.queue, hourly, periodicPayload, rowactor.PeriodicName("hourly"))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the missed run", func() bool { return p.Published() >= 1 })
	time.Sleep(300 * time.Millisecond)
	p.Stop()
	if n, want := h.countKey("hourly@"+exp.UTC().Format(keyTime)), 1; n != want || h.countPrefix("hourly") != 2 {
		t.Errorf("in %s, Cron(\"0 * * * *\") after a run at %s: %d rows for the missed local hour %s, %d hourly rows in all (want the prior and that one); published %d",
			time.Local, prior.Format(time.RFC3339), n, exp.Format(time.RFC3339), h.countPrefix("hourly"), p.Published())
	}
}
