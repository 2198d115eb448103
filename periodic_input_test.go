package rowactor_test

// What Broker.Periodic accepts (names, payloads, publish options, tables) and what it
// refuses with a *ConfigError before the job starts.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/rowactortest"
)

var periodicInputScenarios = []scenario{
	{name: "a periodic job named with an at sign does not wedge the job whose name it extends", forms: periodicForms, shapes: periodicShapes, run: periodicNameWithAtSignScenario},
	{name: "a periodic job ignores another row whose key starts with its name and an at sign", forms: periodicForms, shapes: periodicShapes, run: periodicForeignKeyInRangeScenario},
	{name: "a periodic schedule that never runs is refused with a ConfigError", forms: periodicForms, shapes: periodicShapes, run: periodicScheduleThatNeverRunsScenario},
	{name: "PeriodicPublish options apply to each run, but the run's own key overrides Unique", forms: periodicForms, shapes: periodicShapes, run: periodicPublishOptionsScenario},
	{name: "a periodic job on a key column without a unique index is refused or publishes one row per run", forms: periodicForms, shapes: periodicShapes, run: periodicKeyWithoutUniqueIndexScenario},
	{name: "a periodic name longer than the key column is refused or its runs are published", forms: periodicForms, shapes: periodicShapes, run: periodicLongNameScenario},
	{name: "a periodic payload function returning nil publishes the run with an empty payload", forms: periodicForms, shapes: periodicShapes, run: periodicNilPayloadScenario},
}

// A job named "tick@x", whose keys lie in the range of job "tick"'s keys, is refused or
// leaves job "tick" publishing its runs.
func periodicNameWithAtSignScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	clock := rowactortest.NewClock()
	b := h.broker(rowactor.WithClock(clock))
	var jobs []*rowactor.PeriodicJob
	for _, name := range []string{"tick", "tick@x", "tick2"} {
		p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), periodicPayload, rowactor.PeriodicName(name))
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
	start := clock.Now()
	// Four runs' seconds, which the clock jumps to instead of the test waiting for them.
	stepSeconds(clock, 4, func(step int) bool {
		for _, p := range jobs {
			if p.Published() < int64(step) {
				return false
			}
		}
		return true
	})
	for _, p := range jobs {
		p.Stop()
	}
	runs := h.runsOf("tick", start, clock.Now())
	if len(runs) < 3 {
		t.Errorf("job \"tick\" beside job \"tick@x\": %d runs in 4 s of its clock, want at least 3\nlogs:\n%s", len(runs), h.logs.String())
	}
	if n := h.countPrefix("tick2"); n < 3 {
		t.Errorf("job \"tick2\": %d runs", n)
	}
}

// A row whose key merely starts with the job's name and '@' (a manual rerun keyed
// "report@manual-rerun") does not stop the job publishing its runs.
func periodicForeignKeyInRangeScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	clock := rowactortest.NewClock()
	b := h.broker(rowactor.WithClock(clock))
	if _, err := b.Publish(ctx, h.table, h.queue, []byte("by hand"), rowactor.Unique("report@manual-rerun")); err != nil {
		t.Fatal(err)
	}
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), periodicPayload, rowactor.PeriodicName("report"))
	if err != nil {
		t.Fatal(err)
	}
	stepSeconds(clock, 3, func(step int) bool { return p.Published() >= int64(step) })
	p.Stop()
	if p.Published() < 2 {
		t.Errorf("a job whose name prefixes another row's key: published %d runs in 3 s of its clock, want at least 2\nlogs:\n%s", p.Published(), h.logs.String())
	}
}

// A schedule with no run (Cron("0 0 30 2 *"), 30 February) is refused by Cron or by
// Periodic with a *ConfigError, before anything runs.
func periodicScheduleThatNeverRunsScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	never, err := rowactor.Cron("0 0 30 2 *")
	if err != nil {
		return // refused at parse: fine
	}
	p, err := b.Periodic(ctx, h.table, h.queue, never, periodicPayload)
	var ce *rowactor.ConfigError
	if !errors.As(err, &ce) {
		t.Errorf("Periodic with a schedule that has no run (Next is zero): err %v, want a *ConfigError", err)
	}
	if p != nil {
		p.Stop()
	}
}

// PeriodicPublish(Unique("x")) is overridden by the run's own key; other options apply.
func periodicPublishOptionsScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	clock := rowactortest.NewClock()
	b := h.broker(rowactor.WithClock(clock))
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), periodicPayload, rowactor.PeriodicName("opt"),
		rowactor.PeriodicPublish(rowactor.Unique("fixed")))
	if err != nil {
		t.Fatal(err)
	}
	stepSeconds(clock, 3, func(step int) bool { return p.Published() >= int64(step) })
	p.Stop()
	if h.countKey("fixed") != 0 || h.countPrefix("opt") < 2 {
		t.Errorf("PeriodicPublish(Unique): %d rows keyed fixed, %d runs", h.countKey("fixed"), h.countPrefix("opt"))
	}
}

// A table whose key column has no unique index (made by hand, or its index dropped) is
// refused by Periodic with a *ConfigError, or a run raced by another publish keeps one row.
func periodicKeyWithoutUniqueIndexScenario(t *testing.T, h *harness, _ rowactor.Form) {
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
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), periodicPayload, rowactor.PeriodicName("nofence"))
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

// A name that makes keys longer than the key column (MariaDB VARBINARY(767)) or its index
// (PostgreSQL's btree row limit) is refused with a *ConfigError, or its runs are published.
func periodicLongNameScenario(t *testing.T, h *harness, _ rowactor.Form) {
	raw := make([]byte, 1500)
	_, _ = rand.Read(raw)
	name := hex.EncodeToString(raw) // 3000 bytes that do not compress
	ctx := context.Background()
	clock := rowactortest.NewClock()
	b := h.broker(rowactor.WithClock(clock))
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), periodicPayload, rowactor.PeriodicName(name))
	var ce *rowactor.ConfigError
	if errors.As(err, &ce) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	stepSeconds(clock, 3, func(step int) bool { return p.Published() >= int64(step) })
	p.Stop()
	if p.Published() == 0 {
		t.Errorf("a 3000-byte PeriodicName was accepted and no run was published:\n%s", tail(h.logs.String(), 800))
	}
}

// A payload function returning nil publishes the run (an empty payload).
func periodicNilPayloadScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	clock := rowactortest.NewClock()
	b := h.broker(rowactor.WithClock(clock))
	p, err := b.Periodic(ctx, h.table, h.queue, rowactor.Every(time.Second), func(context.Context, time.Time) ([]byte, error) { return nil, nil }, rowactor.PeriodicName("nil"))
	if err != nil {
		t.Fatal(err)
	}
	stepSeconds(clock, 3, func(step int) bool { return p.Published() >= int64(step) })
	p.Stop()
	if p.Published() == 0 {
		t.Errorf("a payload function returning nil: no run published:\n%s", tail(h.logs.String(), 800))
	}
}
