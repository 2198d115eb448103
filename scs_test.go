package rowactor_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/postgres"
)

// openPostgresURL opens a PostgreSQL dialect on url, closed when the test ends (after the
// brokers registered later shut down).
func openPostgresURL(t *testing.T, url string) dialects.Dialect {
	t.Helper()
	d, err := postgres.Open(context.Background(), url)
	if err != nil {
		t.Fatalf("postgres.Open: PostgreSQL is unreachable at %s: %v", url, err)
	}
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() { _ = d.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Errorf("postgres: closing the pool waited 15 s for a connection never released")
		}
	})
	return d
}

// scsOffDriver is the PostgreSQL driver whose connections run with
// standard_conforming_strings = off (a backslash in '…' escapes), as a role or database
// may be configured.
func scsOffDriver(t *testing.T) driver {
	t.Helper()
	drv := driverNamed(t, "postgres")
	url := postgresURL() + "&standard_conforming_strings=off" // postgresURL always has a query
	drv.name = "postgres-scs-off"
	drv.open = func(t *testing.T) func() dialects.Dialect {
		return func() dialects.Dialect { return openPostgresURL(t, url) }
	}
	drv.url = func(*testing.T, dialects.Dialect) string { return url }
	return drv
}

// escapedKey wraps an advisory key template in backslashes and a quote, which a literal
// rendered for standard_conforming_strings = on misreads when the setting is off.
func escapedKey(t *rowactor.Table) {
	if t.AdvisoryKey != "" {
		t.AdvisoryKey = `k\'` + t.AdvisoryKey + `\`
	}
}

// With standard_conforming_strings off, the advisory and FIFO scenarios and the NOTIFY
// wake behave as with it on; an advisory key template holding backslashes and quotes locks
// the host's text, the same key a process with the setting on locks for the row.
func TestStandardConformingStringsOff(t *testing.T) {
	t.Parallel()
	drv := scsOffDriver(t)
	probe := drv.open(t)()
	var setting string
	if err := probe.(*postgres.Dialect).Pool().QueryRow(context.Background(), "SHOW standard_conforming_strings").Scan(&setting); err != nil || setting != "off" {
		t.Fatalf("standard_conforming_strings = %q (%v), want off", setting, err)
	}

	t.Run("one key whatever the setting", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, drv, rowactor.FormAdvisory, func(tb *rowactor.Table) { tb.AdvisoryKey = tb.Name + "-{grp}" }, escapedKey)
		want := `k\'` + h.table.Name + "-" + h.queue + `\`
		on := openPostgresURL(t, postgresURL())
		var (
			inWork, peak atomic.Int64
			mu           sync.Mutex
			problems     []string
		)
		handler := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			n := inWork.Add(1)
			defer inWork.Add(-1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			var held bool
			err := pgPool(h.d).QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
				AND granted AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 0))`, want).Scan(&held)
			if err != nil || !held {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("row %d: key %q locked %v (%v)", d.ID(), want, held, err))
				mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
			return rowactor.Ack()
		}
		b := h.broker()
		ids := h.publish(b, 8)
		h.subscribe(b, handler, rowactor.Workers(4))
		h.subscribe(h.brokerOn(on), handler, rowactor.Workers(4)) // a process with the setting on
		for _, s := range h.waitSettled(8) {
			if s.Err != nil {
				t.Fatalf("settlement %+v", s)
			}
		}
		if p := peak.Load(); p != 1 {
			t.Fatalf("%d rows of one key in work at once: the two settings locked different keys", p)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(problems) > 0 {
			t.Fatalf("the delivery's key is not the host's text: %v", problems)
		}
		if h.drv.keyLocked(t, h.d, want) {
			t.Fatal("the key is still locked after every row settled")
		}
		for _, id := range ids {
			if h.row(id).exists {
				t.Fatalf("row %d left", id)
			}
		}
	})

	// The scenarios of the advisory form (with the escaped key), of FIFO groups, and of
	// the wake through NOTIFY.
	for _, sc := range scenarios {
		var forms []rowactor.Form
		switch {
		case sc.notifying:
			forms = drv.forms
		case sc.forms != nil && hasForm(sc.forms, rowactor.FormAdvisory):
			forms = []rowactor.Form{rowactor.FormAdvisory}
		}
		for _, fs := range fifoScenarios {
			if fs.name == sc.name {
				forms = fs.forms
			}
		}
		for _, form := range forms {
			t.Run(fmt.Sprintf("%s/%s", form, sc.name), func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, drv, form, append(append([]tableShape(nil), sc.shapes...), escapedKey)...)
				sc.run(t, h, form)
			})
		}
	}
}
