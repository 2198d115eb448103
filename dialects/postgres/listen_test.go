package postgres

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
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
		lerr = d.Listen(lctx, wakeInto(lctx, wakes))
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

// listenSessions counts the LISTEN sessions of one application_name.
func listenSessions(t *testing.T, d *Dialect, app string) int {
	t.Helper()
	var n int
	if err := d.Pool().QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'", app).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitListenSessions waits up to 10 s for n LISTEN sessions of app.
func waitListenSessions(t *testing.T, d *Dialect, app string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for got := listenSessions(t, d, app); got != n; got = listenSessions(t, d, app) {
		if time.Now().After(deadline) {
			t.Fatalf("%d LISTEN sessions of %s, want %d", got, app, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wakeInto is a Listen wake that sends to wakes until ctx ends. Every listener of the
// test database hears every other test's publishes: a test that stopped reading its
// channel would otherwise block the shared session's fan-out, and with it its own
// Listen's return at cleanup.
func wakeInto(ctx context.Context, wakes chan<- wakeCall) func(table, group string) {
	return func(table, group string) {
		select {
		case wakes <- wakeCall{table, group}:
		case <-ctx.Done():
		}
	}
}

// startListen runs d.Listen on a goroutine; the returned stop ends it and waits for it.
func startListen(t *testing.T, d *Dialect, wakes chan<- wakeCall) (stop func()) {
	t.Helper()
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Listen(lctx, wakeInto(lctx, wakes)) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Listen returned %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// nextWakeOf returns the next wake of table from wakes, skipping the wakes of everything.
func nextWakeOf(wakes <-chan wakeCall, table string, wait time.Duration) (wakeCall, bool) {
	deadline := time.After(wait)
	for {
		select {
		case w := <-wakes:
			if w.table == table {
				return w, true
			}
		case <-deadline:
			return wakeCall{}, false
		}
	}
}

// Dialects on pools with one connection string share one LISTEN session: each hears
// every publish, one stopping leaves the other listening, and the last one out closes
// the session.
func TestListenSharesOneSessionPerConnectionString(t *testing.T) {
	app := "rowactor_shared_listen_" + tableNameSuffix(t)
	url := withParams(testURL(), "application_name="+app)
	a, b := openURL(t, url), openURL(t, url)
	tbl := leaseTable(tableName(t, a))
	createTable(t, a, tbl)

	wakesA, wakesB := make(chan wakeCall, 100), make(chan wakeCall, 100)
	stopA := startListen(t, a, wakesA)
	stopB := startListen(t, b, wakesB)
	waitListenSessions(t, a, app, 1)
	// Each is told to claim once, whichever joined the session first.
	for name, wakes := range map[string]chan wakeCall{"first": wakesA, "second": wakesB} {
		if _, ok := nextWakeOf(wakes, "", 10*time.Second); !ok {
			t.Fatalf("the %s Listen was never told to claim once", name)
		}
	}

	other := newDialect(t)
	dialecttest.Publish(t, other, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	for name, wakes := range map[string]chan wakeCall{"first": wakesA, "second": wakesB} {
		if w, ok := nextWakeOf(wakes, tbl.Name, 10*time.Second); !ok || w.group != "g" {
			t.Fatalf("the %s Listen heard %+v %v, want the publish to group g", name, w, ok)
		}
	}
	if n := listenSessions(t, a, app); n != 1 {
		t.Fatalf("%d LISTEN sessions for two dialects on one connection string, want 1", n)
	}

	stopA()
	dialecttest.Publish(t, other, tbl, dialects.Message{Group: "h", Payload: []byte("p")})
	if w, ok := nextWakeOf(wakesB, tbl.Name, 10*time.Second); !ok || w.group != "h" {
		t.Fatalf("after the first Listen ended the second heard %+v %v, want the publish to group h", w, ok)
	}
	if w, ok := nextWakeOf(wakesA, tbl.Name, 300*time.Millisecond); ok {
		t.Fatalf("a Listen that returned was woken: %+v", w)
	}
	stopB()
	waitListenSessions(t, other, app, 0)
}

// openWith opens a dialect on url's pool configuration changed by edit.
func openWith(t *testing.T, url string, edit func(*pgxpool.Config)) *Dialect {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return New(pool)
}

// A pool whose database was set in code (here the server's "postgres" database) never
// shares the LISTEN session of a pool Open made from the same connection string: NOTIFY
// is per database, and the plain pool must still hear the publishes to its own tables,
// whichever joined first.
func TestListenGivesAPoolOnADatabaseSetInCodeASessionOfItsOwn(t *testing.T) {
	app := "rowactor_listen_db_" + tableNameSuffix(t)
	url := withParams(testURL(), "application_name="+app)
	plain := openURL(t, url)
	onPostgresDB := openWith(t, url, func(c *pgxpool.Config) { c.ConnConfig.Database = "postgres" })
	tbl := leaseTable(tableName(t, plain))
	createTable(t, plain, tbl)

	wakesOther, wakesPlain := make(chan wakeCall, 100), make(chan wakeCall, 100)
	startListen(t, onPostgresDB, wakesOther)
	if _, ok := nextWakeOf(wakesOther, "", 10*time.Second); !ok {
		t.Fatal("the Listen on database postgres never connected")
	}
	startListen(t, plain, wakesPlain)
	if _, ok := nextWakeOf(wakesPlain, "", 10*time.Second); !ok {
		t.Fatal("the Listen on database test never connected")
	}

	var dbs []string
	rows, err := plain.Pool().Query(ctx, "SELECT datname FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%' ORDER BY datname", app)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		dbs = append(dbs, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("LISTEN sessions of %s by database: %v", app, dbs)

	dialecttest.Publish(t, newDialect(t), tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	if w, ok := nextWakeOf(wakesPlain, tbl.Name, 5*time.Second); !ok || w.group != "g" {
		t.Fatalf("a plain pool on database test never heard a publish to its own table (heard %+v %v): it shares the LISTEN session of a pool on database postgres (sessions by database: %v)", w, ok, dbs)
	}
}

// A pool whose application_name was set in code (the usual way to name a service's
// sessions) listens on a session of its own, named as it says.
func TestListenGivesAPoolWithAnApplicationNameSetInCodeASessionOfItsOwn(t *testing.T) {
	suffix := tableNameSuffix(t)
	app, ownApp := "rowactor_listen_app_"+suffix, "rowactor_listen_own_"+suffix
	url := withParams(testURL(), "application_name="+app)
	plain := openURL(t, url)
	named := openWith(t, url, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = ownApp })

	listenBesidePlain(t, plain, app, named)
	deadline := time.Now().Add(3 * time.Second)
	for listenSessions(t, plain, ownApp) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no LISTEN session of application_name %s (set in code) after 3 s; %d of %s: it shares the plain pool's session",
				ownApp, listenSessions(t, plain, app), app)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A pool with a dialer of its own (here a *net.Dialer whose Control hook counts the
// sockets it dials; in a service, LocalAddr, a socket mark, a keep-alive policy) listens
// on a session of its own, dialed with it. Its method value runs the same code as
// pgconn's default dialer, so no look at the configuration could tell them apart.
func TestListenGivesAPoolWithADialerOfItsOwnASessionOfItsOwn(t *testing.T) {
	app := "rowactor_listen_dialer_" + tableNameSuffix(t)
	url := withParams(testURL(), "application_name="+app)
	plain := openURL(t, url)
	var dials atomic.Int64
	dialer := &net.Dialer{Timeout: 5 * time.Second, Control: func(string, string, syscall.RawConn) error {
		dials.Add(1)
		return nil
	}}
	custom := openWith(t, url, func(c *pgxpool.Config) { c.ConnConfig.DialFunc = dialer.DialContext })
	if err := custom.Pool().Ping(ctx); err != nil { // the pool itself dials with it
		t.Fatal(err)
	}
	poolDials := dials.Load()
	if poolDials == 0 {
		t.Fatal("the pool did not dial with its own dialer")
	}

	listenBesidePlain(t, plain, app, custom)
	time.Sleep(time.Second)
	if n := listenSessions(t, plain, app); n != 2 || dials.Load() == poolDials {
		t.Fatalf("%d LISTEN sessions of %s and %d dials by the pool's own dialer for listening: a pool with a dialer set in code shares the plain pool's session",
			n, app, dials.Load()-poolDials)
	}
}

// listenBesidePlain starts Listen on plain, whose sessions are named app, waits for its
// session, then starts Listen on other and waits until it is told to claim once.
func listenBesidePlain(t *testing.T, plain *Dialect, app string, other *Dialect) {
	t.Helper()
	startListen(t, plain, make(chan wakeCall, 100))
	waitListenSessions(t, plain, app, 1)
	wakes := make(chan wakeCall, 100)
	startListen(t, other, wakes)
	if _, ok := nextWakeOf(wakes, "", 10*time.Second); !ok {
		t.Fatal("the second Listen was never told to claim once")
	}
}
