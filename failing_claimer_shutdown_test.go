package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

var failingClaimerShutdownScenarios = []scenario{
	{
		name: "shutdown with nothing in work does not wait for a failing claimer's backoff",
		run:  failingClaimerShutdownScenario,
	},
}

// failingClaimerShutdownScenario: the table is dropped under a running subscription, so
// every claim fails and its claimer waits a growing backoff (1 s, 2 s, ...) before the
// next. A service stopping meanwhile has nothing in work: Shutdown must report drained at
// once, not wait for the claim queued behind the backoff.
func failingClaimerShutdownScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	h.exec(fmt.Sprintf("DROP TABLE %s", h.table.Name))
	// After two failures the next claim waits two seconds for its claimer's restart.
	waitFor(t, func() bool { return strings.Contains(h.logs.String(), "failures=2") })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rep, err := b.Shutdown(ctx)
	if err != nil || !rep.Drained {
		t.Fatalf("Shutdown with nothing in work: drained %v, error %v; want drained at once\nlogs:\n%s", rep.Drained, err, h.logs.String())
	}
}
