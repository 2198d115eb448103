package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rowactor/rowactor"
)

func withoutHeaders(t *rowactor.Table) { t.Headers = "" }

// Headers given to a table described without a headers column are refused with a
// *ConfigError naming the option and the fix, before anything is written: never stored
// without them. Tracing's own traceparent is skipped silently, and so is WithHeaders of
// nothing.
func TestHeadersWithoutAHeadersColumnAreRefused(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease, withoutHeaders)
			tel := newTelemetry(t)
			b := h.broker(tel.options()...)
			ctx := context.Background()
			rows := func() int {
				return h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s", h.table.Name))
			}
			refused := func(what string, err error) {
				t.Helper()
				var ce *rowactor.ConfigError
				if !errors.As(err, &ce) || !errors.Is(err, rowactor.ErrConfig) {
					t.Fatalf("%s: got %v, want a *ConfigError", what, err)
				}
				if ce.Option != "WithHeaders" || ce.Table != h.table.Name || !strings.Contains(ce.Fix, "Table.Headers") {
					t.Fatalf("%s: %+v, want the option WithHeaders, the table and a fix naming Table.Headers", what, ce)
				}
			}

			_, err := b.Publish(ctx, h.table, h.queue, []byte("p"), rowactor.WithHeaders(map[string]string{"tenant": "a"}))
			refused("Publish", err)
			tx, _, rollback := h.drv.begin(t, h.d)
			_, err = b.PublishTx(ctx, tx, h.table, h.queue, []byte("p"), rowactor.WithHeaders(map[string]string{"tenant": "a"}))
			refused("PublishTx", err)
			if err := rollback(); err != nil {
				t.Fatal(err)
			}
			if n := rows(); n != 0 {
				t.Fatalf("%d rows written by refused publishes", n)
			}
			if spans := tel.named("publish"); len(spans) != 0 {
				t.Fatalf("a refused publish started %d spans", len(spans))
			}

			// No headers of the user's: the traceparent is skipped, silently.
			if _, err := b.Publish(ctx, h.table, h.queue, []byte("p")); err != nil {
				t.Fatalf("Publish without headers: %v", err)
			}
			if _, err := b.Publish(ctx, h.table, h.queue, []byte("p"), rowactor.WithHeaders(nil)); err != nil {
				t.Fatalf("Publish with no headers: %v", err)
			}
			if n := rows(); n != 2 {
				t.Fatalf("%d rows, want 2", n)
			}
			if logs := h.logs.String(); logs != "" {
				t.Fatalf("a publish without headers logged:\n%s", logs)
			}
		})
	}
}
