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

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// A dead-letter move keeps the whole row: every column the queue table and the
// dead-letter table share by name, as the catalog lists them when the subscription
// starts, not only the columns the description names. A dead-letter table that would
// lose a value the queue table requires, or that requires a value the queue table lacks,
// is refused at Subscribe; a move the database refuses anyway leaves the row in the
// queue table, set aside, without redelivering it at once. Requeue does the same in
// reverse.

var deadLetterWholeRowScenarios = []scenario{
	{name: "a dead-letter move keeps every column the dead-letter table shares",
		run: func(t *testing.T, h *harness, form rowactor.Form) { wholeRowMoveScenario(t, h, form, deadAllColumns) }},
	{name: "a dead-letter move into a table made like the queue table keeps the whole row",
		run: func(t *testing.T, h *harness, form rowactor.Form) { wholeRowMoveScenario(t, h, form, deadLike) }},
	{name: "Subscribe and requeue refuse a dead-letter table without a NOT NULL column of the queue table",
		run: refuseMissingRequiredScenario},
	{name: "Subscribe and requeue refuse a dead-letter table with a NOT NULL column the queue table lacks",
		run: refuseExtraRequiredScenario},
	{name: "a dead-letter move a constraint refuses sets the row aside once and does not spin",
		run: func(t *testing.T, h *harness, form rowactor.Form) { refusedMoveScenario(t, h, form, deadRefusing) }},
	{name: "a dead-letter move a trigger refuses sets the row aside once and does not spin",
		run: func(t *testing.T, h *harness, form rowactor.Form) { refusedMoveScenario(t, h, form, deadTrigger) }},
	{name: "requeue from a dead-letter table brings the whole row back",
		run: wholeRowRequeueScenario},
	{name: "a dead-letter table named after the queue table and _dead, made as the docs say, collides with no index",
		forms: []rowactor.Form{rowactor.FormLease}, shapes: []tableShape{withDeadAt, withUniqueKey, withProcessedAt},
		run: docsDeadTableScenario},
	{
		name:  "a batch whose dead-letter move a trigger refuses sets the row aside and does not spin",
		forms: []rowactor.Form{rowactor.FormRowLock},
		run:   refusedBatchMoveScenario,
	},
}

// deadShape is how a scenario's dead-letter table is made.
type deadShape int

const (
	// deadAllColumns: every column of the queue table, nullable, in another order (and,
	// where names fold, in another case), a computed column as a plain one, and a column
	// of its own with a default.
	deadAllColumns deadShape = iota
	// deadLike: CREATE TABLE … (LIKE queue) on PostgreSQL (NOT NULL kept, no defaults, no
	// identity), CREATE TABLE … LIKE queue on MySQL (everything, computed columns
	// included), the queue table's own DDL on SQLite.
	deadLike
	// deadWithoutCustomer: the described columns and amount and details, not customer
	// (NOT NULL without a default in the queue table).
	deadWithoutCustomer
	// deadWithoutAmount: every column but amount (nullable in the queue table).
	deadWithoutAmount
	// deadWithExtraRequired: every column, and approver NOT NULL without a default, which
	// the queue table lacks.
	deadWithExtraRequired
	// deadRefusing: every column, and a CHECK constraint no row passes.
	deadRefusing
	// deadTrigger: every column, and a trigger that refuses every insert.
	deadTrigger
)

// refusal is the message of deadTrigger's trigger.
const refusal = "dead letters are closed"

// refuseInserts adds a trigger to table that refuses every insert with refusal.
func refuseInserts(h *harness, table string) {
	h.t.Helper()
	switch h.drv.name {
	case "postgres":
		fn := pgQuote(table + "_refuse")
		h.exec(`CREATE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION '` + refusal + `'; END $$`)
		// Registered before the brokers: it runs after they shut down. CASCADE drops the
		// trigger with it.
		pool := pgPool(h.d)
		h.t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP FUNCTION IF EXISTS "+fn+"() CASCADE") })
		h.exec("CREATE TRIGGER " + pgQuote(table+"_refuses") + " BEFORE INSERT ON " + pgQuote(table) + " FOR EACH ROW EXECUTE FUNCTION " + fn + "()")
	case "mysql":
		h.exec("CREATE TRIGGER `" + table + "_refuses` BEFORE INSERT ON `" + table + "` FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '" + refusal + "'")
	default:
		h.exec("CREATE TRIGGER " + table + "_refuses BEFORE INSERT ON " + table + " BEGIN SELECT RAISE(ABORT, '" + refusal + "'); END")
	}
}

// queueServiceColumns are the service's own columns of the queue table: one NOT NULL
// without a default, a decimal, a JSON document, and a computed column.
func queueServiceColumns(db string) string {
	switch db {
	case "postgres":
		return `"customer" text NOT NULL, "amount" numeric(12,2), "details" jsonb, "customer_key" text GENERATED ALWAYS AS (lower("customer")) STORED`
	case "mysql":
		return "`customer` VARCHAR(100) NOT NULL, `amount` DECIMAL(12,2), `details` JSON, `customer_key` VARCHAR(100) AS (LOWER(`customer`)) STORED"
	}
	return "customer TEXT NOT NULL, amount NUMERIC, details TEXT, customer_key TEXT GENERATED ALWAYS AS (lower(customer)) STORED"
}

// deadServiceColumns are the dead-letter table's columns beside the described ones.
func deadServiceColumns(db string, shape deadShape, table string) string {
	var cols []string
	switch db {
	case "postgres":
		cols = []string{`"details" jsonb`, `"customer_key" text`, `"amount" numeric(12,2)`, `"customer" text`,
			`"dead_at" timestamptz NOT NULL DEFAULT now()`}
	case "mysql":
		cols = []string{"`DETAILS` JSON", "`Customer_Key` VARCHAR(100)", "`AMOUNT` DECIMAL(12,2)", "`Customer` VARCHAR(100)",
			"`dead_at` DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"}
	default:
		cols = []string{"DETAILS TEXT", "Customer_Key TEXT", "AMOUNT NUMERIC", "Customer TEXT",
			"dead_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP"}
	}
	without := func(name string) {
		for i, c := range cols {
			if strings.Contains(strings.ToLower(c), `"`+name+`"`) || strings.Contains(strings.ToLower(c), "`"+name+"`") ||
				strings.HasPrefix(strings.ToLower(c), name+" ") {
				cols = append(cols[:i], cols[i+1:]...)
				return
			}
		}
		panic("no column " + name)
	}
	switch shape {
	case deadWithoutCustomer:
		without("customer")
	case deadWithoutAmount:
		without("amount")
	case deadWithExtraRequired:
		cols = append(cols, map[string]string{"postgres": `"approver" text NOT NULL`, "mysql": "`approver` VARCHAR(100) NOT NULL"}[db])
		if db == "sqlite" {
			cols[len(cols)-1] = "approver TEXT NOT NULL"
		}
	case deadRefusing:
		// No payload is shorter than nothing: every move fails on this constraint.
		q := map[string]string{"postgres": `"`, "mysql": "`", "sqlite": `"`}[db]
		cols = append(cols, "CONSTRAINT "+q+table+"_refuses"+q+" CHECK (length(payload) < 0)")
	}
	return strings.Join(cols, ", ")
}

// createTableWith creates table t from Schema with extra column (and constraint)
// definitions after the described columns.
func createTableWith(h *harness, t rowactor.Table, extra string, edit func(string) string) {
	h.t.Helper()
	ddl, err := rowactor.Schema(h.d, t)
	if err != nil {
		h.t.Fatalf("Schema: %v", err)
	}
	if edit != nil {
		ddl = edit(ddl)
	}
	end := strings.Index(ddl, "\n)")
	ddl = ddl[:end] + ",\n  " + extra + ddl[end:]
	for _, stmt := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(stmt) != "" {
			h.exec(stmt)
		}
	}
}

// wholeRowTables recreates the harness's queue table with the service's own columns and
// creates its dead-letter table as shape says; it returns the dead-letter table.
func wholeRowTables(h *harness, shape deadShape) rowactor.Table {
	h.t.Helper()
	db := h.drv.name
	h.exec("DROP TABLE " + h.table.Name)
	createTableWith(h, h.table, queueServiceColumns(db), nil)
	dead := h.table
	dead.Name = h.table.Name + "_dl"
	switch {
	case shape == deadLike && db == "postgres":
		h.exec(fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (LIKE %s)`, pgQuote(dead.Name), pgQuote(h.table.Name)))
	case shape == deadLike && db == "mysql":
		h.exec(fmt.Sprintf("CREATE TABLE IF NOT EXISTS `%s` LIKE `%s`", dead.Name, h.table.Name))
	case shape == deadLike:
		createTableWith(h, dead, queueServiceColumns(db), nil)
	default:
		var edit func(string) string
		if db == "postgres" {
			// The dead letter's id is GENERATED ALWAYS: the move still keeps the row's id.
			edit = func(ddl string) string {
				return strings.Replace(ddl, "GENERATED BY DEFAULT AS IDENTITY", "GENERATED ALWAYS AS IDENTITY", 1)
			}
		}
		createTableWith(h, dead, deadServiceColumns(db, shape, dead.Name), edit)
		if shape == deadTrigger {
			refuseInserts(h, dead.Name)
		}
	}
	return dead
}

// insertOrder inserts a row with the service's columns set and returns its id.
func insertOrder(h *harness, table, customer string) int64 {
	h.t.Helper()
	h.exec(fmt.Sprintf(`INSERT INTO %s (payload, grp, customer, amount, details) VALUES (?, ?, ?, 12.34, '{"sku": "A-1", "qty": 2}')`, table),
		[]byte("order of "+customer), h.queue, customer)
	return int64(h.drv.count(h.t, h.d, fmt.Sprintf("SELECT max(id) FROM %s WHERE customer = ?", table), customer))
}

// orderColumns are the columns a whole row is compared by.
var orderColumns = []string{"id", "payload", "grp", "attempt", "customer", "amount", "details", "customer_key"}

// wholeRow reads a row's orderColumns as text ("<nil>" for NULL); nil when it is gone.
func wholeRow(t *testing.T, h *harness, table string, id int64) map[string]string {
	t.Helper()
	exprs := make([]string, len(orderColumns))
	for i, c := range orderColumns {
		switch h.drv.name {
		case "postgres":
			exprs[i] = pgQuote(c) + "::text"
		case "mysql":
			exprs[i] = "CAST(`" + c + "` AS CHAR)"
		default:
			exprs[i] = "CAST(" + c + " AS TEXT)"
		}
	}
	query := "SELECT " + strings.Join(exprs, ", ") + " FROM " + table + " WHERE id = "
	vals := make([]sql.NullString, len(orderColumns))
	dest := make([]any, len(vals))
	for i := range vals {
		dest[i] = &vals[i]
	}
	var err error
	switch h.drv.name {
	case "postgres":
		ptrs := make([]*string, len(vals))
		pdest := make([]any, len(vals))
		for i := range ptrs {
			pdest[i] = &ptrs[i]
		}
		err = pgPool(h.d).QueryRow(context.Background(), query+"$1", id).Scan(pdest...)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		for i, p := range ptrs {
			if p != nil {
				vals[i] = sql.NullString{String: *p, Valid: true}
			}
		}
	case "mysql":
		err = mysqlDB(h.d).QueryRow(query+"?", id).Scan(dest...)
	default:
		err = sqliteDB(h.d).QueryRow(query+"?", id).Scan(dest...)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		t.Fatalf("read row %d of %s: %v", id, table, err)
	}
	out := map[string]string{}
	for i, c := range orderColumns {
		out[c] = "<nil>"
		if vals[i].Valid {
			out[c] = vals[i].String
		}
	}
	return out
}

// sameRow fails unless got holds want's values, but for the columns listed in except.
func sameRow(t *testing.T, what string, got, want map[string]string, except ...string) {
	t.Helper()
	if got == nil {
		t.Fatalf("%s: the row is gone, want %v", what, want)
	}
	for _, c := range orderColumns {
		skip := false
		for _, e := range except {
			skip = skip || e == c
		}
		if !skip && got[c] != want[c] {
			t.Fatalf("%s: column %s is %q, want %q\nrow  %v\nwant %v", what, c, got[c], want[c], got, want)
		}
	}
}

func wholeRowMoveScenario(t *testing.T, h *harness, form rowactor.Form, shape deadShape) {
	dead := wholeRowTables(h, shape)
	b := h.broker()
	id := insertOrder(h, h.table.Name, "ACME Corp")
	before := wholeRow(t, h, h.table.Name, id)
	if before["customer_key"] != "acme corp" || before["customer"] != "ACME Corp" {
		t.Fatalf("the queue row as inserted: %v", before)
	}
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Retry() },
		rowactor.MaxAttempts(1), rowactor.DeadLetterTable(dead.Name))
	if s := h.waitSettled(1)[0]; s.Step != "dead_letter" || s.Err != nil {
		t.Fatalf("settlement %+v\nlogs:\n%s", s, h.logs.String())
	}
	if h.row(id).exists {
		t.Fatal("the row is still in the queue table")
	}
	want := before
	want["attempt"] = fmt.Sprint(attemptColumn(form, 1, 0))
	sameRow(t, "the dead-letter row", wholeRow(t, h, dead.Name, id), want)
	if st := h.drv.state(t, h.d, dead, id); st.lockedUntil != nil {
		t.Fatalf("the dead-letter row holds a lease: %+v", st)
	}
}

// subscribeErr subscribes and returns Subscribe's error; a subscription that started is
// shut down with its broker at cleanup.
func subscribeErr(h *harness, b *rowactor.Broker, dead string) error {
	_, err := b.Subscribe(context.Background(), h.table, h.queue,
		func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Retry() },
		rowactor.MaxAttempts(1), rowactor.DeadLetterTable(dead))
	return err
}

// refused fails unless err is a *rowactor.ConfigError naming table, column and a fix.
func refused(t *testing.T, what string, err error, table, dead, column string) {
	t.Helper()
	var ce *rowactor.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("%s: error %v, want a *rowactor.ConfigError naming column %q", what, err, column)
	}
	if ce.Table != table || !strings.EqualFold(ce.Column, column) || ce.Fix == "" ||
		!strings.Contains(ce.Error(), dead) || !strings.Contains(strings.ToLower(ce.Fix), strings.ToLower(column)) {
		t.Fatalf("%s: %#v (%v), want table %q, column %q, the dead-letter table %q and a fix naming the column", what, ce, ce, table, column, dead)
	}
}

func requeueFrom(h *harness, dead string) (int, error) {
	return h.d.(dialects.Admin).Requeue(context.Background(), dialects.RequeueSpec{Table: h.table, FromTable: dead}, nil)
}

func refuseMissingRequiredScenario(t *testing.T, h *harness, _ rowactor.Form) {
	dead := wholeRowTables(h, deadWithoutCustomer)
	b := h.broker()
	refused(t, "Subscribe", subscribeErr(h, b, dead.Name), h.table.Name, dead.Name, "customer")
	_, err := requeueFrom(h, dead.Name)
	refused(t, "Requeue", err, h.table.Name, dead.Name, "customer")

	// A nullable column the dead-letter table leaves out is the service's choice.
	lean := h.table
	lean.Name = h.table.Name + "_lean"
	createTableWith(h, lean, deadServiceColumns(h.drv.name, deadWithoutAmount, lean.Name), nil)
	if err := subscribeErr(h, b, lean.Name); err != nil {
		t.Fatalf("Subscribe with a dead-letter table without a nullable column: %v", err)
	}
}

func refuseExtraRequiredScenario(t *testing.T, h *harness, _ rowactor.Form) {
	dead := wholeRowTables(h, deadWithExtraRequired)
	refused(t, "Subscribe", subscribeErr(h, h.broker(), dead.Name), h.table.Name, dead.Name, "approver")
	_, err := requeueFrom(h, dead.Name)
	refused(t, "Requeue", err, h.table.Name, dead.Name, "approver")
}

// refusedMoveScenario: with MaxAttempts(1), every move into a dead-letter table whose
// CHECK constraint (deadRefusing) or trigger (deadTrigger) refuses every row fails. The
// row must not come back at once to fail again: over a second (twenty polls) the handler
// runs a handful of times at most, and the row stays in the queue table as it was, set aside
// (retry_after parked), logged once as an error naming the table, the row, the
// dead-letter table, the constraint (or the trigger's message) and the fix.
func refusedMoveScenario(t *testing.T, h *harness, form rowactor.Form, shape deadShape) {
	dead := wholeRowTables(h, shape)
	b := h.broker()
	id := insertOrder(h, h.table.Name, "ACME Corp")
	before := wholeRow(t, h, h.table.Name, id)
	var calls atomic.Int64
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { calls.Add(1); return rowactor.Retry() },
		append(leaseOptions(form, time.Second), rowactor.Workers(2), rowactor.MaxAttempts(1), rowactor.DeadLetterTable(dead.Name))...)
	time.Sleep(time.Second)
	if n := calls.Load(); n > 3 {
		t.Fatalf("the handler ran %d times in 1 s (polls every 50 ms): a failing dead-letter move spins\nlogs:\n%.4000s", n, h.logs.String())
	}
	waitFor(t, func() bool { return parked(h.row(id).retryAfter) })
	if n := calls.Load(); n == 0 || n > 3 {
		t.Fatalf("the handler ran %d times, want a handful", n)
	}
	st := h.row(id)
	if st.lockedUntil != nil && !parked(st.lockedUntil) {
		t.Fatalf("the row set aside holds a lease: %+v", st)
	}
	sameRow(t, "the row left in the queue table", wholeRow(t, h, h.table.Name, id), before, "attempt")
	if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+dead.Name); n != 0 {
		t.Fatalf("the dead-letter table holds %d rows", n)
	}
	var errs []string
	for _, line := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") && strings.Contains(line, fmt.Sprintf("id=%d ", id)) {
			errs = append(errs, line)
		}
	}
	// One error, or two: in the row lock and advisory forms the failed move's rollback (or
	// unlock) frees the row an instant before the subscription marks it, and the other
	// worker may claim it once in that instant (a known window, see the issue note).
	if len(errs) < 1 || len(errs) > 2 {
		t.Fatalf("%d errors logged for the row, want one (two at most):\n%s", len(errs), h.logs.String())
	}
	culprit := dead.Name + "_refuses"
	if shape == deadTrigger {
		culprit = refusal
	}
	for _, want := range []string{"table=" + h.table.Name, "dead_letter=" + dead.Name, culprit, "fix="} {
		if !strings.Contains(errs[0], want) {
			t.Fatalf("the error lacks %q:\n%s", want, errs[0])
		}
	}
}

// wholeRowRequeueScenario: a row moved to the dead-letter table and requeued comes back
// with every column, starting afresh (attempt 1, no delay, no lease); the computed column
// is computed again.
func wholeRowRequeueScenario(t *testing.T, h *harness, form rowactor.Form) {
	dead := wholeRowTables(h, deadAllColumns)
	b := h.broker()
	id := insertOrder(h, h.table.Name, "ACME Corp")
	before := wholeRow(t, h, h.table.Name, id)
	// A dead letter the service wrote itself, with every column (its id clear of the
	// queue table's).
	const written = 1000
	overriding := ""
	if h.drv.name == "postgres" {
		overriding = " OVERRIDING SYSTEM VALUE" // the dead letter's id is GENERATED ALWAYS
	}
	h.exec(fmt.Sprintf(`INSERT INTO %s (id, payload, grp, customer, amount, details, customer_key, attempt)%s VALUES (?, ?, ?, ?, 7.5, '{"sku": "B-2"}', ?, 9)`, dead.Name, overriding),
		written, []byte("written dead"), h.queue, "Globex", "stale key")
	writtenRow := wholeRow(t, h, dead.Name, written)

	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Retry() },
		rowactor.MaxAttempts(1), rowactor.DeadLetterTable(dead.Name))
	if s := h.waitSettled(1)[0]; s.Step != "dead_letter" || s.Err != nil {
		t.Fatalf("settlement %+v\nlogs:\n%s", s, h.logs.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	n, err := requeueFrom(h, dead.Name)
	if err != nil || n != 2 {
		t.Fatalf("Requeue = %d, %v, want 2 rows", n, err)
	}
	if c := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+dead.Name); c != 0 {
		t.Fatalf("the dead-letter table still holds %d rows", c)
	}
	want := before
	want["attempt"] = "1"
	sameRow(t, "the requeued row", wholeRow(t, h, h.table.Name, id), want)
	want = writtenRow
	want["attempt"], want["customer_key"] = "1", "globex" // computed again in the queue table
	sameRow(t, "the requeued row the service wrote", wholeRow(t, h, h.table.Name, written), want)
	for _, rid := range []int64{id, written} {
		if st := h.row(rid); st.retryAfter != nil || st.lockedUntil != nil || st.processedAt != nil {
			t.Fatalf("requeued row %d: %+v", rid, st)
		}
	}
}

// refusedBatchMoveScenario: a batch's commit fails on the move of its spent row (the
// trigger refuses it), so every row of the batch returns. The spent row must be set
// aside at its next claim, not moved and refused again and again; the others are
// delivered again and acked.
func refusedBatchMoveScenario(t *testing.T, h *harness, _ rowactor.Form) {
	dead := wholeRowTables(h, deadTrigger)
	b := h.broker()
	spent := insertOrder(h, h.table.Name, "ACME Corp")
	fine := insertOrder(h, h.table.Name, "Globex")
	var calls atomic.Int64
	_, err := b.SubscribeBatch(context.Background(), h.table, h.queue, 10, func(_ context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		calls.Add(1)
		out := make([]rowactor.Outcome, len(ds))
		for i, d := range ds {
			out[i] = rowactor.Ack()
			if d.ID() == spent {
				out[i] = rowactor.Retry()
			}
		}
		return out
	}, rowactor.PollInterval(50*time.Millisecond), rowactor.MaxAttempts(1), rowactor.DeadLetterTable(dead.Name))
	if err != nil {
		t.Fatalf("SubscribeBatch: %v", err)
	}
	time.Sleep(time.Second)
	if n := calls.Load(); n > 3 {
		t.Fatalf("the batch handler ran %d times in 1 s (polls every 50 ms): a failing dead-letter move spins\nlogs:\n%.4000s", n, h.logs.String())
	}
	waitFor(t, func() bool { return parked(h.row(spent).retryAfter) && !h.row(fine).exists })
	if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+dead.Name); n != 0 {
		t.Fatalf("the dead-letter table holds %d rows", n)
	}
}

// docsDeadTableScenario makes the dead-letter table docs/forms.md suggests, <table>_dead,
// as it says (CREATE TABLE … (LIKE …) on PostgreSQL, CREATE TABLE … LIKE … on MySQL, the
// queue table's own DDL on SQLite), beside a queue table with every index Schema renders
// (claim, dead letters by dead_at, unique key). PostgreSQL and SQLite keep indexes and
// tables in one namespace, so no index may be named so; a dead letter then moves into
// the table, stamped with its time of death.
func docsDeadTableScenario(t *testing.T, h *harness, _ rowactor.Form) {
	dead := h.table
	dead.Name = h.table.Name + "_dead"
	switch h.drv.name {
	case "postgres":
		h.exec(fmt.Sprintf(`CREATE TABLE %s (LIKE %s)`, pgQuote(dead.Name), pgQuote(h.table.Name)))
	case "mysql":
		h.exec(fmt.Sprintf("CREATE TABLE `%s` LIKE `%s`", dead.Name, h.table.Name))
	default:
		h.createTable(dead)
	}
	b := h.broker()
	id := h.publish(b, 1)[0]
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Retry() },
		rowactor.MaxAttempts(1), rowactor.DeadLetterTable(dead.Name))
	if s := h.waitSettled(1)[0]; s.Step != "dead_letter" || s.Err != nil {
		t.Fatalf("settlement %+v\nlogs:\n%s", s, h.logs.String())
	}
	if h.row(id).exists {
		t.Fatal("the row is still in the queue table")
	}
	if n := h.drv.count(t, h.d, "SELECT count(*) FROM "+dead.Name+" WHERE id = ? AND dead_at IS NOT NULL", id); n != 1 {
		t.Fatalf("%d rows of id %d with a dead_at in %s, want 1", n, id, dead.Name)
	}
}
