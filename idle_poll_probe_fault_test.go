package rowactor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// The probe's fault modes.
const (
	probeReal  int32 = iota
	probeFail        // returns an error at once
	probeHang        // blocks until its context ends
	probeNever       // answers "not due" for every group (a broken probe: the tests must fail)
)

// probeFaults makes the probe of a wrapped dialect (every method promoted, DueQueues
// replaced) fail on demand.
type probeFaults struct {
	mode  atomic.Int32
	calls atomic.Int64
	hung  atomic.Int64 // probes blocked right now
}

var errProbeFault = errors.New("idle poll test: the probe failed on purpose")

func (f *probeFaults) due(ctx context.Context, real dialects.DueProber, t dialects.Table, lease bool, groups []string, now time.Time) ([]bool, error) {
	f.calls.Add(1)
	switch f.mode.Load() {
	case probeFail:
		return nil, errProbeFault
	case probeHang:
		f.hung.Add(1)
		defer f.hung.Add(-1)
		<-ctx.Done()
		return nil, ctx.Err()
	case probeNever:
		return make([]bool, len(groups)), nil
	}
	return real.DueQueues(ctx, t, lease, groups, now)
}

type pgProbeWrap struct {
	*postgres.Dialect
	f *probeFaults
}

func (w pgProbeWrap) DueQueues(ctx context.Context, t dialects.Table, lease bool, groups []string, now time.Time) ([]bool, error) {
	return w.f.due(ctx, w.Dialect, t, lease, groups, now)
}

type myProbeWrap struct {
	*mysql.Dialect
	f *probeFaults
}

func (w myProbeWrap) DueQueues(ctx context.Context, t dialects.Table, lease bool, groups []string, now time.Time) ([]bool, error) {
	return w.f.due(ctx, w.Dialect, t, lease, groups, now)
}

type liteProbeWrap struct {
	*sqlite.Dialect
	f *probeFaults
}

func (w liteProbeWrap) DueQueues(ctx context.Context, t dialects.Table, lease bool, groups []string, now time.Time) ([]bool, error) {
	return w.f.due(ctx, w.Dialect, t, lease, groups, now)
}

func wrapProbe(t *testing.T, d dialects.Dialect, f *probeFaults) dialects.Dialect {
	switch d := d.(type) {
	case *postgres.Dialect:
		return pgProbeWrap{d, f}
	case *mysql.Dialect:
		return myProbeWrap{d, f}
	case *sqlite.Dialect:
		return liteProbeWrap{d, f}
	}
	t.Fatalf("no probe wrapper for %T", d)
	return nil
}

// handledAt collects when each row was handled.
type handledAt struct {
	ch chan struct {
		id int64
		at time.Time
	}
}

func newHandledAt() *handledAt {
	return &handledAt{ch: make(chan struct {
		id int64
		at time.Time
	}, 64)}
}

func (h *handledAt) handler(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
	h.ch <- struct {
		id int64
		at time.Time
	}{d.ID(), time.Now()}
	return rowactor.Ack()
}

// wait returns how long after from row id was handled; it fails after limit.
func (h *handledAt) wait(t *testing.T, hs *harness, id int64, from time.Time, limit time.Duration) time.Duration {
	t.Helper()
	select {
	case d := <-h.ch:
		if d.id != id {
			t.Fatalf("handled row %d, want %d", d.id, id)
		}
		return d.at.Sub(from)
	case <-time.After(limit):
		t.Fatalf("row %d not handled within %v\nlogs:\n%s", id, limit, hs.logs.String())
	}
	return 0
}

// insertByHand writes a due row of group into the harness's table with plain SQL: no
// Publish, so nothing wakes a subscription. It returns the row's id as the insert made it
// (the row may be handled and gone before any later read).
func insertByHand(t *testing.T, h *harness, group string) int64 {
	t.Helper()
	return insertByHandSetting(t, h, group, "", nil)
}

// insertByHandSetting is insertByHand with column col set to v as well ("" sets none).
// The id comes from the insert itself: a row handled and deleted at once is no other's.
func insertByHandSetting(t *testing.T, h *harness, group, col string, v any) int64 {
	t.Helper()
	q := func(s string) string { return quoteFor(h.drv.name, s) }
	cols, vals, args := q(h.table.Payload), "?", []any{[]byte("by hand")}
	if h.table.Group != "" {
		cols, vals, args = cols+", "+q(h.table.Group), vals+", ?", append(args, group)
	}
	if col != "" {
		cols, vals, args = cols+", "+q(col), vals+", ?", append(args, v)
	}
	query := fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s)", q(h.table.Name), cols, vals)
	ctx := context.Background()
	switch d := h.d.(type) {
	case *postgres.Dialect:
		var id int64
		if err := d.Pool().QueryRow(ctx, dollarPlaceholders(query)+" RETURNING "+q(h.table.ID), args...).Scan(&id); err != nil {
			t.Fatalf("insert: %v", err)
		}
		return id
	case *mysql.Dialect:
		return lastInsertID(t, d.DB(), query, args)
	case *sqlite.Dialect:
		return lastInsertID(t, d.DB(), query, args)
	}
	t.Fatalf("no insert for %T", h.d)
	return 0
}

func lastInsertID(t *testing.T, db *sql.DB, query string, args []any) int64 {
	t.Helper()
	res, err := db.Exec(query, args...)
	if err != nil {
		t.Fatalf("insert: %v", err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestIdlePollProbeFaultsDoNotHoldBackDueRows proves that a probe that fails or hangs until
// its deadline keeps no due row from its worker for long and does not hold up Shutdown.
func TestIdlePollProbeFaultsDoNotHoldBackDueRows(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			t.Run(fmt.Sprintf("%s/%s", drv.name, form), func(t *testing.T) {
				h := newHarness(t, drv, form)
				f := &probeFaults{}
				b := h.brokerOn(wrapProbe(t, h.newD(), f), rowactor.WithPollOnly())
				got := newHandledAt()
				const poll = 100 * time.Millisecond
				for _, g := range []string{h.queue, "other-1", "other-2"} {
					if _, err := b.Subscribe(context.Background(), h.table, g, got.handler, rowactor.PollInterval(poll)); err != nil {
						t.Fatal(err)
					}
				}
				// The first probe comes within a poll or so of the subscriptions' first
				// empty claims; a loaded machine may take longer to get there.
				for deadline := time.Now().Add(5 * time.Second); f.calls.Load() == 0; time.Sleep(poll / 2) {
					if time.Now().After(deadline) {
						t.Fatal("no probe ran in 5 s")
					}
				}

				// A real probe: within a poll or so.
				from := time.Now()
				id := insertByHand(t, h, "other-2")
				t.Logf("real probe: handled after %v", got.wait(t, h, id, from, 3*time.Second))

				// A failing probe ticks every waiting subscription: within a poll or so.
				f.mode.Store(probeFail)
				time.Sleep(2 * poll)
				from = time.Now()
				id = insertByHand(t, h, h.queue)
				if d := got.wait(t, h, id, from, 3*time.Second); d > 10*poll {
					t.Errorf("with a failing probe the row waited %v at a %v poll", d, poll)
				} else {
					t.Logf("failing probe: handled after %v", d)
				}

				// A probe hanging until its deadline (max(poll, 1 s)) holds every waiting
				// subscription of the table for that long.
				f.mode.Store(probeHang)
				time.Sleep(2 * poll)
				from = time.Now()
				id = insertByHand(t, h, "other-1")
				t.Logf("hanging probe: handled after %v at a %v poll", got.wait(t, h, id, from, 5*time.Second), poll)

				// Shutdown with a probe hanging: at once, and nothing left running.
				waitFor(t, func() bool { return f.hung.Load() > 0 })
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, err := b.Shutdown(ctx); err != nil {
					t.Fatalf("Shutdown: %v", err)
				}
				if d := time.Since(start); d > 500*time.Millisecond {
					t.Errorf("Shutdown took %v with a hanging probe", d)
				}
				if n := f.hung.Load(); n != 0 {
					t.Errorf("%d probes still running after Shutdown", n)
				}
				calls := f.calls.Load()
				time.Sleep(3 * poll)
				if n := f.calls.Load() - calls; n != 0 {
					t.Errorf("%d probes ran after Shutdown", n)
				}
			})
		}
	}
}

// TestIdlePollShutdownLeavesNoGoroutine proves that Shutdown while probes run on a real pool
// leaves no goroutine of the poll (checked here, not only at the package's end).
func TestIdlePollShutdownLeavesNoGoroutine(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			h := newHarness(t, drv, rowactor.FormLease)
			d := h.newD()
			ignore := goleak.IgnoreCurrent()
			for i := 0; i < 5; i++ {
				b, err := rowactor.New(d)
				if err != nil {
					t.Fatal(err)
				}
				for g := 0; g < 5; g++ {
					if _, err := b.Subscribe(context.Background(), h.table, fmt.Sprintf("g%d", g), func(context.Context, *rowactor.Delivery) rowactor.Outcome {
						return rowactor.Ack()
					}, rowactor.PollInterval(time.Duration(1+g%2)*time.Millisecond)); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(time.Duration(20+13*i) * time.Millisecond)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				start := time.Now()
				if _, err := b.Shutdown(ctx); err != nil {
					t.Fatal(err)
				}
				cancel()
				if d := time.Since(start); d > time.Second {
					t.Errorf("Shutdown took %v", d)
				}
			}
			// The dialect's own goroutines (pgxpool's health check) are not the broker's.
			goleak.VerifyNone(t, ignore, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
				goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
				goleak.IgnoreTopFunction("github.com/go-sql-driver/mysql.(*mysqlConn).startWatcher.func1"))
		})
	}
}
