package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
)

var wakeDuringClaimScenarios = []scenario{
	{
		name:  "a publish during a claim that came back short is claimed without waiting for the poll",
		forms: []rowactor.Form{rowactor.FormLease, rowactor.FormAdvisory},
		run:   wakeDuringClaimScenario,
	}, {
		name:  "a row retried while a claim is in flight is claimed again at once, not at the next poll",
		forms: []rowactor.Form{rowactor.FormLease, rowactor.FormAdvisory},
		run:   freedDuringClaimScenario,
	},
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

// slowClaims makes the claims of the harness's table take delay, with a trigger on the
// UPDATE a claim runs (the lease stamp, the advisory take); the lease form's release
// (locked_until = NULL) stays fast. false on SQLite (no sleep a trigger can call).
func slowClaims(t *testing.T, h *harness, form rowactor.Form, delay time.Duration) bool {
	t.Helper()
	name := h.table.Name
	switch h.d.(type) {
	case *postgres.Dialect:
		when := ""
		if form == rowactor.FormLease {
			when = " WHEN (NEW.locked_until IS NOT NULL)"
		}
		h.exec(fmt.Sprintf(`CREATE FUNCTION %s_slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(%g); RETURN NEW; END $$`, name, delay.Seconds()))
		t.Cleanup(func() { h.exec(fmt.Sprintf("DROP FUNCTION IF EXISTS %s_slow() CASCADE", name)) })
		h.exec(fmt.Sprintf("CREATE TRIGGER %s_slow BEFORE UPDATE ON %s FOR EACH ROW%s EXECUTE FUNCTION %s_slow()", name, name, when, name))
	case *mysql.Dialect:
		cond := "TRUE"
		if form == rowactor.FormLease {
			cond = "NEW.locked_until IS NOT NULL"
		}
		h.exec(fmt.Sprintf("CREATE TRIGGER %s_slow BEFORE UPDATE ON %s FOR EACH ROW SET @rowactor_slow = IF(%s, SLEEP(%g), 0)", name, name, cond, delay.Seconds()))
	default:
		return false
	}
	return true
}

// freedDuringClaimScenario proves SPEC's invariant "a free worker gets a due row ... at
// once after the settlement that freed it" when the settlement lands during a claim.
// Row A is in work; row B is published, and its claim (slow: 800 ms) is under way when A's
// handler returns Retry, which returns A to the queue at once (lease released; advisory
// key unlocked). The claim in flight read the table before A came back and returns B
// alone, short of the free workers it asked for; the settlement that freed A must not be
// forgotten then, or A waits for the poll (one minute here) with two workers idle. (B's
// handler keeps running, so that no later settlement happens to set the subscription due
// again.)
func freedDuringClaimScenario(t *testing.T, h *harness, form rowactor.Form) {
	if _, isMySQL := h.d.(*mysql.Dialect); isMySQL && form == rowactor.FormLease {
		// The release of A can wait on the slow claim's locks (the claim's locking read
		// passes A's index entry), so it lands after the claim returned; timing-dependent.
		t.Skip("MySQL lease: A's release may wait for the claim's transaction; see the advisory variant")
	}
	if !slowClaims(t, h, form, 800*time.Millisecond) {
		t.Skip("SQLite has no sleep for a trigger: no claim can be made slow")
	}
	// Poll only: on PostgreSQL a publish wakes the subscription twice (at once, and by its
	// NOTIFY), and the second wake would hide the forgotten settlement.
	b := h.broker(rowactor.WithPollOnly())
	var mu sync.Mutex
	deliveries := map[int64]int{}
	started := make(chan int64, 16)
	release := make(chan struct{})
	hold := make(chan struct{}) // B's handler runs until the test ends
	defer close(hold)
	var firstID atomic.Int64
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		mu.Lock()
		deliveries[d.ID()]++
		n := deliveries[d.ID()]
		mu.Unlock()
		started <- d.ID()
		if firstID.CompareAndSwap(0, d.ID()) || (d.ID() == firstID.Load() && n == 1) {
			<-release
			return rowactor.Retry()
		}
		if d.ID() != firstID.Load() {
			<-hold
		}
		return rowactor.Ack()
	}, rowactor.Workers(3), rowactor.PollInterval(time.Minute))
	time.Sleep(time.Second) // the claim at start found nothing; the subscription waits for a wake
	first := h.publish(b, 1)[0]
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatal("A was not delivered within 15 s of its publish")
	}
	time.Sleep(300 * time.Millisecond) // A's claim came back short: the subscription is idle, probing
	second := h.publish(b, 1)[0]       // wakes a claim, which takes 800 ms in the trigger
	time.Sleep(300 * time.Millisecond)
	close(release) // A returns Retry while B's claim is in flight
	retried := time.Now()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case id := <-started:
			if id == first {
				if d := time.Since(retried); d > 5*time.Second {
					t.Fatalf("A delivered again %v after its retry", d)
				}
				return
			}
			_ = second
		case <-deadline:
			t.Fatalf("row %d, retried %v ago while the claim of row %d was in flight, was not delivered again "+
				"(2 of 3 workers idle; poll 1 min): the settlement that freed it was forgotten when the claim came back short\nlogs:\n%s",
				first, time.Since(retried).Round(time.Millisecond), second, h.logs.String())
		}
	}
}
