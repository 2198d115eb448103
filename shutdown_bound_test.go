package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
	"github.com/rowactor/rowactor/rowactortest"
)

// The Shutdown matrix: whatever handlers, other sessions and payload functions do,
// Shutdown(ctx) returns within shutdownBound of ctx's end, leaves nothing held on the
// server (no session of the broker in a transaction, no row lock, no advisory key, no
// election lock, a lease cleared or left fenced), and its report counts the rows it
// released. Every form on every database that serves it, plain and transactional, a
// broker from Open (which owns its pool) and from New (on the caller's pool).

// shutdownBound is how long past its context's end Shutdown may take (issue 29).
const shutdownBound = 2 * time.Second

// shutdownCtx is the matrix's Shutdown budget: short, so the matrix stays cheap. Every
// situation is in place before Shutdown starts, and the bound is counted from the
// context's end, so the budget's length proves nothing of its own.
const shutdownCtx = 200 * time.Millisecond

type shutdownSituation string

const (
	// A handler that ignores its context and holds its row until the test ends.
	stuckHandler shutdownSituation = "a handler ignoring its context"
	// A handler acks a row another session holds with SELECT ... FOR UPDATE.
	lockedRow shutdownSituation = "a row locked by another session when the handler acks it"
	// A periodic job's payload function runs (and ignores its context).
	payloadRunning shutdownSituation = "a periodic payload function running"
)

func TestShutdownReturnsByItsContext(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			for _, tx := range []bool{false, true} {
				for _, sit := range []shutdownSituation{stuckHandler, lockedRow, payloadRunning} {
					// The row lock form's broker holds the row itself; SQLite has no row locks.
					if sit == lockedRow && (form == rowactor.FormRowLock || drv.name == "sqlite") {
						continue
					}
					for _, origin := range []string{"Open", "New"} {
						mode := "plain"
						if tx {
							mode = "transactional"
						}
						t.Run(fmt.Sprintf("%s/%s/%s/%s/%s", drv.name, form, mode, origin, sit), func(t *testing.T) {
							t.Parallel()
							runShutdownBound(t, drv, form, tx, sit, origin == "Open")
						})
					}
				}
			}
		}
	}
}

// boundCell is one cell of the matrix: its table, its broker and what it saw.
type boundCell struct {
	t        *testing.T
	h        *harness
	form     rowactor.Form
	app      string // the PostgreSQL application_name of the broker's sessions
	own      dialects.Dialect
	b        *rowactor.Broker
	fromOpen bool
	// clock, when set, is the broker's (rowactor.WithClock): the payload cell moves it to
	// the job's first run instead of waiting up to a second for it.
	clock *rowactortest.Clock

	mu      sync.Mutex
	settled []rowactor.Settlement
}

func (c *boundCell) settlements() []rowactor.Settlement {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]rowactor.Settlement(nil), c.settled...)
}

func runShutdownBound(t *testing.T, drv driver, form rowactor.Form, tx bool, sit shutdownSituation, fromOpen bool) {
	h := newHarness(t, drv, form, withUniqueKey, withProcessedAt)
	h.tx = tx
	side := h.side()
	c := &boundCell{t: t, h: h, form: form, fromOpen: fromOpen, app: fmt.Sprintf("ra_bound_%d_%d", os.Getpid(), tableSeq.Add(1))}
	if sit == payloadRunning {
		c.clock = rowactortest.NewClock()
	}
	c.start()
	release := make(chan struct{}) // ends what ignores its context, once the checks are done
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)

	entered := make(chan int64, 16)
	ackNow := make(chan struct{})
	var ids []int64
	var job *rowactor.PeriodicJob
	switch sit {
	case stuckHandler:
		h.subscribe(c.b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			if d.Tx() != nil {
				h.write(context.Background(), d, side, "stuck")
			}
			entered <- d.ID()
			<-release // ignores its context
			return rowactor.Ack()
		}, leaseOptions(form, time.Hour)...)
		ids = h.publish(c.b, 1)
	case lockedRow:
		h.subscribe(c.b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			entered <- d.ID()
			<-ackNow
			return rowactor.Ack()
		}, leaseOptions(form, time.Hour)...)
		ids = h.publish(c.b, 1)
	case payloadRunning:
		h.subscribe(c.b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }, leaseOptions(form, time.Hour)...)
		var err error
		job, err = c.b.Periodic(context.Background(), h.table, "periodic", rowactor.Every(time.Second),
			func(context.Context, time.Time) ([]byte, error) {
				entered <- 0
				<-release // ignores its context
				return []byte("run"), nil
			}, rowactor.PeriodicName("tick"))
		if err != nil {
			t.Fatalf("Periodic: %v", err)
		}
		// The job's first run is the next whole second after it started: make it due now.
		c.clock.Advance(time.Second)
	}
	select {
	case <-entered:
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: nothing started within 15 s\nlogs:\n%s", sit, h.logs.String())
	}

	var unlock func() error
	if sit == lockedRow {
		ltx, _, rollback := drv.begin(t, h.d)
		if err := drv.txExec(context.Background(), ltx, fmt.Sprintf("SELECT id FROM %s WHERE id = ? FOR UPDATE", h.table.Name), ids[0]); err != nil {
			t.Fatalf("lock the row: %v", err)
		}
		unlock = rollback
		t.Cleanup(func() { _ = rollback() }) // a failed wait below leaves no lock to the table's drop
		close(ackNow)
		c.waitBlocked()
	}

	ctx, cancel := context.WithTimeout(context.Background(), shutdownCtx)
	defer cancel()
	start := time.Now()
	type shutdownResult struct {
		rep rowactor.ShutdownReport
		err error
	}
	returned := make(chan shutdownResult, 1)
	go func() {
		rep, err := c.b.Shutdown(ctx)
		returned <- shutdownResult{rep, err}
	}()
	var res shutdownResult
	select {
	case res = <-returned:
	case <-time.After(shutdownCtx + shutdownBound + 5*time.Second):
		// It waits for what the test holds: let go of it, so the test can end.
		t.Errorf("Shutdown with a %v context had not returned after %v; the test lets go of the handler, payload and lock it waits for",
			shutdownCtx, time.Since(start).Round(time.Millisecond))
		unblock()
		if unlock != nil {
			_ = unlock()
		}
		select {
		case res = <-returned:
		case <-time.After(2 * time.Minute):
			t.Fatal("Shutdown did not return in 2 min even so")
		}
	}
	rep, err := res.rep, res.err
	took := time.Since(start)
	if unlock != nil {
		// A settlement waiting for the locked row ends with Shutdown: none of the broker's
		// statements may still wait for it (and hold a connection) once Shutdown returned.
		stillWaiting := 0
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if stillWaiting = c.blocked(); stillWaiting == 0 {
				break
			}
		}
		if stillWaiting > 0 {
			t.Errorf("2 s after Shutdown returned, %d statements of the broker still wait for the row another session locks", stillWaiting)
		}
		_ = unlock()
	}
	if took > shutdownCtx+shutdownBound {
		t.Errorf("Shutdown with a %v context returned after %v (report %+v, %v); want within %v of its context's end",
			shutdownCtx, took.Round(time.Millisecond), rep, err, shutdownBound)
	}
	c.checkNothingHeld(ids, sit, job)

	switch sit {
	case stuckHandler:
		if rep.Drained || rep.Released != 1 || !errors.Is(err, rowactor.ErrNotDrained) {
			t.Errorf("Shutdown: %+v, %v; want not drained, the stuck handler's row released (1)", rep, err)
		}
		if n := h.sideRows(side, "stuck"); n != 0 {
			t.Errorf("the stuck handler's write committed (%d rows)", n)
		}
		unblock()
		waitFor(t, func() bool { return len(c.settlements()) >= 1 })
		if s := c.settlements()[0]; !s.Released || !errors.Is(s.Err, rowactor.ErrClosed) {
			t.Errorf("the hook was told %+v; want the row released with ErrClosed, as the report counts it", s)
		}
	case lockedRow:
		// The ack either took effect once the lock went, or gave up; what the hook says
		// was released is what the report counts.
		time.Sleep(200 * time.Millisecond) // a hook call the shutdown made reaches us
		released := 0
		for _, s := range c.settlements() {
			if s.Released {
				released++
			}
		}
		if rep.Released != released {
			t.Errorf("Shutdown reported %d rows released, the hook %d: %+v", rep.Released, released, c.settlements())
		}
	case payloadRunning:
		if rep.Released != 0 || err != nil && !strings.Contains(err.Error(), "periodic") {
			t.Logf("Shutdown: %+v, %v", rep, err)
		}
		if rep.Released != 0 {
			t.Errorf("Shutdown released %d rows with none in work", rep.Released)
		}
	}
}

// start opens the cell's broker: from Open on a URL of its own, or from New on a dialect
// of its own (the caller's pool, which the broker leaves open). On PostgreSQL the broker's
// sessions carry application_name c.app, so the checks can find them.
func (c *boundCell) start() {
	t, h := c.t, c.h
	opts := []rowactor.Option{
		rowactor.WithLogger(slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: debugLevel()}))),
		rowactor.WithOnSettled(func(s rowactor.Settlement) {
			c.mu.Lock()
			c.settled = append(c.settled, s)
			c.mu.Unlock()
		}),
	}
	if c.clock != nil {
		opts = append(opts, rowactor.WithClock(c.clock))
	}
	url := h.drv.url(t, h.d)
	if h.drv.name == "postgres" {
		url += "&application_name=" + c.app
	}
	var err error
	if c.fromOpen {
		c.b, err = rowactor.Open(context.Background(), url, opts...)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
	} else {
		switch h.drv.name {
		case "postgres":
			c.own, err = postgres.Open(context.Background(), url)
			if err != nil {
				t.Fatalf("postgres.Open: %v", err)
			}
		default:
			c.own = h.newD()
		}
		if c.own != nil && h.drv.name == "postgres" {
			d := c.own
			t.Cleanup(func() {
				done := make(chan struct{})
				go func() { _ = d.Close(); close(done) }()
				select {
				case <-done:
				case <-time.After(15 * time.Second):
					t.Errorf("closing the caller's pool waited 15 s for a connection the broker never gave back")
				}
			})
		}
		c.b, err = rowactor.New(c.own, opts...)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
	}
	b := c.b
	shutdownAtCleanup(t, b)
}

// waitBlocked waits until a statement of the broker waits for the row the test locked.
func (c *boundCell) waitBlocked() {
	c.t.Helper()
	waitFor(c.t, func() bool { return c.blocked() > 0 })
}

// blocked counts the statements that wait for the row the test locked.
func (c *boundCell) blocked() int {
	c.t.Helper()
	h := c.h
	var query string
	switch h.drv.name {
	case "postgres":
		query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE ?"
	case "mysql":
		// MariaDB's innodb_trx does not list an autocommit statement waiting for a row
		// lock: the statement itself shows in the process list (the test's own session
		// holding the lock is idle).
		query = "SELECT count(*) FROM information_schema.processlist WHERE id <> CONNECTION_ID() AND info LIKE ?"
	}
	return h.drv.count(c.t, h.d, query, "%"+h.table.Name+"%")
}

// checkNothingHeld asserts, waiting a moment for the server to see closed connections
// end, that nothing of the broker holds anything: no session of the broker's in a
// transaction (nor, from Open, at all), no row locked, no advisory key or election lock
// taken, and leases cleared (a lease whose release a locked row kept waiting may be left
// to run out: it is fenced by its token).
func (c *boundCell) checkNothingHeld(ids []int64, sit shutdownSituation, job *rowactor.PeriodicJob) {
	t, h := c.t, c.h
	var problems []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		problems = c.held(ids, sit, job)
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(problems) > 0 {
		t.Errorf("after Shutdown returned (5 s later still):\n  %s\nlogs:\n%s", strings.Join(problems, "\n  "), h.logs.String())
	}
}

func (c *boundCell) held(ids []int64, sit shutdownSituation, job *rowactor.PeriodicJob) []string {
	t, h := c.t, c.h
	var problems []string
	switch h.drv.name {
	case "postgres":
		if c.fromOpen {
			if n := h.drv.count(t, h.d, "SELECT count(*) FROM pg_stat_activity WHERE application_name = ?", c.app); n > 0 {
				problems = append(problems, fmt.Sprintf("%d sessions of the broker's own pool are still open", n))
			}
		} else {
			if n := h.drv.count(t, h.d, "SELECT count(*) FROM pg_stat_activity WHERE application_name = ? AND (state <> 'idle' OR xact_start IS NOT NULL)", c.app); n > 0 {
				problems = append(problems, fmt.Sprintf("%d sessions of the broker are in a transaction or a statement: %s", n, pgSessions(t, h, c.app)))
			}
			if n := h.drv.count(t, h.d, "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE a.application_name = ?", c.app); n > 0 {
				problems = append(problems, fmt.Sprintf("sessions of the broker hold %d locks", n))
			}
			if n := pgPool(c.own).Stat().AcquiredConns(); n > 0 {
				problems = append(problems, fmt.Sprintf("%d connections of the caller's pool are still acquired", n))
			}
		}
		if n := h.drv.count(t, h.d, "SELECT count(*) FROM pg_locks WHERE relation = ?::regclass", h.table.Name); n > 0 {
			problems = append(problems, fmt.Sprintf("%d locks held on the queue table (a transaction that touched it is open)", n))
		}
	case "mysql":
		if !c.fromOpen {
			if n := mysqlDB(c.own).Stats().InUse; n > 0 {
				problems = append(problems, fmt.Sprintf("%d connections of the caller's pool are still in use", n))
			}
		}
	case "sqlite":
		if p := sqliteWriteLockHeld(t, h); p != "" {
			problems = append(problems, p)
		}
	}
	if h.drv.name != "sqlite" {
		if p := rowsLocked(t, h); p != "" {
			problems = append(problems, p)
		}
	}
	if h.drv.keyLocked != nil {
		if c.form == rowactor.FormAdvisory {
			for _, id := range ids {
				if h.drv.keyLocked(t, h.d, h.table.Name+"-"+strconv.FormatInt(id, 10)) {
					problems = append(problems, fmt.Sprintf("row %d's advisory key is still held", id))
				}
			}
		}
		if job != nil && h.drv.keyLocked(t, h.d, "periodic:"+h.table.Name+":"+job.Name()) {
			problems = append(problems, "the periodic job's election lock is still held")
		}
	}
	if c.form == rowactor.FormLease && sit != lockedRow {
		for _, id := range ids {
			if st := h.row(id); st.exists && st.lockedUntil != nil {
				problems = append(problems, fmt.Sprintf("row %d is still leased (locked_until %v)", id, st.lockedUntil))
			}
		}
	}
	return problems
}

// rowsLocked tries to lock every row of the queue table without waiting, and says which
// session keeps one locked.
func rowsLocked(t *testing.T, h *harness) string {
	tx, _, rollback := h.drv.begin(t, h.d)
	defer func() { _ = rollback() }()
	if err := h.drv.txExec(context.Background(), tx, fmt.Sprintf("SELECT id FROM %s FOR UPDATE NOWAIT", h.table.Name)); err != nil {
		return fmt.Sprintf("a row of the queue table is still locked: %v", err)
	}
	return ""
}

// sqliteWriteLockHeld says whether a connection holds the database file's write lock (an
// open write transaction), from a pool of the test's own that does not wait for it.
func sqliteWriteLockHeld(t *testing.T, h *harness) string {
	d, err := sqlite.Open(context.Background(), strings.TrimPrefix(h.drv.url(t, h.d), "sqlite:"))
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	defer d.Close()
	ctx := context.Background()
	conn, err := d.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "PRAGMA busy_timeout = 0"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Sprintf("the database's write lock is held by a transaction left open: %v", err)
	}
	_, _ = conn.ExecContext(ctx, "ROLLBACK")
	return ""
}

// pgSessions describes the sessions named app, for a failure's message.
func pgSessions(t *testing.T, h *harness, app string) string {
	rows, err := pgPool(h.d).Query(context.Background(),
		"SELECT pid, coalesce(state, ''), coalesce(wait_event_type, ''), left(query, 120) FROM pg_stat_activity WHERE application_name = $1", app)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var pid int
		var state, wait, query string
		if err := rows.Scan(&pid, &state, &wait, &query); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("[pid %d %s %s: %s]", pid, state, wait, query))
	}
	return strings.Join(out, " ")
}
