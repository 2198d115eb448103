package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rowactor/rowactor"
)

// consumerEnv carries a consumer process's assignment from the parent: the binary re-runs
// itself with it set.
const consumerEnv = "ROWACTOR_CHAOS_CONSUMER"

type consumerSpec struct {
	URL     string
	Table   rowactor.Table
	Queue   string
	Out     string
	Workers int
	Lease   time.Duration // 0 outside the lease form
	Poll    time.Duration
	Work    time.Duration
}

// The consumer's file has one line per event, each written with a single write(2) as it
// happens, so a SIGKILL loses at most what had not been written yet (the parent also
// tolerates a truncated last line):
//
//	d <id> <attempt> <ns>                                 the handler started on a delivery
//	a <id> <attempt> <ns>                                 an Ack settled (Settlement.Err == nil)
//	e <id> <attempt> <ns> <step> released=<bool> <error>  any other settlement: an error, a lost lease, a release
//	s <message>                                           a start-up retry (Open or Subscribe failed)
//	x <report>                                            Shutdown returned
//
// <ns> is the wall clock in Unix nanoseconds: the parent orders one row's events from
// several processes by it.
type lineWriter struct {
	mu sync.Mutex
	f  *os.File
}

func (w *lineWriter) printf(format string, args ...any) {
	// An error text may span lines (errors.Join): keep one event per line.
	line := strings.ReplaceAll(fmt.Sprintf(format, args...), "\n", " | ") + "\n"
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.f.WriteString(line)
}

// runConsumer is a consumer process: it subscribes and acks every row (after a short
// random sleep) until the parent sends SIGTERM, then shuts the broker down.
func runConsumer(specText string) int {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	var spec consumerSpec
	if err := json.Unmarshal([]byte(specText), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 2
	}
	f, err := os.OpenFile(spec.Out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 2
	}
	defer f.Close()
	w := &lineWriter{f: f}

	// Exit if the parent dies without telling us (its SIGKILL, a crash).
	parent := os.Getppid()
	orphaned := make(chan struct{})
	go func() {
		for os.Getppid() == parent {
			time.Sleep(500 * time.Millisecond)
		}
		close(orphaned)
	}()

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	onSettled := func(s rowactor.Settlement) {
		if s.Err == nil && s.Step == "ack" {
			w.printf("a %d %d %d", s.ID, s.Attempt, time.Now().UnixNano())
			return
		}
		errText := "<nil>"
		if s.Err != nil {
			errText = s.Err.Error()
		}
		w.printf("e %d %d %d %s released=%v %s", s.ID, s.Attempt, time.Now().UnixNano(), s.Step, s.Released, errText)
	}
	handler := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		w.printf("d %d %d %d", d.ID(), d.Attempt(), time.Now().UnixNano())
		if spec.Work > 0 {
			t := time.NewTimer(rand.N(spec.Work + 1))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		return rowactor.Ack()
	}
	opts := []rowactor.SubscribeOption{rowactor.Workers(spec.Workers), rowactor.PollInterval(spec.Poll)}
	if spec.Lease > 0 {
		opts = append(opts, rowactor.Lease(spec.Lease))
	}

	// The parent may kill this process's sessions while it starts: retry Open and
	// Subscribe (the parent counts a consumer that gives up as an unexpected exit).
	ctx := context.Background()
	var b *rowactor.Broker
	for try := 1; ; try++ {
		b, err = rowactor.Open(ctx, spec.URL, rowactor.WithLogger(log), rowactor.WithOnSettled(onSettled))
		if err == nil {
			if _, err = b.Subscribe(ctx, spec.Table, spec.Queue, handler, opts...); err == nil {
				break
			}
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, _ = b.Shutdown(sctx)
			cancel()
		}
		w.printf("s start-up try %d: %v", try, err)
		if try == 20 {
			fmt.Fprintln(os.Stderr, "consumer: giving up:", err)
			return 2
		}
		time.Sleep(100 * time.Millisecond)
	}

	select {
	case <-stop:
	case <-orphaned:
		return 3
	}
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	rep, err := b.Shutdown(sctx)
	w.printf("x drained=%v released=%d connections_closed=%d err=%v", rep.Drained, rep.Released, rep.ConnectionsClosed, err)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer: shutdown:", err)
		return 1
	}
	return 0
}
