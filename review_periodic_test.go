package rowactor_test

// Adversarial review of periodic jobs (Broker.Periodic): the scenarios marked as findings
// reproduced one when they were written and pass since its fix; the others held.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
)

func init() {
	lease := []rowactor.Form{rowactor.FormLease}
	shapes := []tableShape{withUniqueKey, withProcessedAt}
	scenarios = append(scenarios,
		scenario{name: "review periodic small pool two jobs", forms: lease, shapes: shapes, run: reviewPeriodicSmallPoolScenario},
		scenario{name: "review periodic small pool job subscription retention", forms: lease, shapes: shapes, run: reviewPeriodicSmallPoolMixScenario},
		scenario{name: "review periodic name with at sign", forms: lease, shapes: shapes, run: reviewPeriodicNamePrefixScenario},
		scenario{name: "review periodic foreign key in the job's range", forms: lease, shapes: shapes, run: reviewPeriodicForeignKeyScenario},
		scenario{name: "review periodic skip missed short outage", forms: lease, shapes: shapes, run: reviewPeriodicShortOutageScenario},
		scenario{name: "review periodic shutdown bounded by its context", forms: lease, shapes: shapes, run: reviewPeriodicShutdownCtxScenario},
		scenario{name: "review periodic schedule that never runs", forms: lease, shapes: shapes, run: reviewPeriodicNeverScenario},
		scenario{name: "review periodic dead letter table", forms: lease, shapes: shapes, run: reviewPeriodicDeadLetterTableScenario},
		scenario{name: "review periodic holder killed", forms: lease, shapes: shapes, run: reviewPeriodicHolderKilledScenario},
		scenario{name: "review periodic waiter killed", forms: lease, shapes: shapes, run: reviewPeriodicWaiterKilledScenario},
		scenario{name: "review periodic publish options", forms: lease, shapes: shapes, run: reviewPeriodicPublishOptionsScenario},
	)
}

func reviewPayload(_ context.Context, at time.Time) ([]byte, error) {
	return []byte(at.UTC().Format(keyTime)), nil
}

// countPrefix counts the rows whose unique key starts with name@ (byte range, no LIKE).
func (h *harness) countPrefix(name string) int {
	h.t.Helper()
	low, high := name+"@", name+"A"
	return h.drv.count(h.t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE unique_key >= ? AND unique_key < ?", h.table.Name), low, high)
}

// stopWithin stops p, failing if it takes longer than d.
func stopWithin(t *testing.T, p *rowactor.PeriodicJob, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { p.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Errorf("Stop of %q took longer than %v", p.Name(), d)
		<-done
	}
}

// Review finding (PostgreSQL, MariaDB, fixed). Two periodic jobs on one broker whose pool has 2
// connections: each round holds a connection for the lock (Elect) and needs a second one
// for NewestUniqueKey and for Publish. Two rounds at the same second take both
// connections and wait for each other's, with no deadline: neither job publishes again.
func reviewPeriodicSmallPoolScenario(t *testing.T, h *harness, _ rowactor.Form) {
	d, ok := sizedDialect(t, h, 2)
	if !ok {
		t.Skip("SQLite holds no connection per lock")
	}
	ctx := context.Background()
	b := h.brokerOn(d)
	var jobs []*rowactor.PeriodicJob
	for _, name := range []string{"a", "b"} {
		p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), reviewPayload, rowactor.PeriodicName(name))
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, p)
	}
	time.Sleep(4500 * time.Millisecond)
	for _, p := range jobs {
		if n := h.countPrefix(p.Name()); n < 3 {
			t.Errorf("job %q on a pool of 2 beside one other job: %d runs in 4.5 s, want at least 3 (rounds deadlocked on the pool)", p.Name(), n)
		}
	}
	for _, p := range jobs {
		stopWithin(t, p, 5*time.Second)
	}
}

// One periodic job, one subscription and one retention on a pool of 2: the job's runs are
// published and handled.
func reviewPeriodicSmallPoolMixScenario(t *testing.T, h *harness, _ rowactor.Form) {
	d, ok := sizedDialect(t, h, 2)
	if !ok {
		t.Skip("SQLite holds no connection per lock")
	}
	ctx := context.Background()
	b := h.brokerOn(d)
	if _, err := b.Retain(ctx, h.table, time.Hour, rowactor.RetainEvery(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	h.subscribe(b, func(ctx context.Context, dl *rowactor.Delivery) rowactor.Outcome {
		handled.Add(1)
		return rowactor.Ack()
	})
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), reviewPayload, rowactor.PeriodicName("mix"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(4500 * time.Millisecond)
	if n := h.countPrefix("mix"); n < 3 || handled.Load() < 2 {
		t.Errorf("a job beside a subscription and a retention on a pool of 2: %d runs, %d handled in 4.5 s", n, handled.Load())
	}
	stopWithin(t, p, 5*time.Second)
}

// Review finding (all, fixed). PeriodicName accepts "tick@x". Its keys, "tick@x@2030-…", lie in the range
// of job "tick"'s keys ("tick@" up to "tickA") and sort above all of them ('x' > '2'),
// so job "tick" reads one as its newest run, cannot parse it, and fails every round from
// then on: it never publishes again.
func reviewPeriodicNamePrefixScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	var jobs []*rowactor.PeriodicJob
	for _, name := range []string{"tick", "tick@x", "tick2"} {
		p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), reviewPayload, rowactor.PeriodicName(name))
		if err != nil {
			// Refusing a name with '@' would be a fix too.
			var ce *rowactor.ConfigError
			if name == "tick@x" && errors.As(err, &ce) {
				continue
			}
			t.Fatal(err)
		}
		jobs = append(jobs, p)
	}
	start := time.Now()
	time.Sleep(4500 * time.Millisecond)
	for _, p := range jobs {
		p.Stop()
	}
	runs := h.runsOf("tick", start, time.Now())
	if len(runs) < 3 {
		t.Errorf("job \"tick\" beside job \"tick@x\": %d runs in 4.5 s, want at least 3\nlogs:\n%s", len(runs), h.logs.String())
	}
	if n := h.countPrefix("tick2"); n < 3 {
		t.Errorf("job \"tick2\": %d runs", n)
	}
}

// Review finding (all, fixed). A row of the table whose key merely starts with the job's name and '@' (a
// manual rerun published with Unique("report@manual-rerun"), or any other service's key)
// wedges the job: every round reads it as the newest run and fails to parse it.
func reviewPeriodicForeignKeyScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	if _, err := b.Publish(ctx, h.table, h.queue, []byte("by hand"), rowactor.Unique("report@manual-rerun")); err != nil {
		t.Fatal(err)
	}
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), reviewPayload, rowactor.PeriodicName("report"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3500 * time.Millisecond)
	p.Stop()
	if p.Published() < 2 {
		t.Errorf("a job whose name prefixes another row's key: published %d runs in 3.5 s, want at least 2\nlogs:\n%s", p.Published(), h.logs.String())
	}
}

// Review finding (all, fixed). SkipMissed "drops the runs whose time passed while no process ran the job
// (a deploy, an outage)", and without it "the latest of them is published once". A
// deploy of 30 s on a job every second: the job starts again and publishes every one of
// the 30 runs it missed, with SkipMissed or without, because any run less than a minute
// old counts as "late", not "missed".
func reviewPeriodicShortOutageScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	for _, c := range []struct {
		name string
		skip bool
		max  int64
	}{{"skip", true, 1}, {"once", false, 2}} {
		last := time.Now().Add(-30 * time.Second).Truncate(time.Second)
		h.exec(fmt.Sprintf("INSERT INTO %s (grp, payload, unique_key, processed_at) VALUES (?, ?, ?, ?)", h.table.Name),
			h.queue, []byte("before the deploy"), c.name+"@"+last.UTC().Format(keyTime), h.drv.timeValue(last))
		opts := []rowactor.PeriodicOption{rowactor.PeriodicName(c.name)}
		if c.skip {
			opts = append(opts, rowactor.SkipMissed())
		}
		p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), reviewPayload, opts...)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(700 * time.Millisecond)
		p.Stop()
		if p.Published() > c.max {
			t.Errorf("SkipMissed=%v after a 30 s outage of a 1 s job: %d runs published at the restart, want at most %d", c.skip, p.Published(), c.max)
		}
	}
}

// Review finding (all, fixed). Shutdown(ctx) stops periodic jobs first, and PeriodicJob.Stop waits for
// the round's payload function, whatever ctx says: a payload that takes 6 s holds a
// Shutdown given 1 s for 6 s (one that never returns holds it for ever).
func reviewPeriodicShutdownCtxScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	entered := make(chan struct{})
	var once sync.Once
	_, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), func(ctx context.Context, at time.Time) ([]byte, error) {
		first := false
		once.Do(func() { first = true; close(entered) })
		if first {
			time.Sleep(6 * time.Second)
		}
		return reviewPayload(ctx, at)
	}, rowactor.PeriodicName("slow"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the payload was never called")
	}
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	_, err = b.Shutdown(sctx)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Shutdown with a 1 s context took %v while a periodic payload ran (err %v)", took.Round(100*time.Millisecond), err)
	}
}

// Review finding (all, fixed). Cron("0 0 30 2 *") (30 February) parses, and Periodic accepts it: the job
// logs a warning and ends at once, while the caller holds a *PeriodicJob that looks fine.
// Bad input is to be refused with a *ConfigError before anything runs.
func reviewPeriodicNeverScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	never, err := rowactor.Cron("0 0 30 2 *")
	if err != nil {
		return // refused at parse: fine
	}
	p, err := b.Periodic(ctx, h.table, h.queue, never, reviewPayload)
	var ce *rowactor.ConfigError
	if !errors.As(err, &ce) {
		t.Errorf("Periodic with a schedule that has no run (Next is zero): err %v, want a *ConfigError", err)
	}
	if p != nil {
		p.Stop()
	}
}

// Review finding (all, fixed). A periodic job on a table whose subscription moves failed runs to a
// DeadLetterTable: the move deletes the run's row, and with it the job's memory. The next
// round finds an older run (or none, and takes the broker's start) and publishes every
// run of the last minute again: a run that failed is published and delivered again and
// again.
func reviewPeriodicDeadLetterTableScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	dl := h.table
	dl.Name = h.table.Name + "_dl"
	h.createTable(dl)
	b := h.broker()
	var mu sync.Mutex
	seen := map[string]int{} // payload (the run's time) -> deliveries of distinct rows
	ids := map[int64]bool{}
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		mu.Lock()
		if !ids[d.ID()] {
			ids[d.ID()] = true
			seen[string(d.Payload())]++
		}
		mu.Unlock()
		return rowactor.Cancel(errors.New("the report cannot be made"))
	}, rowactor.DeadLetterTable(dl.Name))
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), reviewPayload, rowactor.PeriodicName("dl"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(4500 * time.Millisecond)
	p.Stop()
	mu.Lock()
	defer mu.Unlock()
	for run, n := range seen {
		if n > 1 {
			t.Errorf("run %s was published as %d rows (its first row moved to the dead letter table, and the job forgot it); published %d runs for %d distinct",
				run, n, p.Published(), len(seen))
			break
		}
	}
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

// The holder of a round is killed (pg_terminate_backend / KILL) while its payload runs;
// the broker waiting in line publishes the run at once. Was a finding (PostgreSQL, MariaDB; fixed) on
// Published: the killed holder's own publish, made afterwards, was fenced by the unique
// key and returned the existing row's id, and it counts it as published too, so the two
// brokers report 2 publishes of 1 row. Checks too that no lock and no connection is left.
func reviewPeriodicHolderKilledScenario(t *testing.T, h *harness, _ rowactor.Form) {
	if h.drv.keyLocked == nil {
		t.Skip("SQLite: no server session to kill")
	}
	ctx := context.Background()
	// An hourly job whose latest run is missed: the first round of each broker publishes
	// it, waiting up to 10 s for the lock.
	r := holdRound(t, h)
	da, db, b, pa, releaseA := r.da, r.db, r.b, r.pa, r.release
	missed := time.Now().Truncate(time.Hour)
	pb, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), reviewPayload, rowactor.PeriodicName("hourly"))
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
func reviewPeriodicWaiterKilledScenario(t *testing.T, h *harness, _ rowactor.Form) {
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
	pb, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), reviewPayload, rowactor.PeriodicName("hourly"))
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

// PeriodicPublish(Unique("x")) is overridden by the run's own key; other options apply.
func reviewPeriodicPublishOptionsScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), reviewPayload, rowactor.PeriodicName("opt"),
		rowactor.PeriodicPublish(rowactor.Unique("fixed")))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	p.Stop()
	if h.countKey("fixed") != 0 || h.countPrefix("opt") < 2 {
		t.Errorf("PeriodicPublish(Unique): %d rows keyed fixed, %d runs", h.countKey("fixed"), h.countPrefix("opt"))
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
		return reviewPayload(ctx, at)
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
