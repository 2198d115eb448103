package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// serve checks each TABLE's description against its live table before serving ("so a
// wrong column fails the command rather than every page"), but not the dead-letter table
// of -dead-letter-table: a typo in its name (or a dead-letter table lacking a described
// column) starts the dashboard, and every render of the overview then shows the error in
// place of the queue's numbers.
func TestReview2ServeChecksDeadLetterTable(t *testing.T) {
	f := newFixture(t, databases[0])
	tb := rowactor.Table{ID: "id", Payload: "payload", Attempt: "attempt", ProcessedAt: "processed_at", Error: "error"}
	tb.Name = f.tableName("serve_r2_")
	f.create(tb)
	f.publish(tb, "", "{}")
	args := append([]string{"serve", "-dsn", f.dsn, "-addr", "127.0.0.1:0", "-dead-letter-table", tb.Name + "=" + tb.Name + "_deda"}, columnFlags(tb)...)
	args = append(args, tb.Name)
	var stdout, stderr syncBuffer
	code := make(chan int, 1)
	go func() { code <- run(args, &stdout, &stderr) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case c := <-code:
			if c != exitFailed || !strings.Contains(stderr.String(), tb.Name+"_deda") {
				t.Errorf("exit %d, stderr %q: want %d naming the dead-letter table", c, stderr.String(), exitFailed)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
		if strings.Contains(stdout.String(), "http://") || time.Now().After(deadline) {
			if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			<-code
			t.Fatalf("serve with -dead-letter-table naming a table that does not exist (%s_deda) started serving: %s", tb.Name, stdout.String())
		}
	}
}
