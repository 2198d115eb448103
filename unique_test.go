package rowactor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

func withUniqueKey(t *rowactor.Table) { t.UniqueKey = "unique_key" }

func init() {
	scenarios = append(scenarios,
		scenario{
			name:   "a unique key is published once while a row holds it, and again once the row is deleted",
			shapes: []tableShape{withUniqueKey},
			run:    uniqueScenario,
		},
		scenario{
			name:   "publishes of one unique key racing from two brokers leave one row",
			shapes: []tableShape{withUniqueKey},
			run:    uniqueRaceScenario,
		},
		scenario{
			name:   "a finished row kept with processed_at holds its key, unless ClearUniqueKeyAtAck clears it at the ack",
			shapes: []tableShape{withUniqueKey, withProcessedAt},
			run:    uniqueKeptScenario,
		},
		scenario{
			name:   "a move to a dead-letter table frees the unique key and writes it there as NULL",
			shapes: []tableShape{withUniqueKey, withoutGroup},
			run:    uniqueDeadLetterScenario,
		},
		scenario{
			name: "a unique publish into a table without the column, or with an empty key, is refused before anything is written",
			run: func(t *testing.T, h *harness, _ rowactor.Form) {
				b := h.broker()
				for _, key := range []string{"k", ""} {
					tb := h.table
					if key == "" {
						tb.UniqueKey = "unique_key"
					}
					_, err := b.Publish(context.Background(), tb, h.queue, []byte("x"), rowactor.Unique(key))
					var ce *rowactor.ConfigError
					if !errors.As(err, &ce) || ce.Option != "Unique" {
						t.Fatalf("Publish with Unique(%q): %v", key, err)
					}
				}
				if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != 0 {
					t.Fatalf("%d rows written", n)
				}
				kept := h.table
				kept.Name, kept.ClearUniqueKeyAtAck = kept.Name+"_nokey", true
				if _, err := rowactor.Schema(h.d, kept); !errors.Is(err, rowactor.ErrConfig) {
					t.Fatalf("Schema with ClearUniqueKeyAtAck and no unique key: %v", err)
				}
			},
		},
	)
}

func (h *harness) publishKey(b *rowactor.Broker, key string) int64 {
	h.t.Helper()
	id, err := b.Publish(context.Background(), h.table, h.queue, []byte("job-"+key), rowactor.Unique(key))
	if err != nil {
		h.t.Fatalf("Publish with Unique(%q): %v", key, err)
	}
	return id
}

func (h *harness) countKey(key string) int {
	h.t.Helper()
	return h.drv.count(h.t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE unique_key = ?", h.table.Name), key)
}

func uniqueScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	first := h.publishKey(b, "order-1")
	if again := h.publishKey(b, "order-1"); again != first {
		t.Fatalf("the second publish of a held key returned %d, want the holder %d", again, first)
	}
	other := h.publishKey(b, "order-2")
	plain := h.publish(b, 2) // no key: NULLs never conflict
	if other == first || plain[0] == plain[1] {
		t.Fatalf("ids %d %d %v", first, other, plain)
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != 4 {
		t.Fatalf("%d rows, want 4", n)
	}
	if h.countKey("order-1") != 1 {
		t.Fatal("the key is not in its row's unique_key column")
	}
	// Deleted by its ack, the row frees its key.
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	h.waitSettled(4)
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != 0 {
		t.Fatalf("%d rows left after the acks", n)
	}
	if again := h.publishKey(b, "order-1"); again == first {
		t.Fatalf("a key freed by the row's deletion returned the deleted row's id %d", again)
	}
	h.waitSettled(1)
}

func uniqueRaceScenario(t *testing.T, h *harness, _ rowactor.Form) {
	brokers := []*rowactor.Broker{h.broker(), h.second()}
	var wg sync.WaitGroup
	ids := make(chan int64, 16)
	start := make(chan struct{})
	for _, b := range brokers {
		for range 8 {
			wg.Go(func() {
				<-start
				id, err := b.Publish(context.Background(), h.table, h.queue, []byte("race"), rowactor.Unique("race"))
				if err != nil {
					t.Error(err)
					return
				}
				ids <- id
			})
		}
	}
	close(start)
	wg.Wait()
	close(ids)
	var first int64
	n := 0
	for id := range ids {
		if n == 0 {
			first = id
		} else if id != first {
			t.Fatalf("racing publishes of one key returned ids %d and %d", first, id)
		}
		n++
	}
	if n != 16 {
		t.Fatalf("%d of 16 publishes returned", n)
	}
	if c := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); c != 1 {
		t.Fatalf("%d rows after 16 racing publishes of one key", c)
	}
}

func uniqueKeptScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	first := h.publishKey(b, "report-7")
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	h.waitSettled(1)
	if st := h.row(first); !st.exists || st.processedAt == nil {
		t.Fatalf("row after its ack: %+v", st)
	}
	if again := h.publishKey(b, "report-7"); again != first {
		t.Fatalf("a finished row's key published again: %d, want the finished row %d", again, first)
	}
	h.quiet(200 * time.Millisecond) // nothing new to handle

	// The same with ClearUniqueKeyAtAck, on a table of its own.
	cleared := *h
	cleared.table.Name += "_cleared"
	cleared.table.ClearUniqueKeyAtAck = true
	cleared.createTable(cleared.table)
	b2 := cleared.broker()
	id := cleared.publishKey(b2, "report-7")
	cleared.subscribe(b2, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	cleared.waitSettled(1)
	if cleared.countKey("report-7") != 0 {
		t.Fatal("the ack kept the key although ClearUniqueKeyAtAck")
	}
	if again := cleared.publishKey(b2, "report-7"); again == id {
		t.Fatalf("a key cleared at the ack returned the finished row %d", again)
	}
	cleared.waitSettled(1)
}

func uniqueDeadLetterScenario(t *testing.T, h *harness, _ rowactor.Form) {
	dead := h.table
	dead.Name = h.table.Name + "_dead"
	h.createTable(dead) // with its own unique index: two dead letters of one key must both fit
	b := h.broker()
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Fail(errors.New("no")) },
		rowactor.MaxAttempts(1), rowactor.DeadLetterTable(dead.Name))
	for round := range 2 {
		id := h.publishKey(b, "k")
		if s := h.waitSettled(1)[0]; s.Step != "dead_letter" || s.Err != nil {
			t.Fatalf("round %d: settlement %+v", round, s)
		}
		if h.row(id).exists {
			t.Fatalf("round %d: row still in the queue table", round)
		}
		if !h.drv.state(t, h.d, dead, id).exists {
			t.Fatalf("round %d: row %d not in the dead-letter table", round, id)
		}
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE unique_key IS NULL", dead.Name)); n != 2 {
		t.Fatalf("%d dead letters with a NULL key, want 2", n)
	}
}

// runPublisherChild publishes job.UniqueKey from 8 goroutines at job.StartAt and writes
// every id Publish returned, a line each.
func runPublisherChild(job childJob, out *os.File) int {
	ctx := context.Background()
	b, err := rowactor.Open(ctx, job.URL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	time.Sleep(time.Until(job.StartAt))
	ids := make([]int64, 8)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			ids[i], errs[i] = b.Publish(ctx, job.Table, job.Queue, []byte("race"), rowactor.Unique(job.UniqueKey))
		})
	}
	wg.Wait()
	code := 0
	for i := range ids {
		if errs[i] != nil {
			fmt.Fprintln(os.Stderr, "child: publish:", errs[i])
			code = 1
		}
		fmt.Fprintf(out, "%d\n", ids[i])
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := b.Shutdown(sctx); err != nil {
		fmt.Fprintln(os.Stderr, "child: shutdown:", err)
		code = 1
	}
	return code
}

// TestUniquePublishRacesAcrossProcesses: two OS processes, 8 goroutines each, publish one
// unique key at the same instant; every publish returns the same id and the table holds
// one row, on every database.
func TestUniquePublishRacesAcrossProcesses(t *testing.T) {
	for _, drv := range drivers {
		if drv.url == nil {
			continue
		}
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease, withUniqueKey)
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now().Add(2 * time.Second) // both processes up and connected by then
			var procs []*exec.Cmd
			var outs []string
			for i := range 2 {
				job := childJob{URL: drv.url(t, h.d), Table: h.table, Queue: h.queue, UniqueKey: "race-key", StartAt: start,
					Out: filepath.Join(t.TempDir(), fmt.Sprintf("publisher%d.txt", i))}
				spec, _ := json.Marshal(job)
				cmd := exec.Command(exe, "-test.run=^$")
				cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				procs, outs = append(procs, cmd), append(outs, job.Out)
			}
			for _, cmd := range procs {
				if err := cmd.Wait(); err != nil {
					t.Fatalf("publisher process: %v", err)
				}
			}
			ids := map[string]int{}
			for _, path := range outs {
				data, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				for _, line := range strings.Fields(string(data)) {
					ids[line]++
				}
			}
			if len(ids) != 1 || ids[fmt.Sprint(h.drv.count(t, h.d, "SELECT max(id) FROM "+h.table.Name))] != 16 {
				t.Fatalf("16 publishes of one key from two processes returned ids %v", ids)
			}
			if n := h.drv.count(t, h.d, "SELECT count(*) FROM "+h.table.Name); n != 1 {
				t.Fatalf("%d rows after 16 racing publishes of one key from two processes", n)
			}
		})
	}
}
