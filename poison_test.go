package rowactor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// Poison rows: one row must never stop its queue. Its attempt counter saturates at the
// column type's maximum instead of failing the statement that counts it, and a row whose
// data cannot be read is set aside (dead-lettered, or parked where claims skip it) while
// the rows around it are delivered.

// poisonScenario is one behaviour, run over every (database, form) it applies to.
type poisonScenario struct {
	name   string
	dbs    []string        // nil: every database
	forms  []rowactor.Form // nil: every form the database serves
	shapes []tableShape
	run    func(t *testing.T, h *harness, form rowactor.Form)
}

// setAsideYear is the year from which a time column reads as "parked": rowactor parks a
// row it sets aside at 9999-12-31.
const setAsideYear = 9999

// narrowAttempt gives the harness's table the attempt column a table created before
// rowactor rendered integer attempts has (smallint), and returns the largest attempt the
// column holds as rowactor counts it. SQLite's integers are 64-bit: rowactor caps its
// attempts at 2147483647.
func narrowAttempt(h *harness) int {
	h.t.Helper()
	switch h.drv.name {
	case "postgres":
		h.exec(fmt.Sprintf("ALTER TABLE %s ALTER COLUMN attempt TYPE smallint", h.table.Name))
		return 32767
	case "mysql":
		h.exec(fmt.Sprintf("ALTER TABLE %s MODIFY attempt SMALLINT NOT NULL DEFAULT 1", h.table.Name))
		return 32767
	}
	return 2147483647
}

// unreadableDBs are the databases where a row can hold a value rowactor cannot read.
var unreadableDBs = []string{"sqlite", "mysql"}

// insertUnreadable inserts a row whose attempt cannot be read as an integer: on SQLite a
// REAL (SQLite keeps it in an INTEGER column), on MySQL an unsigned BIGINT beyond what an
// int64 holds (the column is made BIGINT UNSIGNED first).
func insertUnreadable(h *harness) int64 {
	h.t.Helper()
	cols, vals := "payload, attempt", "?, 2.5"
	if h.drv.name == "mysql" {
		h.exec(fmt.Sprintf("ALTER TABLE %s MODIFY attempt BIGINT UNSIGNED NOT NULL DEFAULT 1", h.table.Name))
		vals = "?, 18446744073709551615"
	}
	args := []any{[]byte("unreadable")}
	if h.table.Group != "" {
		cols, vals = cols+", grp", vals+", ?"
		args = append(args, h.queue)
	}
	h.exec(fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s)", h.table.Name, cols, vals), args...)
	return int64(h.drv.count(h.t, h.d, fmt.Sprintf("SELECT max(id) FROM %s", h.table.Name)))
}

// setAside runs the scenario of a row that cannot be read: three rows, the unreadable
// one, three rows; every readable row is delivered and acked (well within the lease: none
// is left leased behind the unreadable one), the unreadable one never reaches the handler
// and is logged as an error naming the table, the row and the fix. opts add the
// subscription's dead letter. It returns the unreadable row's id once the others are
// acked.
func setAside(t *testing.T, h *harness, opts ...rowactor.SubscribeOption) int64 {
	t.Helper()
	b := h.broker()
	healthy := h.publish(b, 3)
	bad := insertUnreadable(h)
	healthy = append(healthy, h.publish(b, 3)...)
	c := newCalls()
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome { c.add(d); return rowactor.Ack() },
		append([]rowactor.SubscribeOption{rowactor.Workers(4)}, opts...)...)
	for _, s := range h.waitSettled(len(healthy)) {
		if s.Err != nil || s.Step != "ack" || s.ID == bad {
			t.Fatalf("settlement %+v", s)
		}
	}
	for _, id := range healthy {
		if h.row(id).exists {
			t.Fatalf("row %d still exists after its ack", id)
		}
	}
	h.quiet(300 * time.Millisecond)
	if got := c.of(bad); len(got) != 0 {
		t.Fatalf("the unreadable row %d reached the handler: %v", bad, got)
	}
	waitFor(t, func() bool {
		return strings.Contains(h.logs.String(), "level=ERROR") && strings.Contains(h.logs.String(), fmt.Sprintf("id=%d", bad))
	})
	logs := h.logs.String()
	for _, want := range []string{"table=" + h.table.Name, fmt.Sprintf("id=%d", bad), "fix="} {
		if !strings.Contains(logs, want) {
			t.Fatalf("the error log lacks %q:\n%s", want, logs)
		}
	}
	return bad
}

func parked(tm *time.Time) bool { return tm != nil && tm.Year() >= setAsideYear }

// unreadableRow reads an unreadable row's state, leaving its attempt (which does not read
// as an integer) out.
func unreadableRow(t *testing.T, h *harness, tb rowactor.Table, id int64) rowState {
	t.Helper()
	col := func(name string) string {
		if name == "" {
			return "NULL"
		}
		return "`" + name + "`"
	}
	query := "SELECT " + col(tb.Group) + ", " + col(tb.LockedUntil) + ", " + col(tb.RetryAfter) +
		" FROM `" + tb.Name + "` WHERE `" + tb.ID + "` = ?"
	var (
		st    rowState
		group sql.NullString
		err   error
	)
	if h.drv.name == "mysql" {
		var locked, retry sql.NullTime
		err = mysqlDB(h.d).QueryRow(query, id).Scan(&group, &locked, &retry)
		if locked.Valid {
			st.lockedUntil = &locked.Time
		}
		if retry.Valid {
			st.retryAfter = &retry.Time
		}
	} else {
		var locked, retry sql.NullString
		err = sqliteDB(h.d).QueryRow(query, id).Scan(&group, &locked, &retry)
		st.lockedUntil, st.retryAfter = sqliteTime(t, locked), sqliteTime(t, retry)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return rowState{}
	}
	if err != nil {
		t.Fatalf("row %d: %v", id, err)
	}
	st.exists, st.group = true, group.String
	return st
}

var poisonScenarios = []poisonScenario{
	{name: "a row at the attempt cap never stops its queue", shapes: []tableShape{withProcessedAt}, run: func(t *testing.T, h *harness, form rowactor.Form) {
		max := narrowAttempt(h)
		b := h.broker()
		poison := h.publish(b, 2)
		healthy := h.publish(b, 6)
		h.exec(fmt.Sprintf("UPDATE %s SET attempt = ? WHERE id = ?", h.table.Name), max, poison[0])
		h.exec(fmt.Sprintf("UPDATE %s SET attempt = ? WHERE id = ?", h.table.Name), max-1, poison[1])
		isPoison := map[int64]bool{poison[0]: true, poison[1]: true}
		sub := h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			if isPoison[d.ID()] {
				time.Sleep(10 * time.Millisecond)
				return rowactor.Retry() // no MaxAttempts: retried for ever
			}
			return rowactor.Ack()
		}, rowactor.Workers(4))
		acked, retried := map[int64]bool{}, map[int64]int{}
		deadline := time.After(15 * time.Second)
		for len(acked) < len(healthy) || retried[poison[0]] < 3 || retried[poison[1]] < 3 {
			select {
			case s := <-h.settled:
				if s.Err != nil {
					t.Fatalf("settlement %+v\nlogs:\n%s", s, h.logs.String())
				}
				switch {
				case s.Step == "ack" && !isPoison[s.ID]:
					acked[s.ID] = true
				case s.Step == "retry" && isPoison[s.ID]:
					retried[s.ID]++
				default:
					t.Fatalf("settlement %+v", s)
				}
			case <-deadline:
				t.Fatalf("acked %d of %d rows, retried the rows at the cap %v times\nlogs:\n%s", len(acked), len(healthy), retried, h.logs.String())
			}
		}
		for _, id := range healthy {
			if st := h.row(id); !st.exists || st.processedAt == nil || st.lockedUntil != nil || st.attempt != attemptColumn(form, 1, 0) {
				t.Fatalf("row %d after its ack: %+v", id, st)
			}
		}
		for _, id := range poison {
			if st := h.row(id); !st.exists || st.attempt != max || st.processedAt != nil || st.group != h.queue {
				t.Fatalf("row %d at the cap: %+v, want attempt %d", id, st, max)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := sub.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if logs := h.logs.String(); strings.Contains(logs, "claim failed") {
			t.Fatalf("claims failed:\n%s", logs)
		}
		for len(h.settled) > 0 {
			<-h.settled
		}
	}},
	{name: "an unreadable row is parked in retry_after and the rows around it are delivered", dbs: unreadableDBs,
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			bad := setAside(t, h)
			st := unreadableRow(t, h, h.table, bad)
			if !st.exists || !parked(st.retryAfter) || st.lockedUntil != nil || st.group != h.queue {
				t.Fatalf("unreadable row %+v, want retry_after in %d and no lease", st, setAsideYear)
			}
		}},
	{name: "an unreadable row without retry_after is skipped by later claims", dbs: unreadableDBs, shapes: []tableShape{withoutRetryAfter},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			bad := setAside(t, h)
			st := unreadableRow(t, h, h.table, bad)
			if !st.exists || st.group != h.queue {
				t.Fatalf("unreadable row %+v", st)
			}
			if form == rowactor.FormLease && !parked(st.lockedUntil) {
				t.Fatalf("unreadable row %+v, want its lease until %d", st, setAsideYear)
			}
		}},
	{name: "an unreadable row is moved to the dead-letter group", dbs: unreadableDBs, run: func(t *testing.T, h *harness, form rowactor.Form) {
		bad := setAside(t, h, rowactor.MaxAttempts(3), rowactor.DeadLetterGroup("dead"))
		if st := unreadableRow(t, h, h.table, bad); !st.exists || st.group != "dead" || st.lockedUntil != nil || st.retryAfter != nil {
			t.Fatalf("unreadable row %+v, want it in group dead", st)
		}
	}},
	{name: "an unreadable row is moved into the dead-letter table", dbs: []string{"sqlite"}, shapes: []tableShape{withoutGroup},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			dead := h.table
			dead.Name = h.table.Name + "_dead"
			h.createTable(dead)
			bad := setAside(t, h, rowactor.MaxAttempts(3), rowactor.DeadLetterTable(dead.Name))
			if unreadableRow(t, h, h.table, bad).exists {
				t.Fatal("the unreadable row is still in the queue table")
			}
			if st := unreadableRow(t, h, dead, bad); !st.exists || st.lockedUntil != nil {
				t.Fatalf("dead-letter table row %+v", st)
			}
		}},
	{name: "an unreadable row in a batch is set aside with the batch's commit", dbs: []string{"mysql"}, forms: rowLockOnly,
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b := h.broker()
			healthy := h.publish(b, 3)
			bad := insertUnreadable(h)
			healthy = append(healthy, h.publish(b, 3)...)
			c := newCalls()
			h.subscribeBatch(b, 4, func(_ context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
				out := make([]rowactor.Outcome, len(ds))
				for i, d := range ds {
					c.add(d)
					out[i] = rowactor.Ack()
				}
				return out
			})
			for _, s := range h.waitSettled(len(healthy)) {
				if s.Err != nil || s.Step != "ack" || s.ID == bad {
					t.Fatalf("settlement %+v", s)
				}
			}
			h.quiet(300 * time.Millisecond)
			if got := c.of(bad); len(got) != 0 {
				t.Fatalf("the unreadable row reached the handler: %v", got)
			}
			if st := unreadableRow(t, h, h.table, bad); !st.exists || !parked(st.retryAfter) {
				t.Fatalf("unreadable row %+v, want retry_after in %d", st, setAsideYear)
			}
			if !strings.Contains(h.logs.String(), fmt.Sprintf("id=%d", bad)) {
				t.Fatalf("no error logged:\n%s", h.logs.String())
			}
		}},
	{name: "a row whose dead-letter move fails on its data is parked and the queue goes on", dbs: []string{"postgres", "mysql"},
		shapes: []tableShape{withoutGroup}, run: func(t *testing.T, h *harness, form rowactor.Form) {
			// The dead-letter table's attempt column is narrower than the queue table's: the
			// move of a row at attempt 40000 fails on its data (out of range).
			dead := h.table
			dead.Name = h.table.Name + "_dead"
			h.createTable(dead)
			switch h.drv.name {
			case "postgres":
				h.exec(fmt.Sprintf("ALTER TABLE %s ALTER COLUMN attempt TYPE smallint", dead.Name))
			case "mysql":
				h.exec(fmt.Sprintf("ALTER TABLE %s MODIFY attempt SMALLINT NOT NULL DEFAULT 1", dead.Name))
			}
			b := h.broker()
			bad := h.publish(b, 1)[0]
			h.exec(fmt.Sprintf("UPDATE %s SET attempt = 40000 WHERE id = ?", h.table.Name), bad)
			healthy := h.publish(b, 4)
			c := newCalls()
			h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
				c.add(d)
				if d.ID() == bad {
					return rowactor.Retry()
				}
				return rowactor.Ack()
			}, append(leaseOptions(form, time.Second), rowactor.Workers(1), rowactor.MaxAttempts(3), rowactor.DeadLetterTable(dead.Name))...)
			acked := map[int64]bool{}
			deadline := time.After(15 * time.Second)
			for len(acked) < len(healthy) {
				select {
				case s := <-h.settled:
					switch {
					case s.ID == bad && s.Step == "dead_letter" && s.Err != nil: // the move that fails
					case s.ID != bad && s.Step == "ack" && s.Err == nil:
						acked[s.ID] = true
					default:
						t.Fatalf("settlement %+v", s)
					}
				case <-deadline:
					t.Fatalf("acked %d of %d rows\nlogs:\n%s", len(acked), len(healthy), h.logs.String())
				}
			}
			waitFor(t, func() bool { return parked(h.row(bad).retryAfter) })
			if st := h.row(bad); st.lockedUntil != nil || st.attempt < 40000 {
				t.Fatalf("row set aside %+v", st)
			}
			if h.drv.state(t, h.d, dead, bad).exists {
				t.Fatal("the row reached the dead-letter table")
			}
			if got := c.of(bad); len(got) != 1 {
				t.Fatalf("the row set aside was delivered %d times, want once (before its move failed)", len(got))
			}
			// The set-aside is logged once its statement committed: a moment after the row
			// shows it.
			wants := []string{"level=ERROR", fmt.Sprintf("id=%d", bad), "set_aside=parked_retry_after", "fix="}
			logged := func() bool {
				for _, want := range wants {
					if !strings.Contains(h.logs.String(), want) {
						return false
					}
				}
				return true
			}
			for deadline := time.Now().Add(10 * time.Second); !logged(); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the logs lack one of %q after 10 s:\n%s", wants, h.logs.String())
				}
			}
		}},
	{name: "a settlement a trigger refuses returns the row as its form does, and it is handled once when let through",
		run: refusedSettlementScenario},
	{name: "a settlement a trigger refuses returns the row as its form does, also in a table without retry_after",
		shapes: []tableShape{withoutRetryAfter}, run: refusedSettlementScenario},
	{name: "Schema renders a 32-bit integer attempt column", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		ddl, err := rowactor.Schema(h.d, h.table)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			"postgres": `"attempt" integer NOT NULL DEFAULT 1`,
			"mysql":    "`attempt` INT NOT NULL DEFAULT 1",
			"sqlite":   "`attempt` INTEGER NOT NULL DEFAULT 1",
		}[h.drv.name]
		if !strings.Contains(ddl, want+",") {
			t.Fatalf("Schema renders:\n%s\nwant %s", ddl, want)
		}
		// The harness created its table from Schema: the live column is a 32-bit integer.
		query := map[string]string{
			"postgres": "SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = ? AND column_name = 'attempt' AND data_type = 'integer'",
			"mysql":    "SELECT count(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'attempt' AND DATA_TYPE = 'int'",
			"sqlite":   "SELECT count(*) FROM pragma_table_info(?) WHERE name = 'attempt' AND type = 'INTEGER'",
		}[h.drv.name]
		if n := h.drv.count(t, h.d, query, h.table.Name); n != 1 {
			t.Fatalf("the table's attempt column is not a 32-bit integer (%d rows for %s)", n, query)
		}
	}},
}

// refuseDeletes makes the harness's table refuse every DELETE while its flag table
// (returned) has a row: a BEFORE DELETE trigger raising as each database's triggers do
// (PL/pgSQL RAISE EXCEPTION, SIGNAL SQLSTATE '45000', RAISE(ABORT)). The refusal is the
// database's, not the row's data.
func refuseDeletes(h *harness) (flag string) {
	h.t.Helper()
	flag = h.table.Name + "_closed"
	const refusal = "settlements are closed"
	switch h.drv.name {
	case "postgres":
		fn := flag + "_refuse"
		h.exec("CREATE TABLE " + pgQuote(flag) + " (closed integer)")
		h.exec("CREATE FUNCTION " + fn + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF EXISTS (SELECT 1 FROM " + pgQuote(flag) +
			") THEN RAISE EXCEPTION '" + refusal + "'; END IF; RETURN OLD; END $$")
		pool := pgPool(h.d)
		h.t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP FUNCTION IF EXISTS "+fn+"() CASCADE") })
		h.exec("CREATE TRIGGER " + pgQuote(fn) + " BEFORE DELETE ON " + pgQuote(h.table.Name) + " FOR EACH ROW EXECUTE FUNCTION " + fn + "()")
	case "mysql":
		h.exec("CREATE TABLE `" + flag + "` (closed INT)")
		h.exec("CREATE TRIGGER `" + flag + "_refuse` BEFORE DELETE ON `" + h.table.Name + "` FOR EACH ROW BEGIN IF EXISTS (SELECT 1 FROM `" + flag +
			"`) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '" + refusal + "'; END IF; END")
	default:
		h.exec("CREATE TABLE " + flag + " (closed INTEGER)")
		h.exec("CREATE TRIGGER " + flag + "_refuse BEFORE DELETE ON " + h.table.Name + " WHEN EXISTS (SELECT 1 FROM " + flag +
			") BEGIN SELECT RAISE(ABORT, '" + refusal + "'); END")
	}
	h.exec("INSERT INTO " + flag + " (closed) VALUES (1)")
	return flag
}

// refusedSettlementScenario: a trigger refuses the row's ack (its DELETE). The refusal is
// not the row's data: the row returns as its form returns a row whose settlement failed
// (at once in the row lock and advisory forms, when its lease runs out in the lease form),
// never set aside, on every database. Its second delivery opens the trigger and acks: the
// row is gone, handled twice in all.
func refusedSettlementScenario(t *testing.T, h *harness, form rowactor.Form) {
	flag := refuseDeletes(h)
	b := h.broker()
	id := h.publish(b, 1)[0]
	c := newCalls()
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		c.add(d)
		if c.n.Load() > 1 {
			h.exec("DELETE FROM " + flag)
		}
		return rowactor.Ack()
	}, leaseOptions(form, time.Second)...)
	got := h.waitDeliveries(2)
	if got[0].Step != "ack" || got[0].Err == nil || !strings.Contains(got[0].Err.Error(), "settlements are closed") {
		t.Fatalf("the refused settlement: %+v", got[0])
	}
	if got[1].Step != "ack" || got[1].Err != nil || got[1].ID != id {
		t.Fatalf("the settlement let through: %+v\nlogs:\n%s", got[1], h.logs.String())
	}
	h.quiet(500 * time.Millisecond)
	if st := h.row(id); st.exists {
		t.Fatalf("row after its ack: %+v", st)
	}
	if got := c.of(id); len(got) != 2 {
		t.Fatalf("the row was handled %d times, want twice (refused, then let through)", len(got))
	}
	if strings.Contains(h.logs.String(), "set aside") {
		t.Fatalf("a refused settlement set the row aside:\n%s", h.logs.String())
	}
}

func TestPoison(t *testing.T) {
	t.Parallel()
	if len(drivers) == 0 {
		t.Fatal("no database drivers in the matrix")
	}
	for _, drv := range drivers {
		for _, form := range drv.forms {
			for _, sc := range poisonScenarios {
				if sc.forms != nil && !hasForm(sc.forms, form) {
					continue
				}
				if sc.dbs != nil && !hasDB(sc.dbs, drv.name) {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/%s", drv.name, form, sc.name), func(t *testing.T) {
					t.Parallel()
					h := newHarness(t, drv, form, sc.shapes...)
					sc.run(t, h, form)
				})
			}
		}
	}
}

func hasDB(dbs []string, name string) bool {
	for _, d := range dbs {
		if d == name {
			return true
		}
	}
	return false
}

// settlementNoteScenarios run in the forms whose claims wait for a settlement's note.
var settlementNoteScenarios = []scenario{
	{name: "a claim waits for a failed settlement's note, never for the service's settlement hook",
		forms: []rowactor.Form{rowactor.FormRowLock, rowactor.FormAdvisory}, run: slowHookScenario},
}

// slowHookScenario: a row whose settlement made it due at once (Retry) is claimed again
// while the service's WithOnSettled hook for that settlement still runs (8 s here). The
// claim waits for the settlement's failure note (Poison.Settled), never for the hook:
// another row published meanwhile reaches a free worker within a poll or so, not when
// the hook returns.
func slowHookScenario(t *testing.T, h *harness, _ rowactor.Form) {
	var first atomic.Int64
	hookHeld := make(chan struct{})
	b := h.broker(rowactor.WithOnSettled(func(s rowactor.Settlement) {
		if s.ID == first.Load() && s.Attempt == 1 {
			select {
			case <-hookHeld:
			case <-time.After(8 * time.Second):
			}
		}
	}))
	t.Cleanup(func() { close(hookHeld) }) // before the broker's Shutdown, registered earlier
	first.Store(h.publish(b, 1)[0])
	handled := make(chan int64, 4)
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if d.ID() == first.Load() && d.Attempt() == 1 {
			return rowactor.Retry()
		}
		handled <- d.ID()
		return rowactor.Ack()
	}, rowactor.Workers(4))
	time.Sleep(500 * time.Millisecond) // the retry settled; its hook holds on
	published := time.Now()
	second := h.publish(b, 1)[0]
	for deadline := time.After(5 * time.Second); ; {
		select {
		case id := <-handled:
			if id == second {
				t.Logf("the other row was handled %v after its publish", time.Since(published))
				return
			}
		case <-deadline:
			t.Fatalf("row %d waited 5 s while the hook of row %d's retry ran: claims wait for the hook", second, first.Load())
		}
	}
}
