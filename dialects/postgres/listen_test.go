package postgres

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

type wakeCall struct{ table, group string }

func TestListen(t *testing.T) {
	app := "rowactor_listen_" + tableNameSuffix(t)
	d := openURL(t, withParams(testURL(), "application_name="+app))
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)

	wakes := make(chan wakeCall, 100)
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	var lerr error
	go func() {
		defer wg.Done()
		lerr = d.Listen(lctx, func(table, group string) { wakes <- wakeCall{table, group} })
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if lerr != nil {
			t.Errorf("Listen returned %v", lerr)
		}
	})
	// next returns the next wake for this test's table, or a wake of everything.
	next := func(wait time.Duration) (wakeCall, bool) {
		t.Helper()
		deadline := time.After(wait)
		for {
			select {
			case w := <-wakes:
				if w.table == "" || w.table == tbl.Name {
					return w, true
				}
			case <-deadline:
				return wakeCall{}, false
			}
		}
	}
	if w, ok := next(10 * time.Second); !ok || w != (wakeCall{}) {
		t.Fatalf("first wake %+v %v, want everything", w, ok)
	}

	// A publish from another process wakes the table's group.
	other := newDialect(t)
	dialecttest.Publish(t, other, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	if w, ok := next(10 * time.Second); !ok || w != (wakeCall{tbl.Name, "g"}) {
		t.Fatalf("wake %+v %v", w, ok)
	}

	// Cut the listener off: it reconnects and wakes everything, since notifications
	// sent meanwhile are lost.
	var pid int
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := other.Pool().QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'", app).Scan(&pid)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the listener's backend: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mustExec(t, other, "SELECT pg_terminate_backend($1)", pid)
	if w, ok := next(10 * time.Second); !ok || w != (wakeCall{}) {
		t.Fatalf("wake after the reconnect %+v %v, want everything", w, ok)
	}
	var again int
	if err := other.Pool().QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'", app).Scan(&again); err != nil || again == pid {
		t.Fatalf("no new listener backend: %d %v", again, err)
	}
	dialecttest.Publish(t, other, tbl, dialects.Message{Group: "h", Payload: []byte("p")})
	if w, ok := next(10 * time.Second); !ok || w != (wakeCall{tbl.Name, "h"}) {
		t.Fatalf("wake after the reconnect %+v %v", w, ok)
	}
	// The listener holds no pool connection.
	if n := d.Pool().Stat().AcquiredConns(); n != 0 {
		t.Fatalf("the listener holds %d pool connections", n)
	}
}

// Listen returns when its context ends, even while it cannot connect, and never spins:
// its reconnects back off.
func TestListenBacksOff(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(testURL())
	if err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int64
	cfg.ConnConfig.DialFunc = func(context.Context, string, string) (net.Conn, error) {
		dials.Add(1)
		return nil, errors.New("refused by the test")
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d := New(pool)
	var calls atomic.Int64
	lctx, cancel := context.WithTimeout(ctx, 1600*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := d.Listen(lctx, func(string, string) { calls.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("Listen took %v to return", el)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("woke %d times without a connection", n)
	}
	// 100, 200, 400, 800 ms (jittered into their upper halves) fit about five attempts
	// (each may dial every host address the URL resolves to) in 1.6 s.
	if n := dials.Load(); n < 2 || n > 12 {
		t.Fatalf("%d dials in 1.6 s", n)
	}
}
