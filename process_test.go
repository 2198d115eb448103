package rowactor_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/rowactor/rowactor"
)

// childEnv carries a child consumer's assignment from the parent test.
const childEnv = "ROWACTOR_TEST_CHILD"

type childJob struct {
	URL   string
	Table rowactor.Table
	Queue string
	Out   string
	// Hold makes the child report each row it claims and never settle it, until killed.
	Hold bool
	// Trace makes the child record its spans and report each delivery span's trace and
	// parent at the end.
	Trace bool
	// Times makes the handler take 5 ms and report "times ID START END" (Unix ns) for each
	// row it handled, so the parent can check that handlings never overlapped.
	Times bool
	// RetryPayloads are payloads whose first delivery answers RetryAfter(RetryDelay).
	RetryPayloads []string
	RetryDelay    time.Duration
	// UniqueKey makes the child a publisher instead (runPublisherChild): at StartAt, 8
	// goroutines publish with Unique(UniqueKey), and it writes each returned id.
	UniqueKey string
	StartAt   time.Time
	// Periodic makes the child run a periodic job of that name every second instead
	// (runPeriodicChild) until StopAt, writing "run TIME" as each run's payload is made.
	Periodic string
	StopAt   time.Time
	// ClockFrom, when set, makes a periodic takeover child (runTakeoverChild) go by a
	// rowactortest.Clock that reads ClockFrom when the child starts and keeps the
	// machine's pace from there; without it the child's clock jumps only as its mode says.
	ClockFrom time.Time
	// StopFile makes a consumer child drain until that file exists, instead of until it
	// has settled nothing for 3 s. The parent creates it (stopChildrenWhenDrained) once
	// the table holds no unfinished row, so no row is left for a child to claim.
	StopFile string
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
	if job.UniqueKey != "" {
		return runPublisherChild(job, out)
	}
	if job.Periodic != "" {
		return runPeriodicChild(job, out)
	}
	w := bufio.NewWriter(out)
	var mu sync.Mutex
	last := time.Now()
	ctx := context.Background()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	b, err := rowactor.Open(ctx, job.URL, rowactor.WithTracerProvider(tp), rowactor.WithOnSettled(func(s rowactor.Settlement) {
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
	opts := []rowactor.SubscribeOption{rowactor.Workers(4), rowactor.PollInterval(20 * time.Millisecond)}
	if job.Table.LockedUntil != "" {
		opts = append(opts, rowactor.Lease(2*time.Second))
	}
	_, err = b.Subscribe(ctx, job.Table, job.Queue, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if job.Hold {
			mu.Lock()
			fmt.Fprintf(w, "claimed %d %d\n", d.ID(), d.Attempt())
			_ = w.Flush()
			_ = out.Sync()
			mu.Unlock()
			select {} // until the parent kills this process
		}
		if job.Times {
			start := time.Now().UnixNano()
			time.Sleep(5 * time.Millisecond)
			end := time.Now().UnixNano()
			mu.Lock()
			fmt.Fprintf(w, "times %d %d %d\n", d.ID(), start, end)
			mu.Unlock()
		}
		if d.Attempt() == 1 && slices.Contains(job.RetryPayloads, string(d.Payload())) {
			return rowactor.RetryAfter(job.RetryDelay)
		}
		return rowactor.Ack()
	}, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	for {
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		idle := time.Since(last)
		mu.Unlock()
		if job.StopFile != "" {
			if _, err := os.Stat(job.StopFile); err == nil || idle > 2*time.Minute {
				break // the parent found the table drained, or is gone
			}
		} else if idle > 3*time.Second {
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
	if job.Trace {
		for _, s := range spans.Ended() {
			if strings.HasPrefix(s.Name(), "process ") {
				fmt.Fprintf(w, "# span %s %s\n", s.SpanContext().TraceID(), s.Parent().SpanID())
			}
		}
	}
	if err := w.Flush(); err != nil {
		return 1
	}
	return 0
}

// lostLease says whether a child's line reports an ack refused because the row's lease
// ran out first (a 2 s lease whose extension the loaded machine did not run in time). The
// fenced settlement changed nothing: the row came back, and its next claim, here or in
// the other process, settles it; the counts then prove it was settled exactly once.
func lostLease(line string) bool {
	return strings.HasPrefix(line, "# ") && strings.HasSuffix(line, rowactor.ErrLeaseLost.Error())
}

// givenBack says whether a child's line reports a row given back unstarted while the
// broker ran: its workers all stayed busy (a stalled machine) with rows waiting, so the
// rows went back to the table for the next claim, here or in the other process.
func givenBack(line string) bool {
	var id int64
	var step, err string
	_, serr := fmt.Sscanf(line, "# %d %s %s", &id, &step, &err)
	return serr == nil && step == "release" && err == "<nil>"
}

// stopChildrenWhenDrained waits until h's table holds no unfinished row (none at all
// without processed_at, none with processed_at NULL with it), then creates stopFile, which
// ends the consumer children given it as StopFile: they shut down, letting their handlers
// and settlements in work finish, and write what they settled. A row finished is never
// claimed again, so children stopped then settle what children that waited for a quiet
// window would. After 90 s it creates the file anyway, and the test's counts tell what
// was left.
func stopChildrenWhenDrained(t *testing.T, h *harness, stopFile string) {
	t.Helper()
	q := "SELECT COUNT(*) FROM " + h.table.Name
	if h.table.ProcessedAt != "" {
		q += " WHERE " + h.table.ProcessedAt + " IS NULL"
	}
	for deadline := time.Now().Add(90 * time.Second); h.drv.count(t, h.d, q) != 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.WriteFile(stopFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTwoProcessesDeliverEveryRowOnce drains one table from two OS processes in every
// form each database serves across processes, and counts every row by id.
func TestTwoProcessesDeliverEveryRowOnce(t *testing.T) {
	t.Parallel()
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
				stop := filepath.Join(t.TempDir(), "stop")
				for i := range 2 {
					job := childJob{URL: drv.url(t, h.d), Table: h.table, Queue: h.queue, Out: filepath.Join(t.TempDir(), fmt.Sprintf("child%d.txt", i)), StopFile: stop}
					spec, _ := json.Marshal(job)
					cmd := exec.Command(exe, "-test.run=^$")
					cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
					cmd.Stderr = os.Stderr
					if err := cmd.Start(); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = cmd.Process.Kill() })
					procs = append(procs, cmd)
					outs = append(outs, job.Out)
				}
				for _, id := range h.publish(b, rows/2) {
					published[id] = true
				}
				stopChildrenWhenDrained(t, h, stop)
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
						if lostLease(sc.Text()) || givenBack(sc.Text()) {
							continue // not settled: the row is counted where it was acked
						}
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

// TestKilledConsumerRowsReturn kills a consumer process with SIGKILL while its handler
// holds a row, and checks the row comes back by the form's rule: at once and with no
// attempt spent (row lock), at once with the take's attempt spent (advisory), at lease
// expiry with the claim's attempt spent (lease).
func TestKilledConsumerRowsReturn(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			if drv.url == nil {
				continue
			}
			t.Run(drv.name+"/"+form.String(), func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, drv, form)
				b := h.broker()
				id := h.publish(b, 1)[0]
				exe, err := os.Executable()
				if err != nil {
					t.Fatal(err)
				}
				job := childJob{URL: drv.url(t, h.d), Table: h.table, Queue: h.queue, Out: filepath.Join(t.TempDir(), "held.txt"), Hold: true}
				spec, _ := json.Marshal(job)
				cmd := exec.Command(exe, "-test.run=^$")
				cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				defer cmd.Process.Kill()
				waitFor(t, func() bool {
					data, _ := os.ReadFile(job.Out)
					return len(data) > 0
				})
				if err := cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
				_ = cmd.Wait()
				killed := time.Now()
				h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
				s := h.waitSettled(1)[0]
				if s.ID != id || s.Err != nil {
					t.Fatalf("settlement %+v", s)
				}
				if want := attemptColumn(form, 1, 0); s.Attempt != want {
					t.Fatalf("redelivered with attempt %d, want %d", s.Attempt, want)
				}
				// Row lock and advisory rows return when the server ends the dead session;
				// a lease only when it expires (2 s after the claim, at the latest).
				t.Logf("returned %v after the kill", time.Since(killed).Round(time.Millisecond))
				if h.row(id).exists {
					t.Fatal("row still exists")
				}
			})
		}
	}
}

// TestTraceCrossesProcesses publishes inside a span in this process and consumes in
// another: the consumer's delivery span belongs to the publisher's trace, as the child of
// its producer span.
func TestTraceCrossesProcesses(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		if drv.url == nil {
			continue
		}
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			form := drv.forms[len(drv.forms)-1]
			h := newHarness(t, drv, form)
			tel := newTelemetry(t)
			b := h.broker(tel.options()...)
			ctx, request := tel.tp.Tracer("service").Start(context.Background(), "http request")
			if _, err := b.Publish(ctx, h.table, h.queue, []byte("traced")); err != nil {
				t.Fatal(err)
			}
			request.End()
			producer := tel.named("publish ")
			if len(producer) != 1 {
				t.Fatalf("%d producer spans", len(producer))
			}
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			stop := filepath.Join(t.TempDir(), "stop")
			job := childJob{URL: drv.url(t, h.d), Table: h.table, Queue: h.queue, Out: filepath.Join(t.TempDir(), "trace.txt"), Trace: true, StopFile: stop}
			spec, _ := json.Marshal(job)
			cmd := exec.Command(exe, "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			stopChildrenWhenDrained(t, h, stop)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("child: %v", err)
			}
			data, err := os.ReadFile(job.Out)
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("# span %s %s", request.SpanContext().TraceID(), producer[0].SpanContext().SpanID())
			if !strings.Contains(string(data), want) {
				t.Fatalf("the consumer process's span is not the producer's child in its trace:\nwant %q\ngot:\n%s", want, data)
			}
		})
	}
}

// TestFIFOAcrossProcesses drains one FIFO group from two OS processes with four workers
// each: every row is handled once, one at a time across both processes, in id order.
func TestFIFOAcrossProcesses(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			if drv.url == nil || form == rowactor.FormAdvisory {
				continue
			}
			t.Run(drv.name+"/"+form.String(), func(t *testing.T) {
				t.Parallel()
				const rows = 60
				h := newHarness(t, drv, form, func(t *rowactor.Table) { t.FIFO = true })
				b := h.broker()
				ids := h.publish(b, rows)
				exe, err := os.Executable()
				if err != nil {
					t.Fatal(err)
				}
				var procs []*exec.Cmd
				var outs []string
				stop := filepath.Join(t.TempDir(), "stop")
				for i := range 2 {
					job := childJob{URL: drv.url(t, h.d), Table: h.table, Queue: h.queue, Times: true,
						Out: filepath.Join(t.TempDir(), fmt.Sprintf("child%d.txt", i)), StopFile: stop}
					spec, _ := json.Marshal(job)
					cmd := exec.Command(exe, "-test.run=^$")
					cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
					cmd.Stderr = os.Stderr
					if err := cmd.Start(); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = cmd.Process.Kill() })
					procs = append(procs, cmd)
					outs = append(outs, job.Out)
				}
				stopChildrenWhenDrained(t, h, stop)
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
				type handling struct{ id, start, end int64 }
				var hs []handling
				acked := map[int64]int{}
				perChild := make([]int, len(outs))
				for i, path := range outs {
					data, err := os.ReadFile(path)
					if err != nil {
						t.Fatal(err)
					}
					for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
						var x handling
						var id int64
						switch {
						case line == "":
						case strings.HasPrefix(line, "times "):
							if _, err := fmt.Sscanf(line, "times %d %d %d", &x.id, &x.start, &x.end); err != nil {
								t.Fatalf("child %d reported %q", i, line)
							}
							hs = append(hs, x)
							perChild[i]++
						default:
							if _, err := fmt.Sscanf(line, "%d", &id); err != nil {
								t.Fatalf("child %d reported %q", i, line)
							}
							acked[id]++
						}
					}
				}
				slices.SortFunc(hs, func(a, b handling) int { return cmp.Compare(a.start, b.start) })
				for i := 1; i < len(hs); i++ {
					if hs[i].start < hs[i-1].end {
						t.Fatalf("row %d started while row %d was in work", hs[i].id, hs[i-1].id)
					}
					if hs[i].id < hs[i-1].id {
						t.Fatalf("row %d handled after row %d", hs[i].id, hs[i-1].id)
					}
				}
				for _, id := range ids {
					if acked[id] != 1 {
						t.Errorf("row %d settled %d times", id, acked[id])
					}
				}
				if len(hs) != rows {
					t.Errorf("%d handlings for %d rows", len(hs), rows)
				}
				t.Logf("rows per process: %v", perChild)
			})
		}
	}
}
