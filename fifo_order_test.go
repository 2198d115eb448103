package rowactor_test

import (
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

	"github.com/rowactor/rowactor"
)

// FIFO order across retries: a group's head is its unfinished row with the lowest id, and
// a head waiting for its retry_after holds its whole group (other groups go on), as SQS
// FIFO keeps a message group's order across retries.
// handling is one delivery as a handler saw it.
type handling struct {
	id         int64
	queue      string
	attempt    int
	start, end time.Time
}

// handlings records every delivery of a scenario, with when it started and ended, and the
// most handled at once.
type handlings struct {
	mu sync.Mutex
	hs []handling
	p  peak
}

// handler records each delivery around outcome; it takes 10 ms, long enough for a second
// delivery of the group to overlap, were one handed out.
func (r *handlings) handler(outcome func(d *rowactor.Delivery) rowactor.Outcome) rowactor.Handler {
	return func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		r.p.enter()
		defer r.p.leave()
		x := handling{id: d.ID(), queue: d.Queue(), attempt: d.Attempt(), start: time.Now()}
		time.Sleep(10 * time.Millisecond)
		o := outcome(d)
		x.end = time.Now()
		r.mu.Lock()
		r.hs = append(r.hs, x)
		r.mu.Unlock()
		return o
	}
}

// of returns the handlings of one queue in the order they started.
func (r *handlings) of(queue string) []handling {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []handling
	for _, x := range r.hs {
		if x.queue == queue {
			out = append(out, x)
		}
	}
	slices.SortFunc(out, func(a, b handling) int { return a.start.Compare(b.start) })
	return out
}

func handledIDs(hs []handling) []int64 {
	out := make([]int64, len(hs))
	for i, x := range hs {
		out[i] = x.id
	}
	return out
}

// oneAtATime fails unless each handling started after the one before it ended.
func oneAtATime(t *testing.T, hs []handling) {
	t.Helper()
	for i := 1; i < len(hs); i++ {
		if hs[i].start.Before(hs[i-1].end) {
			t.Fatalf("row %d (attempt %d) started at %v, before row %d (attempt %d) ended at %v",
				hs[i].id, hs[i].attempt, hs[i].start, hs[i-1].id, hs[i-1].attempt, hs[i-1].end)
		}
	}
}

// subscribeFIFO subscribes handler to queue on two brokers (two processes, as far as the
// table can tell) with Workers(4) each, and returns the first.
func subscribeFIFO(h *harness, handler rowactor.Handler, queues ...string) *rowactor.Broker {
	h.t.Helper()
	b1, b2 := h.broker(), h.second()
	for _, b := range []*rowactor.Broker{b1, b2} {
		for _, q := range queues {
			if _, err := b.Subscribe(context.Background(), h.table, q, handler,
				rowactor.Workers(4), rowactor.PollInterval(50*time.Millisecond)); err != nil {
				h.t.Fatalf("Subscribe %s: %v", q, err)
			}
		}
	}
	return b1
}

func publishTo(h *harness, b *rowactor.Broker, queue string, payloads ...string) []int64 {
	h.t.Helper()
	ids := make([]int64, len(payloads))
	for i, p := range payloads {
		id, err := b.Publish(context.Background(), h.table, queue, []byte(p))
		if err != nil {
			h.t.Fatalf("Publish: %v", err)
		}
		ids[i] = id
	}
	return ids
}

// waitStep waits for the settlement of one row's step; settlements of other rows that
// arrive first are returned too.
func waitStep(h *harness, id int64, step string) (rowactor.Settlement, []rowactor.Settlement) {
	h.t.Helper()
	var others []rowactor.Settlement
	deadline := time.After(15 * time.Second)
	for {
		select {
		case s := <-h.settled:
			if s.ID == id && s.Step == step {
				return s, others
			}
			others = append(others, s)
		case <-deadline:
			h.t.Fatalf("no %s settlement of row %d in 15 s; saw %+v\nlogs:\n%s", step, id, others, h.logs.String())
		}
	}
}

// fifoRetryDelay is long enough for the test to read the retried head while it waits,
// on a machine the suite loads (it read a head already redelivered at 300 ms).
const fifoRetryDelay = time.Second

var fifoOrderScenarios = []scenario{
	{name: "fifo retry after keeps the head and its group waits for it", forms: fifoForms,
		shapes: []tableShape{withFIFO, withProcessedAt},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			var r handlings
			b := subscribeFIFO(h, r.handler(func(d *rowactor.Delivery) rowactor.Outcome {
				if string(d.Payload()) == "deposit-1" && d.Attempt() == 1 {
					return rowactor.RetryAfter(fifoRetryDelay)
				}
				return rowactor.Ack()
			}), h.queue)
			published := time.Now()
			ids := publishTo(h, b, h.queue, "deposit-1", "withdraw-2", "withdraw-3")
			retried, early := waitStep(h, ids[0], "retry_after")
			if retried.Err != nil || len(early) != 0 {
				t.Fatalf("the head's retry %+v; settled before it: %+v", retried, early)
			}
			// The head waits in the table: delayed, counted, unleased, unprocessed.
			head := h.row(ids[0])
			if head.retryAfter == nil || head.lockedUntil != nil || head.processedAt != nil || head.attempt != attemptColumn(form, 1, 1) {
				t.Fatalf("the retried head: %+v", head)
			}
			// Set at the retry's settlement: after the publish, before this read.
			if ra := *head.retryAfter; ra.Before(published.Add(fifoRetryDelay-time.Millisecond)) || ra.After(time.Now().Add(fifoRetryDelay)) {
				t.Fatalf("the head's retry_after %v, want its retry's time plus %v (published %v, read %v)", ra, fifoRetryDelay, published, time.Now())
			}
			ids = append(ids, publishTo(h, b, h.queue, "withdraw-4", "withdraw-5")...)
			for _, s := range h.waitSettled(len(ids)) {
				if s.Err != nil || s.Step != "ack" {
					t.Fatalf("settlement %+v", s)
				}
			}
			h.quiet(200 * time.Millisecond)

			hs := r.of(h.queue)
			if got, want := handledIDs(hs), append([]int64{ids[0]}, ids...); !slices.Equal(got, want) {
				t.Fatalf("handled in order %v, want %v (deposit-1 twice, then the rows behind it)", got, want)
			}
			if hs[0].attempt != 1 || hs[1].attempt != 2 {
				t.Fatalf("the head's deliveries reported attempts %d, %d; want 1, 2", hs[0].attempt, hs[1].attempt)
			}
			oneAtATime(t, hs) // withdraw-2 starts only after deposit-1's second delivery ended
			if hs[1].start.Before(head.retryAfter.Add(-time.Millisecond)) {
				t.Fatalf("the head came back at %v, before its retry_after %v", hs[1].start, head.retryAfter)
			}
			if m := r.p.max.Load(); m != 1 {
				t.Fatalf("%d rows of one FIFO group handled at once, want 1", m)
			}
			processedInOrder(t, h, ids)
			if st := h.row(ids[0]); st.attempt != attemptColumn(form, 2, 1) || st.retryAfter == nil || !st.retryAfter.Equal(*head.retryAfter) {
				t.Fatalf("the head after its ack: %+v, want attempt %d and retry_after %v", st, attemptColumn(form, 2, 1), head.retryAfter)
			}
			for _, id := range ids[1:] {
				if st := h.row(id); st.attempt != attemptColumn(form, 1, 0) || st.retryAfter != nil {
					t.Fatalf("row %d behind the head: %+v, want one delivery and no retry_after", id, st)
				}
			}
		}},
	{name: "fifo head retried after a delay until it moves to the dead letter, then the next row is the head", forms: fifoForms,
		shapes: []tableShape{withFIFO, withProcessedAt},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			var r handlings
			handler := r.handler(func(d *rowactor.Delivery) rowactor.Outcome {
				if string(d.Payload()) == "deposit-1" {
					return rowactor.RetryAfter(100 * time.Millisecond)
				}
				return rowactor.Ack()
			})
			b1, b2 := h.broker(), h.second()
			for _, b := range []*rowactor.Broker{b1, b2} {
				h.subscribe(b, handler, rowactor.Workers(4), rowactor.MaxAttempts(2), rowactor.DeadLetterGroup("dead"))
			}
			ids := publishTo(h, b1, h.queue, "deposit-1", "withdraw-2", "withdraw-3")
			steps := map[int64][]string{}
			// By attempt: two brokers' hooks may report the head's two settlements in
			// either order.
			for _, s := range h.waitDeliveries(4) {
				if s.Err != nil {
					t.Fatalf("settlement %+v", s)
				}
				steps[s.ID] = append(steps[s.ID], s.Step)
			}
			h.quiet(200 * time.Millisecond)
			if got := steps[ids[0]]; !slices.Equal(got, []string{"retry_after", "dead_letter"}) {
				t.Fatalf("the failing head settled %v", got)
			}
			hs := r.of(h.queue)
			if got, want := handledIDs(hs), []int64{ids[0], ids[0], ids[1], ids[2]}; !slices.Equal(got, want) {
				t.Fatalf("handled in order %v, want %v", got, want)
			}
			oneAtATime(t, hs)
			if st := h.row(ids[0]); !st.exists || st.group != "dead" || st.processedAt != nil || st.lockedUntil != nil ||
				st.attempt != attemptColumn(form, 2, 1) {
				t.Fatalf("the dead-lettered head: %+v", st)
			}
			processedInOrder(t, h, ids[1:])
		}},
	{name: "fifo group goes on while another group's head waits for its retry after", forms: fifoForms,
		shapes: []tableShape{withFIFO, withProcessedAt},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			const other = "h"
			var r handlings
			b := subscribeFIFO(h, r.handler(func(d *rowactor.Delivery) rowactor.Outcome {
				if string(d.Payload()) == "g-1" && d.Attempt() == 1 {
					// Long enough for h's three rows under a loaded CI machine (1 s was
					// not: h finished 6 ms after g's head came back).
					return rowactor.RetryAfter(2 * time.Second)
				}
				return rowactor.Ack()
			}), h.queue, other)
			g := publishTo(h, b, h.queue, "g-1", "g-2", "g-3")
			if s, early := waitStep(h, g[0], "retry_after"); s.Err != nil || len(early) != 0 {
				t.Fatalf("g's head retry %+v; settled before it: %+v", s, early)
			}
			o := publishTo(h, b, other, "h-1", "h-2", "h-3")
			for _, s := range h.waitSettled(len(g) + len(o)) {
				if s.Err != nil || s.Step != "ack" {
					t.Fatalf("settlement %+v", s)
				}
			}
			h.quiet(200 * time.Millisecond)
			gs, hs := r.of(h.queue), r.of(other)
			if got, want := handledIDs(gs), []int64{g[0], g[0], g[1], g[2]}; !slices.Equal(got, want) {
				t.Fatalf("group g handled in order %v, want %v", got, want)
			}
			if got := handledIDs(hs); !slices.Equal(got, o) {
				t.Fatalf("group h handled in order %v, want %v", got, o)
			}
			oneAtATime(t, gs)
			oneAtATime(t, hs)
			if last := hs[len(hs)-1]; !last.end.Before(gs[1].start) {
				t.Fatalf("group h finished at %v, after g's head came back at %v: h waited for g", last.end, gs[1].start)
			}
			processedInOrder(t, h, g)
			processedInOrder(t, h, o)
			if st := h.row(g[0]); st.retryAfter == nil || st.attempt != attemptColumn(form, 2, 1) {
				t.Fatalf("g's retried head: %+v", st)
			}
			for _, id := range append(g[1:], o...) {
				if st := h.row(id); st.retryAfter != nil || st.attempt != attemptColumn(form, 1, 0) {
					t.Fatalf("row %d: %+v, want one delivery and no retry_after", id, st)
				}
			}
		}},
	{name: "fifo order holds across two processes when heads retry after a delay", forms: fifoForms,
		shapes: []tableShape{withFIFO, withProcessedAt},
		run:    fifoOrderAcrossProcesses},
}

// fifoOrderAcrossProcesses drains one FIFO group from two OS processes with four workers
// each, while two of its rows answer RetryAfter on their first delivery: every row is
// handled one at a time across both processes, in id order, a retried row twice in a row.
func fifoOrderAcrossProcesses(t *testing.T, h *harness, form rowactor.Form) {
	if h.drv.url == nil {
		t.Skip("the driver names no URL another process can open")
	}
	const rows, delay = 30, 300 * time.Millisecond
	b := h.broker()
	payload := func(i int) string { return fmt.Sprintf("job-%d", i) }
	retry := []string{payload(0), payload(12)}
	var ids []int64
	for i := range rows / 2 {
		ids = append(ids, publishTo(h, b, h.queue, payload(i))...)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var procs []*exec.Cmd
	var outs []string
	stop := filepath.Join(t.TempDir(), "stop")
	for i := range 2 {
		job := childJob{URL: h.drv.url(t, h.d), Table: h.table, Queue: h.queue, Times: true,
			RetryPayloads: retry, RetryDelay: delay, StopFile: stop,
			Out: filepath.Join(t.TempDir(), fmt.Sprintf("child%d.txt", i))}
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
	// The rest are published while the children work: some before the first head's retry
	// is due, some after.
	for i := rows / 2; i < rows; i++ {
		ids = append(ids, publishTo(h, b, h.queue, payload(i))...)
		time.Sleep(10 * time.Millisecond)
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
	type timed struct{ id, start, end int64 }
	var hs []timed
	acked, retried := map[int64]int{}, map[int64]int{}
	for i, path := range outs {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			var x timed
			var id int64
			var step string
			switch {
			case line == "":
			case strings.HasPrefix(line, "times "):
				if _, err := fmt.Sscanf(line, "times %d %d %d", &x.id, &x.start, &x.end); err != nil {
					t.Fatalf("child %d reported %q", i, line)
				}
				hs = append(hs, x)
			case strings.HasPrefix(line, "# "):
				if _, err := fmt.Sscanf(line, "# %d %s <nil>", &id, &step); err != nil || step != "retry_after" {
					t.Fatalf("child %d reported %q", i, line)
				}
				retried[id]++
			default:
				if _, err := fmt.Sscanf(line, "%d", &id); err != nil {
					t.Fatalf("child %d reported %q", i, line)
				}
				acked[id]++
			}
		}
	}
	slices.SortFunc(hs, func(a, b timed) int { return cmp.Compare(a.start, b.start) })
	var order []int64
	for i, x := range hs {
		order = append(order, x.id)
		if i == 0 {
			continue
		}
		if x.start < hs[i-1].end {
			t.Fatalf("row %d started while row %d was in work", x.id, hs[i-1].id)
		}
		if x.id == hs[i-1].id && time.Duration(x.start-hs[i-1].end) < delay-time.Millisecond {
			t.Fatalf("row %d came back %v after its retry, before its delay of %v", x.id, time.Duration(x.start-hs[i-1].end), delay)
		}
	}
	var want []int64
	for i, id := range ids {
		want = append(want, id)
		if slices.Contains(retry, payload(i)) {
			want = append(want, id)
		}
	}
	if !slices.Equal(order, want) {
		t.Fatalf("handled in order %v, want %v (rows %v twice)", order, want, retry)
	}
	for i, id := range ids {
		again := slices.Contains(retry, payload(i))
		if acked[id] != 1 || (retried[id] == 1) != again {
			t.Errorf("row %d: %d acks, %d retries", id, acked[id], retried[id])
		}
		st := h.row(id)
		if again && (st.retryAfter == nil || st.attempt != attemptColumn(form, 2, 1)) ||
			!again && (st.retryAfter != nil || st.attempt != attemptColumn(form, 1, 0)) {
			t.Errorf("row %d (retried: %v): %+v", id, again, st)
		}
	}
	processedInOrder(t, h, ids)
}
