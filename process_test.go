package rowactor_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// childEnv carries a child consumer's assignment from the parent test.
const childEnv = "ROWACTOR_TEST_CHILD"

type childJob struct {
	URL   string
	Table rowactor.Table
	Queue string
	Out   string
}

// runChild is a consumer OS process: it drains the table until it has seen nothing for a
// while, writing every id it settled to its output file, then shuts down.
func runChild(spec string) int {
	var job childJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	out, err := os.Create(job.Out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer out.Close()
	w := bufio.NewWriter(out)
	var mu sync.Mutex
	last := time.Now()
	ctx := context.Background()
	b, err := rowactor.Open(ctx, job.URL, rowactor.WithOnSettled(func(s rowactor.Settlement) {
		mu.Lock()
		defer mu.Unlock()
		last = time.Now()
		if s.Err == nil && s.Step == "ack" {
			fmt.Fprintf(w, "%d\n", s.ID)
		} else {
			fmt.Fprintf(w, "# %d %s %v\n", s.ID, s.Step, s.Err)
		}
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	_, err = b.Subscribe(ctx, job.Table, job.Queue, func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		return rowactor.Ack()
	}, rowactor.Workers(4), rowactor.PollInterval(20*time.Millisecond))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	for {
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		idle := time.Since(last)
		mu.Unlock()
		if idle > 3*time.Second {
			break
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := b.Shutdown(sctx); err != nil {
		fmt.Fprintln(os.Stderr, "child: shutdown:", err)
		return 1
	}
	mu.Lock()
	defer mu.Unlock()
	if err := w.Flush(); err != nil {
		return 1
	}
	return 0
}

// TestTwoProcessesDeliverEveryRowOnce drains one table from two OS processes in every
// form each database serves across processes, and counts every row by id.
func TestTwoProcessesDeliverEveryRowOnce(t *testing.T) {
	for _, drv := range drivers {
		for _, form := range drv.forms {
			if drv.url == nil || (drv.name == "sqlite" && form == rowactor.FormAdvisory) {
				continue // SQLite keeps advisory keys in the process: one consumer process per file
			}
			t.Run(drv.name+"/"+form.String(), func(t *testing.T) {
				t.Parallel()
				const rows = 400
				h := newHarness(t, drv, form)
				b := h.broker()
				exe, err := os.Executable()
				if err != nil {
					t.Fatal(err)
				}
				published := map[int64]bool{}
				for _, id := range h.publish(b, rows/2) {
					published[id] = true
				}
				var procs []*exec.Cmd
				var outs []string
				for i := range 2 {
					job := childJob{URL: drv.url(t, h.d), Table: h.table, Queue: h.queue, Out: filepath.Join(t.TempDir(), fmt.Sprintf("child%d.txt", i))}
					spec, _ := json.Marshal(job)
					cmd := exec.Command(exe, "-test.run=^$")
					cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
					cmd.Stderr = os.Stderr
					if err := cmd.Start(); err != nil {
						t.Fatal(err)
					}
					procs = append(procs, cmd)
					outs = append(outs, job.Out)
				}
				for _, id := range h.publish(b, rows/2) {
					published[id] = true
				}
				for _, cmd := range procs {
					done := make(chan error, 1)
					go func() { done <- cmd.Wait() }()
					select {
					case err := <-done:
						if err != nil {
							t.Fatalf("child: %v", err)
						}
					case <-time.After(90 * time.Second):
						_ = cmd.Process.Kill()
						t.Fatal("child did not finish in 90 s")
					}
				}
				seen := map[int64]int{}
				perChild := make([]int, len(outs))
				for i, path := range outs {
					f, err := os.Open(path)
					if err != nil {
						t.Fatal(err)
					}
					sc := bufio.NewScanner(f)
					for sc.Scan() {
						var id int64
						if _, err := fmt.Sscanf(sc.Text(), "%d", &id); err != nil {
							t.Fatalf("child %d reported %q", i, sc.Text())
						}
						seen[id]++
						perChild[i]++
					}
					f.Close()
				}
				for id := range published {
					if seen[id] != 1 {
						t.Errorf("row %d settled %d times", id, seen[id])
					}
				}
				if len(seen) != len(published) {
					t.Errorf("%d distinct rows settled, %d published", len(seen), len(published))
				}
				if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name); n != 0 {
					t.Errorf("%d rows left in the table", n)
				}
				t.Logf("rows per process: %v", perChild)
			})
		}
	}
}
