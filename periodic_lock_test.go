package rowactor_test

// A periodic job's lock across brokers: a holder or a waiter whose server session is
// killed, and a broker shut down while it waits in line, leave the run published once
// and no lock or connection held.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
)

var periodicLockScenarios = []scenario{
	{name: "a killed periodic lock holder's run is published once by the broker in line, leaving no lock or connection held", forms: periodicForms, shapes: periodicShapes, run: periodicHolderKilledScenario},
	{name: "a periodic job whose waiting session is killed goes on, leaving no lock or connection held", forms: periodicForms, shapes: periodicShapes, run: periodicWaiterKilledScenario},
	{name: "Shutdown of a broker waiting for a periodic job's lock returns at once and leaves no lock held", forms: periodicForms, shapes: periodicShapes, run: periodicStopWhileWaitingScenario},
}

// lockHolder returns the server session holding lock's key ("" on SQLite).
func lockHolder(t *testing.T, h *harness, lock string) string {
	t.Helper()
	key := dialects.LockKey(lock)
	switch d := h.d.(type) {
	case *postgres.Dialect:
		var pid *int64
		err := d.Pool().QueryRow(context.Background(), `SELECT max(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
			AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 0)`, key).Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
		if pid == nil {
			return ""
		}
		return fmt.Sprint(*pid)
	case *mysql.Dialect:
		var db string
		var id *int64
		if err := d.DB().QueryRow("SELECT DATABASE()").Scan(&db); err != nil {
			t.Fatal(err)
		}
		if err := d.DB().QueryRow("SELECT IS_USED_LOCK(?)", mysql.LockName(db, key)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if id == nil {
			return ""
		}
		return fmt.Sprint(*id)
	}
	return ""
}

// killSession ends a server session (pg_terminate_backend, KILL).
func killSession(t *testing.T, h *harness, session string) {
	t.Helper()
	switch d := h.d.(type) {
	case *postgres.Dialect:
		if _, err := d.Pool().Exec(context.Background(), "SELECT pg_terminate_backend($1::int)", session); err != nil {
			t.Fatal(err)
		}
	case *mysql.Dialect:
		if _, err := d.DB().Exec("KILL " + session); err != nil {
			t.Fatal(err)
		}
	}
}

// inUse reports the connections a dialect's pool has lent out.
func inUse(d dialects.Dialect) int {
	switch d := d.(type) {
	case *postgres.Dialect:
		return int(d.Pool().Stat().AcquiredConns())
	case *mysql.Dialect:
		return d.DB().Stats().InUse
	}
	return 0
}

// The holder of a round is killed (pg_terminate_backend / KILL) while its payload runs:
// the broker waiting in line publishes the run at once, the two brokers report one publish
// in all (a publish fenced by the unique key does not count), and no lock or connection is
// left held.
func periodicHolderKilledScenario(t *testing.T, h *harness, _ rowactor.Form) {
	if h.drv.keyLocked == nil {
		t.Skip("SQLite: no server session to kill")
	}
	ctx := context.Background()
	// An hourly job whose latest run is missed: the first round of each broker publishes
	// it, waiting up to 10 s for the lock.
	r := holdRound(t, h)
	da, db, b, pa, releaseA := r.da, r.db, r.b, r.pa, r.release
	missed := time.Now().Truncate(time.Hour)
	pb, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), periodicPayload, rowactor.PeriodicName("hourly"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // b waits in line
	lock := "periodic:" + h.table.Name + ":hourly"
	holder := lockHolder(t, h, lock)
	if holder == "" {
		close(releaseA)
		t.Fatal("nobody holds the job's lock while a's round runs")
	}
	killSession(t, h, holder)
	defer func() {
		if t.Failed() {
			for _, l := range strings.Split(h.logs.String(), "\n") {
				if strings.Contains(l, "periodic") || strings.Contains(l, "started") {
					t.Log(l)
				}
			}
		}
	}()
	waitUntil(t, "broker b to publish the missed run after the holder was killed", func() bool { return pb.Published() == 1 })
	close(releaseA)
	time.Sleep(500 * time.Millisecond)
	stopWithin(t, pa, 5*time.Second)
	stopWithin(t, pb, 5*time.Second)
	if n := h.countKey("hourly@" + missed.UTC().Format(keyTime)); n != 1 {
		t.Errorf("the missed run has %d rows", n)
	}
	if s := lockHolder(t, h, lock); s != "" {
		t.Errorf("session %s still holds the job's lock after both jobs stopped", s)
	}
	if n := inUse(da) + inUse(db); n != 0 {
		t.Errorf("%d pool connections still lent out after both jobs stopped", n)
	}
	if got := pa.Published() + pb.Published(); got != 1 {
		t.Errorf("one row was published, and the brokers report %d publishes (a: %d, b: %d): a publish fenced by the unique key counts",
			got, pa.Published(), pb.Published())
	}
}

// A waiter's session is killed while it waits for the lock; its job goes on, nothing is
// left held, and the run is published once.
func periodicWaiterKilledScenario(t *testing.T, h *harness, _ rowactor.Form) {
	if h.drv.keyLocked == nil {
		t.Skip("SQLite: no server session to kill")
	}
	if _, ok := h.d.(*mysql.Dialect); ok {
		// Which session waits for which user lock is not visible on MariaDB without the
		// metadata_lock_info plugin, and killing every GET_LOCK waiter would kill other
		// tests' sessions; the MariaDB holder-killed scenario kills by IS_USED_LOCK.
		t.Skip("MariaDB does not tell which user lock a session waits for")
	}
	ctx := context.Background()
	r := holdRound(t, h)
	da, db, b, pa, releaseA := r.da, r.db, r.b, r.pa, r.release
	// b's pool has one connection idle before it starts: its round's wait is on it.
	pb, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), periodicPayload, rowactor.PeriodicName("hourly"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	// Kill every session of b's pool that is not a's (the waiter's among them).
	holder := lockHolder(t, h, "periodic:"+h.table.Name+":hourly")
	for _, s := range sessionsOf(t, h, db, "periodic:"+h.table.Name+":hourly") {
		if s != holder {
			killSession(t, h, s)
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(releaseA)
	waitUntil(t, "a to publish", func() bool { return pa.Published() == 1 })
	stopWithin(t, pa, 5*time.Second)
	stopWithin(t, pb, 5*time.Second)
	if n := h.countPrefix("hourly"); n != 2 {
		t.Errorf("%d hourly rows, want the old one and the missed run", n)
	}
	if s := lockHolder(t, h, "periodic:"+h.table.Name+":hourly"); s != "" {
		t.Errorf("session %s still holds the job's lock", s)
	}
	if n := inUse(da) + inUse(db); n != 0 {
		t.Errorf("%d pool connections still lent out", n)
	}
}

// sessionsOf lists the server sessions of d's pool that are busy in a statement.
func sessionsOf(t *testing.T, h *harness, d dialects.Dialect, lock string) []string {
	t.Helper()
	var out []string
	switch d.(type) {
	case *postgres.Dialect:
		// The sessions waiting for this test's lock only: the scenarios run side by side.
		rows, err := pgPool(h.d).Query(context.Background(), `SELECT pid::text FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 0)`, dialects.LockKey(lock))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var s string
			_ = rows.Scan(&s)
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		t.Fatal("no session waits for the job's lock")
	}
	return out
}

// Broker b waits for the job's lock (an hourly job waits up to 10 s) while a holds it;
// b's Shutdown ends the wait at once, and once a lets the lock go nobody holds it: b's
// abandoned wait left no session behind to take it.
func periodicStopWhileWaitingScenario(t *testing.T, h *harness, _ rowactor.Form) {
	if h.drv.keyLocked == nil {
		t.Skip("SQLite")
	}
	ctx := context.Background()
	r := holdRound(t, h)
	da, db, b, pa, releaseA := r.da, r.db, r.b, r.pa, r.release
	if _, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), periodicPayload, rowactor.PeriodicName("hourly")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := b.Shutdown(sctx); err != nil {
		t.Errorf("Shutdown of the waiting broker: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Shutdown of a broker waiting for the job's lock took %v", took)
	}
	close(releaseA)
	waitUntil(t, "a's publish", func() bool { return pa.Published() == 1 })
	stopWithin(t, pa, 5*time.Second)
	lock := "periodic:" + h.table.Name + ":hourly"
	for range 10 {
		if s := lockHolder(t, h, lock); s != "" {
			t.Errorf("session %s holds the job's lock after both brokers stopped", s)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := inUse(da) + inUse(db); n != 0 {
		t.Errorf("%d connections lent out", n)
	}
}

// heldRound is an hourly job whose latest run is missed, started on broker a (on dialect
// da), whose round holds the job's lock in its payload until release is closed.
type heldRound struct {
	da, db  dialects.Dialect
	a, b    *rowactor.Broker
	pa      *rowactor.PeriodicJob
	release chan struct{}
}

// holdRound starts it: it returns once a's payload runs, holding the lock.
func holdRound(t *testing.T, h *harness) *heldRound {
	t.Helper()
	missed := time.Now().Truncate(time.Hour)
	old := missed.Add(-2 * time.Hour)
	h.exec(fmt.Sprintf("INSERT INTO %s (grp, payload, unique_key, processed_at) VALUES (?, ?, ?, ?)", h.table.Name),
		h.queue, []byte("old"), "hourly@"+old.UTC().Format(keyTime), h.drv.timeValue(old))
	r := &heldRound{da: h.newD(), db: h.newD(), release: make(chan struct{})}
	r.a, r.b = h.brokerOn(r.da), h.brokerOn(r.db)
	in := make(chan struct{})
	pa, err := r.a.Periodic(context.Background(), h.table, h.queue, rowactor.Every(time.Hour), func(ctx context.Context, at time.Time) ([]byte, error) {
		close(in)
		<-r.release
		return periodicPayload(ctx, at)
	}, rowactor.PeriodicName("hourly"))
	if err != nil {
		t.Fatal(err)
	}
	r.pa = pa
	select {
	case <-in:
	case <-time.After(5 * time.Second):
		close(r.release)
		t.Fatal("broker a never made the missed run")
	}
	return r
}
