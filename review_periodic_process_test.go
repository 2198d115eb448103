package rowactor_test

// Adversarial review of periodic jobs, cases that take a process of their own: a panic
// in the payload function, a Stop from inside it, a process whose zone is not UTC. The
// parent test re-runs this binary with TestReviewPeriodicChild and a mode.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

const (
	reviewModeEnv   = "ROWACTOR_REVIEW_PERIODIC_MODE"
	reviewDriverEnv = "ROWACTOR_REVIEW_PERIODIC_DRIVER"
)

// TestReviewPeriodicProcess runs each child mode in a process of its own:
//
//   - panic (was a finding, fixed): a payload function that panics once kills the whole
//     process (no recover in the periodic goroutine), instead of failing that round,
//     being logged, and letting the job go on with its lock let go. Subscriptions
//     recover a handler's panic; a payload function deserves the same.
//   - stop (was a finding, fixed): a payload function that calls PeriodicJob.Stop (or Broker.Shutdown,
//     which stops the job) deadlocks: Stop waits for the round the caller runs in.
//   - tz (was a finding, fixed): in a process with TZ=Asia/Kolkata, Cron("0 * * * *") (local hours)
//     continuing from a stored run publishes a run at a UTC hour that is no run of the
//     schedule (see review_periodic_tz_internal_test.go).
func TestReviewPeriodicProcess(t *testing.T) {
	if os.Getenv(reviewModeEnv) != "" {
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
			cmd := exec.CommandContext(ctx, exe, "-test.run=^TestReviewPeriodicChild$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), reviewModeEnv+"="+c.mode, reviewDriverEnv+"="+c.driver)
			if c.tz != "" {
				cmd.Env = append(cmd.Env, "TZ="+c.tz)
			}
			out, err := cmd.CombinedOutput()
			text := string(out)
			switch {
			case ctx.Err() != nil:
				t.Fatalf("%s: the child hung for 40 s (deadlock) and was killed:\n%s", c.mode, tail(text, 3000))
			case strings.Contains(text, "panic: review payload"):
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

func TestReviewPeriodicChild(t *testing.T) {
	mode := os.Getenv(reviewModeEnv)
	if mode == "" {
		t.Skip("run by TestReviewPeriodicProcess")
	}
	h := newHarness(t, driverNamed(t, os.Getenv(reviewDriverEnv)), rowactor.FormLease, withUniqueKey, withProcessedAt)
	switch mode {
	case "panic":
		reviewChildPanic(t, h)
	case "stop":
		reviewChildStop(t, h)
	case "tz":
		reviewChildZone(t, h)
	}
}

func reviewChildPanic(t *testing.T, h *harness) {
	ctx := context.Background()
	b := h.broker()
	var calls atomic.Int64
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), func(ctx context.Context, at time.Time) ([]byte, error) {
		if calls.Add(1) == 1 {
			panic("review payload: the report's template is missing")
		}
		return reviewPayload(ctx, at)
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

func reviewChildStop(t *testing.T, h *harness) {
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
		return reviewPayload(ctx, at)
	}, rowactor.PeriodicName("selfstop"))
	if err != nil {
		t.Fatal(err)
	}
	job.Store(p)
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		fmt.Println("REVIEW: PeriodicJob.Stop called from the payload function has not returned in 5 s (deadlock)")
		os.Exit(3) // cleanup's Shutdown would wait for the same round for ever
	}
}

func reviewChildZone(t *testing.T, h *harness) {
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
	p, err := b.Periodic(context.Background(), h.table, h.queue, hourly, reviewPayload, rowactor.PeriodicName("hourly"))
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
