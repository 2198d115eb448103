//go:build serverrestart

// The server restart test stops the database server under running subscriptions, so it
// cannot share the servers with the parallel suite: scripts/test.sh runs it alone, after
// the suite, with -tags serverrestart.

package rowactor_test

import (
	"context"
	"log/slog"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// TestServerRestart stops the database server while one broker per form drains a table,
// starts it again, and counts every row: each is processed, settled exactly once, and
// was handled again only when the form's rule returns it (the claims counted in attempt
// cover every handling). The brokers are never restarted: their claimers back off while
// the server is away (the log names a connection fault) and claim again once it is back.
func TestServerRestart(t *testing.T) {
	for _, c := range []struct{ driver, server string }{{"postgres", "postgres"}, {"mysql", "mariadb"}} {
		t.Run(c.driver, func(t *testing.T) {
			drv := driverNamed(t, c.driver)
			const rows = 600
			type lane struct {
				h       *harness
				b       *rowactor.Broker
				ids     []int64
				before  map[int64]int // attempt as published
				handled sync.Map      // id -> *atomic.Int32
				book    *ackBook
				mu      sync.Mutex
				logs    *syncBuffer
			}
			var lanes []*lane
			var total atomic.Int64
			for _, form := range drv.forms {
				l := &lane{h: newHarness(t, drv, form, withProcessedAt), before: map[int64]int{}, book: newAckBook(), logs: &syncBuffer{}}
				l.b = l.h.broker(rowactor.WithLogger(slog.New(slog.NewTextHandler(l.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))
				l.ids = l.h.publish(l.b, rows)
				for _, id := range l.ids {
					l.before[id] = l.h.row(id).attempt
				}
				stop := make(chan struct{})
				t.Cleanup(func() { close(stop) })
				go func() {
					for {
						select {
						case s := <-l.h.settled:
							l.mu.Lock()
							l.book.add(s)
							l.mu.Unlock()
						case <-stop:
							return
						}
					}
				}()
				l.h.subscribe(l.b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
					n, _ := l.handled.LoadOrStore(d.ID(), new(atomic.Int32))
					n.(*atomic.Int32).Add(1)
					total.Add(1)
					time.Sleep(10 * time.Millisecond)
					return rowactor.Ack()
				}, append(leaseOptions(form, 2*time.Second), rowactor.Workers(4))...)
				lanes = append(lanes, l)
			}

			// Stop the server once a sixth of the rows were handled, keep it away for two
			// seconds, and start it again.
			for total.Load() < int64(len(lanes)*rows/6) {
				time.Sleep(10 * time.Millisecond)
			}
			server(t, "stop", c.server)
			time.Sleep(2 * time.Second)
			server(t, "start", c.server)

			// Wait until every row is processed in the table. A settlement is not enough to
			// wait for: an ack whose COMMIT reached the server just before it stopped is
			// processed although the client heard only of the lost connection.
			deadline := time.Now().Add(60 * time.Second)
			for _, l := range lanes {
				for l.h.drv.count(t, l.h.d, "SELECT COUNT(*) FROM "+l.h.table.Name+" WHERE processed_at IS NULL") > 0 {
					if time.Now().After(deadline) {
						l.mu.Lock()
						for _, id := range l.ids {
							if st := l.h.row(id); st.processedAt == nil {
								t.Errorf("%s: row %d unprocessed: %+v; failed settlements: %+v", l.h.table.Name, id, st, l.book.failed[id])
							}
						}
						t.Fatalf("%s: rows unprocessed 60 s after the restart\nlogs:\n%s", l.h.table.Name, l.logs)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			time.Sleep(200 * time.Millisecond) // the last settlements' hooks

			for _, l := range lanes {
				form := l.h.table.Form()
				l.mu.Lock()
				again, unheard := 0, 0
				for _, id := range l.ids {
					switch n := l.book.ok[id]; {
					case n > 1:
						t.Errorf("%s: row %d settled %d times", form, id, n)
					case n == 0 && len(l.book.failed[id]) == 0:
						t.Errorf("%s: row %d processed, but no settlement was reported", form, id)
					case n == 0:
						unheard++ // its ack committed as the server stopped; the client heard an error
					}
					st := l.h.row(id)
					if !st.exists || st.processedAt == nil {
						t.Errorf("%s: row %d not processed: %+v", form, id, st)
					}
					v, _ := l.handled.Load(id)
					handled := int(v.(*atomic.Int32).Load())
					if handled > 1 {
						again++
					}
					// Lease and advisory claims count each attempt (a claim whose commit the
					// client never heard of counts one the handler never saw); row lock claims
					// count none, and a lost connection rolls them back.
					switch form {
					case rowactor.FormRowLock:
						if st.attempt != l.before[id] {
							t.Errorf("%s: row %d attempt %d, published with %d", form, id, st.attempt, l.before[id])
						}
					default:
						if st.attempt-l.before[id]+1 < handled {
							t.Errorf("%s: row %d handled %d times but its attempt moved from %d to %d", form, id, handled, l.before[id], st.attempt)
						}
					}
				}
				logs := l.logs.String()
				l.mu.Unlock()
				if !strings.Contains(logs, "fault=connection") {
					t.Errorf("%s: no claim failure logged as a connection fault:\n%s", form, logs)
				}
				if !strings.Contains(logs, "claims succeed again") {
					t.Errorf("%s: no log line says claims succeed again:\n%s", form, logs)
				}
				t.Logf("%s: %d rows, %d handled more than once, %d acks committed unheard", form, rows, again, unheard)
			}
		})
	}
}

// server stops or starts a local test server through scripts/server.sh.
func server(t *testing.T, verb, name string) {
	t.Helper()
	start := time.Now()
	out, err := exec.Command("bash", "scripts/server.sh", verb, name).CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/server.sh %s %s: %v\n%s", verb, name, err, out)
	}
	t.Logf("%s %s took %v", verb, name, time.Since(start).Round(time.Millisecond))
}
