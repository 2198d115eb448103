package rowactor_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
)

func init() {
	lease := []rowactor.Form{rowactor.FormLease}
	shapes := []tableShape{withUniqueKey, withProcessedAt}
	scenarios = append(scenarios,
		scenario{name: "review periodic newest key by index real query", forms: lease, shapes: shapes, run: reviewPeriodicIndexScenario},
		scenario{name: "review periodic key column without unique index", forms: lease, shapes: shapes, run: reviewPeriodicNoUniqueIndexScenario},
		scenario{name: "review periodic name longer than the key column", forms: lease, shapes: shapes, run: reviewPeriodicLongNameScenario},
		scenario{name: "review periodic nil payload", forms: lease, shapes: shapes, run: reviewPeriodicNilPayloadScenario},
	)
}

// The query NewestUniqueKey runs (PostgreSQL's with COLLATE "C", as the dialect writes it)
// reads the unique index, among 10,000 keys, with no sort.
func reviewPeriodicIndexScenario(t *testing.T, h *harness, _ rowactor.Form) {
	for first := 0; first < 10000; first += 500 {
		vals, args := make([]string, 0, 500), make([]any, 0, 1000)
		for i := range 500 {
			vals = append(vals, "(?, ?, ?)")
			args = append(args, h.queue, []byte("x"), fmt.Sprintf("tick@%05d", first+i))
		}
		h.exec(fmt.Sprintf("INSERT INTO %s (grp, payload, unique_key) VALUES %s", h.table.Name, strings.Join(vals, ", ")), args...)
	}
	k := "unique_key"
	if _, ok := h.d.(*postgres.Dialect); ok {
		k = `unique_key COLLATE "C"`
	}
	q := fmt.Sprintf("SELECT unique_key FROM %s WHERE %s >= ? AND %s < ? ORDER BY %s DESC LIMIT 1", h.table.Name, k, k, k)
	if sorts, plan := h.drv.sorts(t, h.d, h.table.Name, q, "tick@", "tickA"); sorts {
		t.Fatalf("NewestUniqueKey's query sorts:\n%s", plan)
	}
}

// Review finding (fixed: Publisher refuses it) where the database does not refuse the publish: a table whose key column has no
// unique index (made by hand, or its index dropped) has no second fence. Periodic checks
// the live table's columns but not the index, and two brokers of one process (SQLite: two
// processes) may publish a run twice. Want: a *ConfigError at Periodic, or one row per run.
func reviewPeriodicNoUniqueIndexScenario(t *testing.T, h *harness, _ rowactor.Form) {
	switch d := h.d.(type) {
	case *postgres.Dialect:
		var idx string
		if err := d.Pool().QueryRow(context.Background(), "SELECT indexname FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%unique_key%'", h.table.Name).Scan(&idx); err != nil {
			t.Fatal(err)
		}
		h.exec("DROP INDEX " + pgQuote(idx))
	case *mysql.Dialect:
		h.exec(fmt.Sprintf("ALTER TABLE %s DROP INDEX rowactor_unique", h.table.Name))
	default:
		h.exec(fmt.Sprintf(`DROP INDEX "%s_unique"`, h.table.Name))
	}
	ctx := context.Background()
	b := h.broker()
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), reviewPayload, rowactor.PeriodicName("nofence"))
	var ce *rowactor.ConfigError
	if errors.As(err, &ce) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	// A second job of the same name on another table description value: the run's rows
	// are still one per key only if the key is fenced. Publish one run's key by hand
	// first, as a racing process would.
	next := time.Now().Truncate(time.Second).Add(2 * time.Second)
	time.Sleep(time.Until(next) - 5*time.Millisecond)
	_, perr := b.Publish(ctx, h.table, h.queue, []byte("racing process"), rowactor.Unique("nofence@"+next.UTC().Format(keyTime)))
	time.Sleep(1500 * time.Millisecond)
	p.Stop()
	n := h.countKey("nofence@" + next.UTC().Format(keyTime))
	if n > 1 {
		t.Errorf("a table without a unique index on the key: the run %s has %d rows; Periodic accepted the table", next.Format(keyTime), n)
	}
	if p.Published() == 0 {
		t.Errorf("a table without a unique index on the key: Periodic accepted it and then published nothing (racing publish: %v)\nlogs:\n%s", perr, tail(h.logs.String(), 1500))
	}
}

// Review finding (PostgreSQL, MariaDB, fixed). A name that makes keys longer than the key column (MariaDB
// VARBINARY(767)) or its index (PostgreSQL's btree row limit) is accepted, and then every
// round fails. Want: a *ConfigError at Periodic, or runs.
func reviewPeriodicLongNameScenario(t *testing.T, h *harness, _ rowactor.Form) {
	raw := make([]byte, 1500)
	_, _ = rand.Read(raw)
	name := hex.EncodeToString(raw) // 3000 bytes that do not compress
	ctx := context.Background()
	b := h.broker()
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), reviewPayload, rowactor.PeriodicName(name))
	var ce *rowactor.ConfigError
	if errors.As(err, &ce) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	p.Stop()
	if p.Published() == 0 {
		t.Errorf("a 3000-byte PeriodicName was accepted and no run was published:\n%s", tail(h.logs.String(), 800))
	}
}

// A payload function returning nil publishes the run (an empty payload).
func reviewPeriodicNilPayloadScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), func(context.Context, time.Time) ([]byte, error) { return nil, nil }, rowactor.PeriodicName("nil"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	p.Stop()
	if p.Published() == 0 {
		t.Errorf("a payload function returning nil: no run published:\n%s", tail(h.logs.String(), 800))
	}
}

func init() {
	scenarios = append(scenarios, scenario{name: "review periodic stop while waiting for the lock",
		forms: []rowactor.Form{rowactor.FormLease}, shapes: []tableShape{withUniqueKey, withProcessedAt}, run: reviewPeriodicStopWaitingScenario})
}

// Broker b waits for the job's lock (an hourly job waits up to 10 s) while a holds it;
// b's Shutdown ends the wait at once, and once a lets the lock go nobody holds it: b's
// abandoned wait left no session behind to take it.
func reviewPeriodicStopWaitingScenario(t *testing.T, h *harness, _ rowactor.Form) {
	if h.drv.keyLocked == nil {
		t.Skip("SQLite")
	}
	ctx := context.Background()
	r := holdRound(t, h)
	da, db, b, pa, releaseA := r.da, r.db, r.b, r.pa, r.release
	if _, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Hour), reviewPayload, rowactor.PeriodicName("hourly")); err != nil {
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
