package outbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/outbox"
)

// childEnv carries a relay process's assignment from the parent test.
const childEnv = "ROWACTOR_OUTBOX_CHILD"

type childJob struct {
	DB         string
	OutboxAt   string
	ConsumerAt string
	Outbox     outbox.Table
	Queue      rowactor.Table
	// DieAfter is the record after whose send the child reports "sent" and waits to be
	// killed, before it could stamp the record.
	DieAfter int64
}

// runChild is a relay process: it relays the outbox into the queue and, once its sink
// took record DieAfter, says so on stdout and hangs until it is killed.
func runChild(spec string) int {
	var job childJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	var db database
	for _, d := range databases {
		if d.name == job.DB {
			db = d
		}
	}
	ctx := context.Background()
	obD, err := db.openAt(ctx, job.OutboxAt)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	conD, err := db.openAt(ctx, job.ConsumerAt)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	ob, err := outbox.New(ctx, obD, job.Outbox)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	b, err := rowactor.New(conD)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	qs, err := outbox.NewQueueSink(b, job.Queue, "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	_, err = ob.StartRelay(outbox.SinkFunc(func(ctx context.Context, r outbox.Record) error {
		if err := qs.Send(ctx, r); err != nil {
			return err
		}
		if r.ID == job.DieAfter {
			fmt.Println("sent")
			select {} // killed here, between the send and the stamp
		}
		return nil
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	select {}
}

// A relay process killed (SIGKILL) after its sink took a record and before it stamped
// it leaves the record unsent though delivered; a relay started after it sends every
// unprocessed record again, and the consumer's dedupe makes each effect once.
func testProcessKilled(t *testing.T, e *env) {
	ob := e.newOutbox()
	q := e.queueTable()
	ids := []int64{e.record(ob, "orders", "a", true), e.record(ob, "orders", "b", true), e.record(ob, "orders", "c", true)}

	spec, err := json.Marshal(childJob{DB: e.db.name, OutboxAt: e.obAt, ConsumerAt: e.conAt,
		Outbox: ob.Table(), Queue: q, DieAfter: ids[1]})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	said := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		said <- strings.TrimSpace(line)
	}()
	select {
	case line := <-said:
		if line != "sent" {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("the relay process said %q, want \"sent\"", line)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("the relay process never sent the second record")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	rows := e.rows(ob)
	if len(rows) != 3 || !rows[0].sent || rows[1].sent || rows[2].sent {
		t.Fatalf("after the kill: outbox rows %+v, want only the first stamped sent", rows)
	}
	if n := e.count(e.conD, "SELECT COUNT(*) FROM "+q.Name); n != 2 {
		t.Fatalf("after the kill: %d queue rows, want 2 (the second record was delivered, not stamped)", n)
	}

	b := e.broker(ob)
	qs, err := outbox.NewQueueSink(b, q, "")
	if err != nil {
		t.Fatal(err)
	}
	r, err := ob.StartRelay(qs)
	if err != nil {
		t.Fatal(err)
	}
	stopAtCleanup(t, r)
	eventually(t, 10*time.Second, "the relay started after the kill sends every unprocessed record", func() bool { return r.Sent() == 3 })
	c := newConsumer(e, nil)
	c.subscribe(b, ob, q, 2)
	eventually(t, 20*time.Second, "every record is processed and the queue is empty", func() bool {
		for _, row := range e.rows(ob) {
			if !row.sent || !row.processed {
				return false
			}
		}
		return e.count(e.conD, "SELECT COUNT(*) FROM "+q.Name) == 0
	})
	got := c.effectsOf()
	if len(got) != 3 || got[ids[0]] != 1 || got[ids[1]] != 1 || got[ids[2]] != 1 {
		t.Fatalf("effects per record %v, want one for each of %v", got, ids)
	}
}
