package rowactor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// runPeriodicChild runs job.Periodic every second until job.StopAt. Each run's payload
// takes 200 ms to make, holding the job's lock, so that a kill can land mid-run.
func runPeriodicChild(job childJob, out *os.File) int {
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
			first, last := wantEverySecond(t, runs, 17)
			if first.After(start.Add(3*time.Second)) || last.Before(stop.Add(-3*time.Second)) {
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
