package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
)

func init() {
	scenarios = append(scenarios, scenario{
		name:  "a publish during a claim that came back short is claimed without waiting for the poll",
		forms: []rowactor.Form{rowactor.FormLease, rowactor.FormAdvisory},
		run:   wakeDuringClaimScenario,
	})
}

// slowUpdates makes every UPDATE of the harness's table take delay, with a trigger: the
// lease claim and the advisory take update their rows, so their claims become slow. false
// where the database has no sleep a trigger can call (SQLite).
func slowUpdates(t *testing.T, h *harness, delay time.Duration) bool {
	return sleepTrigger(t, h, "UPDATE", delay)
}

// sleepTrigger makes every event ("UPDATE", "DELETE") on the harness's table sleep delay
// in a BEFORE trigger; false where the database has no sleep a trigger can call.
func sleepTrigger(t *testing.T, h *harness, event string, delay time.Duration) bool {
	t.Helper()
	name := h.table.Name + "_sleep_" + strings.ToLower(event)
	switch h.d.(type) {
	case *postgres.Dialect:
		h.exec(fmt.Sprintf(`CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(%g); RETURN COALESCE(NEW, OLD); END $$`, name, delay.Seconds()))
		t.Cleanup(func() { h.exec(fmt.Sprintf("DROP FUNCTION IF EXISTS %s() CASCADE", name)) })
		h.exec(fmt.Sprintf("CREATE TRIGGER %s BEFORE %s ON %s FOR EACH ROW EXECUTE FUNCTION %s()", name, event, h.table.Name, name))
	case *mysql.Dialect:
		h.exec(fmt.Sprintf("CREATE TRIGGER %s BEFORE %s ON %s FOR EACH ROW SET @rowactor_sleep = SLEEP(%g)", name, event, h.table.Name, delay.Seconds()))
	default:
		return false
	}
	return true
}

// wakeDuringClaimScenario: a claim that takes 600 ms reads the table before a second row
// is published, and comes back with the first row alone (short of the workers free). The
// publish's wake came while it ran: it must cause one more claim, not wait for the poll
// (one minute here).
func wakeDuringClaimScenario(t *testing.T, h *harness, _ rowactor.Form) {
	if !slowUpdates(t, h, 600*time.Millisecond) {
		t.Skip("SQLite has no sleep for a trigger: no claim can be made slow")
	}
	b := h.broker()
	started := make(chan int64, 4)
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- d.ID()
		return rowactor.Ack()
	}, rowactor.Workers(4), rowactor.PollInterval(time.Minute))
	first := h.publish(b, 1)[0]
	time.Sleep(200 * time.Millisecond) // the claim is under way, in the trigger
	second := h.publish(b, 1)[0]
	seen := map[int64]bool{}
	for len(seen) < 2 {
		select {
		case id := <-started:
			seen[id] = true
		case <-time.After(15 * time.Second):
			t.Fatalf("rows delivered %v within 15 s of publishing %d and %d (poll 1 min): the wake during the claim was lost", seen, first, second)
		}
	}
	h.waitSettled(2)
}
