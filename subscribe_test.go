package rowactor_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// TestSubscribeRefusesWhatCannotWork checks that every description or option that cannot
// work is refused at Subscribe with an error naming the table, the column or option, and
// a fix, and that nothing was claimed: the row keeps its attempt and has no lease.
func TestSubscribeRefusesWhatCannotWork(t *testing.T) {
	t.Parallel()
	ack := func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }
	cases := []struct {
		name  string
		edit  func(*rowactor.Table)
		opts  []rowactor.SubscribeOption
		names string // what the error must name
	}{
		{"missing column", func(t *rowactor.Table) { t.Attempt = "tries" }, nil, `column "tries"`},
		{"missing table", func(t *rowactor.Table) { t.Name += "_nope" }, nil, "does not exist"},
		{"max attempts without dead letter", nil, []rowactor.SubscribeOption{rowactor.MaxAttempts(3)}, "MaxAttempts"},
		{"dead letter without an attempt column", func(t *rowactor.Table) { t.Attempt = "" }, []rowactor.SubscribeOption{rowactor.DeadLetterGroup("dead")}, "attempt column"},
		{"missing error column", func(t *rowactor.Table) { t.Error = "last_error" }, nil, `column "last_error"`},
		{"max attempts without attempt column", func(t *rowactor.Table) { t.Attempt = "" }, []rowactor.SubscribeOption{rowactor.MaxAttempts(3), rowactor.DeadLetterGroup("dead")}, "attempt column"},
		{"dead-letter group without group column", func(t *rowactor.Table) { t.Group = "" }, []rowactor.SubscribeOption{rowactor.MaxAttempts(3), rowactor.DeadLetterGroup("dead")}, "DeadLetterGroup"},
		{"dead-letter table missing", func(t *rowactor.Table) { t.Group = "" }, []rowactor.SubscribeOption{rowactor.MaxAttempts(3), rowactor.DeadLetterTable("no_such_dead")}, "no_such_dead"},
		{"unknown key placeholder", func(t *rowactor.Table) { t.LockedUntil = ""; t.AdvisoryKey = "jobs-{acount_id}" }, nil, `column "acount_id"`},
		{"malformed key template", func(t *rowactor.Table) { t.LockedUntil = ""; t.AdvisoryKey = "jobs-{id" }, nil, "AdvisoryKey"},
		{"row lock form on SQLite", func(t *rowactor.Table) { t.LockedUntil = "" }, nil, "row lock"},
		{"isolation on SQLite", func(t *rowactor.Table) { t.Isolation = rowactor.Serializable }, nil, "Isolation"},
		{"invalid isolation", func(t *rowactor.Table) { t.Isolation = "snapshot" }, nil, "Isolation"},
		{"invalid mode", func(t *rowactor.Table) { t.Mode = "lazy" }, nil, "Mode"},
		{"lease on the database clock", func(t *rowactor.Table) { t.DatabaseClock = true }, nil, "DatabaseClock"},
		{"database clock not implemented", func(t *rowactor.Table) { t.LockedUntil = ""; t.AdvisoryKey = "k-{id}"; t.DatabaseClock = true }, nil, "DatabaseClock"},
		{"lease and advisory key together", func(t *rowactor.Table) { t.AdvisoryKey = "k-{id}" }, nil, "AdvisoryKey"},
		{"lease option on an advisory table", func(t *rowactor.Table) { t.LockedUntil = ""; t.AdvisoryKey = "k-{id}" }, []rowactor.SubscribeOption{rowactor.Lease(time.Minute)}, "Lease"},
		{"no workers", nil, []rowactor.SubscribeOption{rowactor.Workers(0)}, "Workers"},
		{"negative prefetch", nil, []rowactor.SubscribeOption{rowactor.Prefetch(-1)}, "Prefetch"},
		{"prefetch outside the lease form", func(t *rowactor.Table) { t.LockedUntil = ""; t.AdvisoryKey = "k-{id}" }, []rowactor.SubscribeOption{rowactor.Prefetch(4)}, "Prefetch"},
		{"a queue name is required with groups", nil, nil, "queue"},
		{"payload required", func(t *rowactor.Table) { t.Payload = "" }, nil, "Payload"},
	}
	drv := driverNamed(t, "sqlite")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			b := h.broker()
			id := h.publish(b, 1)[0]
			tb := h.table
			if tc.edit != nil {
				tc.edit(&tb)
			}
			queue := h.queue
			if tc.name == "a queue name is required with groups" {
				queue = ""
			}
			_, err := b.Subscribe(context.Background(), tb, queue, ack, tc.opts...)
			var ce *rowactor.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, rowactor.ErrConfig) {
				t.Fatalf("Subscribe error %v, want a *ConfigError", err)
			}
			msg := err.Error()
			if ce.Table != tb.Name || !strings.Contains(msg, tb.Name) || !strings.Contains(msg, tc.names) || ce.Fix == "" {
				t.Fatalf("error %q should name table %q, %q and a fix", msg, tb.Name, tc.names)
			}
			time.Sleep(100 * time.Millisecond)
			if st := h.row(id); !st.exists || st.attempt != 1 || st.lockedUntil != nil {
				t.Fatalf("a refused subscription touched the row: %+v", st)
			}
		})
	}
}

func TestSubscribeTwiceIsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, driverNamed(t, "sqlite"), rowactor.FormLease)
	b := h.broker()
	ack := func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }
	h.subscribe(b, ack)
	if _, err := b.Subscribe(context.Background(), h.table, h.queue, ack); !errors.Is(err, rowactor.ErrAlreadySubscribed) {
		t.Fatalf("second Subscribe: %v, want ErrAlreadySubscribed", err)
	}
}

// TestClaimerRestartsWithBackoff breaks the table under a running subscription: claims
// fail with a schema fault, which is logged as an error naming the fault, and the claimer
// is restarted with a growing delay rather than spinning; once the table is back the
// queue drains without restarting the broker, and the log says claims succeed again.
func TestClaimerRestartsWithBackoff(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			logs := &syncBuffer{}
			b := h.broker(rowactor.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))
			h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() },
				rowactor.PollInterval(5*time.Millisecond))
			h.exec("ALTER TABLE " + h.table.Name + " RENAME TO " + h.table.Name + "_away")
			defer func() {
				if t.Failed() {
					t.Logf("logs:\n%s", logs)
				}
			}()
			time.Sleep(3 * time.Second)
			failed := logs.String()
			failures := strings.Count(failed, "claim failed")
			// Polling every 5 ms would fail about 600 times in 3 s; a schema fault's
			// backoff starts at a second and doubles: two or three failures.
			if failures < 2 || failures > 5 {
				t.Fatalf("%d failed claims in 3 s; want a few, spaced by the schema backoff", failures)
			}
			if n := strings.Count(failed, "level=ERROR msg=\"rowactor: claim failed: the table, a column or a privilege is missing"); n != failures {
				t.Fatalf("%d of %d failed claims logged as schema errors", n, failures)
			}
			if !strings.Contains(failed, "fault=schema") {
				t.Fatalf("the log does not name the fault")
			}
			h.exec("ALTER TABLE " + h.table.Name + "_away RENAME TO " + h.table.Name)
			h.publish(b, 3)
			for _, s := range h.waitSettled(3) {
				if s.Err != nil {
					t.Fatalf("settlement after recovery: %+v", s)
				}
			}
			if !strings.Contains(logs.String(), "claims succeed again") {
				t.Fatalf("no log line says claims succeed again")
			}
		})
	}
}
