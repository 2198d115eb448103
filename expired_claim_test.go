package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/postgres"
)

var expiredClaimScenarios = []scenario{
	{
		name:  "a claim that returns after its lease ran out does not start its handler",
		forms: []rowactor.Form{rowactor.FormLease},
		run:   expiredClaimScenario,
	},
}

// expiredClaimScenario: the first claim's statement waits longer than the lease it writes
// (a trigger sleeps once), so the lease has run out when the claim returns and any claim
// may take the row again. Its handler must not start: the row is handled once, by a
// later claim.
func expiredClaimScenario(t *testing.T, h *harness, _ rowactor.Form) {
	if _, ok := h.d.(*postgres.Dialect); !ok {
		t.Skip("a one-shot slow claim is made with a PL/pgSQL trigger")
	}
	name := h.table.Name
	h.exec(fmt.Sprintf("CREATE TABLE %s_once (x int)", name))
	h.exec(fmt.Sprintf("INSERT INTO %s_once VALUES (1)", name))
	h.exec(fmt.Sprintf(`CREATE FUNCTION %s_slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
		IF EXISTS (SELECT 1 FROM %s_once) THEN DELETE FROM %s_once; PERFORM pg_sleep(2.5); END IF; RETURN NEW; END $$`, name, name, name))
	t.Cleanup(func() { h.exec(fmt.Sprintf("DROP FUNCTION IF EXISTS %s_slow() CASCADE", name)) })
	h.exec(fmt.Sprintf("CREATE TRIGGER %s_slow BEFORE UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s_slow()", name, name, name))
	b := h.broker()
	var calls atomic.Int64
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		calls.Add(1)
		time.Sleep(500 * time.Millisecond)
		return rowactor.Ack()
	}, rowactor.Lease(time.Second), rowactor.Workers(2))
	id := h.publish(b, 1)[0]
	s := h.waitSettled(1)[0]
	if s.Err != nil || s.Step != "ack" || s.ID != id {
		t.Fatalf("settlement %+v\nlogs:\n%s", s, h.logs.String())
	}
	h.quiet(500 * time.Millisecond)
	if n := calls.Load(); n != 1 {
		t.Fatalf("handled %d times, want once (the expired claim's handler must not start)\nlogs:\n%s", n, h.logs.String())
	}
	if !strings.Contains(h.logs.String(), "a claim returned after its lease ran out") {
		t.Fatalf("no warning about the expired claim\nlogs:\n%s", h.logs.String())
	}
	if h.row(id).exists {
		t.Fatal("row outlived its ack")
	}
}
