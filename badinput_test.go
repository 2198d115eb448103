package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// badSecret is the password the bad-input tests put in URLs; no error may show it.
const badSecret = "s3cret"

// badNoPanic runs f and fails the test, with the stack, if it panics.
func badNoPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			stack := string(debug.Stack())
			if i := strings.Index(stack, "\npanic("); i >= 0 {
				stack = stack[i+1:]
			}
			if lines := strings.SplitAfter(stack, "\n"); len(lines) > 12 {
				stack = strings.Join(lines[:12], "")
			}
			t.Errorf("%s panicked: %v\n%s", what, r, stack)
		}
	}()
	f()
}

// badConfigError asserts err is a *ConfigError matching ErrConfig, with a reason and a
// fix, naming table (when not empty) and the option (when not empty).
func badConfigError(t *testing.T, err error, table, option string) *rowactor.ConfigError {
	t.Helper()
	var ce *rowactor.ConfigError
	if !errors.As(err, &ce) || !errors.Is(err, rowactor.ErrConfig) {
		t.Fatalf("got %T %v, want a *rowactor.ConfigError", err, err)
	}
	msg := err.Error()
	if ce.Reason == "" || ce.Fix == "" || !strings.Contains(msg, "fix: ") {
		t.Errorf("%q has no reason or no fix", msg)
	}
	if table != "" && (ce.Table != table || !strings.Contains(msg, fmt.Sprintf("%q", table))) {
		t.Errorf("%q does not name table %q (Table %q)", msg, table, ce.Table)
	}
	if option != "" && ce.Option != option {
		t.Errorf("%q: option %q, want %q", msg, ce.Option, option)
	}
	return ce
}

func badAck(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }

// TestBadOpenURL: an invalid URL or DSN and a server that is not there each make Open
// return a clear error, soon, without a broker and without a panic; a password in the URL
// never shows in the error.
func TestBadOpenURL(t *testing.T) {
	t.Parallel()
	cases := []string{
		"",
		"oracle://app:" + badSecret + "@db/x",
		"sqlite:",
		"sqlite://",
		"sqlite:" + t.TempDir() + "/no/such/dir/queue.db",
		"postgres://%zz",
		"postgres://app:" + badSecret + "@%zz/test",
		"postgres://app:s3c%zzret@127.0.0.1:1/test",
		"postgres://app:" + badSecret + "@127.0.0.1:1/test?connect_timeout=zz",
		"postgres://postgres@127.0.0.1:1/test?connect_timeout=2",
		"postgres://app:" + badSecret + "@127.0.0.1:1/test?connect_timeout=2&sslmode=disable",
		"postgresql://app:" + badSecret + "@127.0.0.1:1/test?connect_timeout=2&sslmode=disable",
		// libpq and pgx take the password as a query parameter too.
		"postgres://app@127.0.0.1:1/test?password=" + badSecret + "&connect_timeout=2&sslmode=disable",
		"mysql://not a dsn",
		"mysql://root:" + badSecret + "@not a dsn",
		"mysql://root:" + badSecret + "@tcp(127.0.0.1:1)/test?timeout=zz",
		"mysql://root@tcp(127.0.0.1:1)/test?timeout=2s",
		"mysql://root:" + badSecret + "@tcp(127.0.0.1:1)/test?timeout=2s",
		// Bare DSNs: Open reads them as mysql://, and hides their passwords as well.
		"root:" + badSecret + "@tcp(127.0.0.1:1)/test?timeout=2s",
		"root:" + badSecret + "@tcp(127.0.0.1:1/test",
		"root:" + badSecret + "@not a dsn",
	}
	for _, url := range cases {
		t.Run(strings.ReplaceAll(url, "/", "_"), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			var (
				b   *rowactor.Broker
				err error
			)
			badNoPanic(t, fmt.Sprintf("Open(%q)", url), func() { b, err = rowactor.Open(ctx, url) })
			if b != nil {
				_, _ = b.Shutdown(ctx)
				t.Fatalf("Open(%q) returned a broker", url)
			}
			if err == nil {
				t.Fatalf("Open(%q) returned no error", url)
			}
			msg := err.Error()
			if strings.Contains(msg, badSecret) {
				t.Errorf("Open(%q): the error shows the password: %q", url, msg)
			}
			if !strings.HasPrefix(msg, "rowactor: Open(") {
				t.Errorf("Open(%q): %q does not say what failed", url, msg)
			}
			if took := time.Since(start); took > 15*time.Second {
				t.Errorf("Open(%q) took %v to fail", url, took)
			}
		})
	}
}

// TestBadNewNilDialect: New refuses a nil dialect, and a nil dialect pointer (what a
// failed sqlite.Open, mysql.Open or postgres.Open returns beside its error), with an
// error rather than a broker that panics at its first call.
func TestBadNewNilDialect(t *testing.T) {
	t.Parallel()
	if os.Getenv("ROWACTOR_BAD_CHILD") == "postgres-nil" {
		// In a child process (below): the listener goroutine's panic would end the
		// whole test binary.
		var d *postgres.Dialect
		b, err := rowactor.New(d)
		if err == nil {
			time.Sleep(500 * time.Millisecond) // a listener started by New gets to run
			_, _ = b.Shutdown(context.Background())
			t.Fatal("New accepted a nil *postgres.Dialect")
		}
		return
	}
	ctx := context.Background()
	if b, err := rowactor.New(nil); err == nil || b != nil {
		t.Errorf("New(nil) = %v, %v", b, err)
	}
	tbl := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", LockedUntil: "locked_until"}
	for name, d := range map[string]dialects.Dialect{
		"sqlite": (*sqlite.Dialect)(nil),
		"mysql":  (*mysql.Dialect)(nil),
	} {
		t.Run(name, func(t *testing.T) {
			var (
				b   *rowactor.Broker
				err error
			)
			badNoPanic(t, "New", func() { b, err = rowactor.New(d) })
			if err != nil {
				return
			}
			t.Errorf("New accepted a nil *%s.Dialect", name)
			defer b.Shutdown(ctx)
			badNoPanic(t, "Publish on a nil dialect", func() { _, err = b.Publish(ctx, tbl, "q", []byte("x")) })
			badNoPanic(t, "Subscribe on a nil dialect", func() { _, err = b.Subscribe(ctx, tbl, "q", badAck) })
		})
	}
	t.Run("postgres", func(t *testing.T) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestBadNewNilDialect$", "-test.count=1")
		cmd.Env = append(os.Environ(), "ROWACTOR_BAD_CHILD=postgres-nil")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("New on a nil *postgres.Dialect, in a child process: %v\n%s", err, out)
		}
	})
}

// TestBadSubscribeOptions: a nil handler, a negative worker count, a zero poll interval
// and a negative attempt cap are each refused at Subscribe with a *ConfigError naming the
// table and the option, on every database; the refusals leave nothing behind, so a good
// subscription to the same queue starts afterwards and drains it.
func TestBadSubscribeOptions(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			h := newHarness(t, drv, drv.forms[0])
			b := h.broker()
			ctx := context.Background()
			var nilHandler rowactor.Handler
			cases := []struct {
				option string
				h      rowactor.Handler
				opts   []rowactor.SubscribeOption
			}{
				{"handler", nil, nil},
				{"handler", nilHandler, []rowactor.SubscribeOption{rowactor.Workers(2)}},
				{"Workers", badAck, []rowactor.SubscribeOption{rowactor.Workers(-3)}},
				{"PollInterval", badAck, []rowactor.SubscribeOption{rowactor.PollInterval(0)}},
				{"PollInterval", badAck, []rowactor.SubscribeOption{rowactor.PollInterval(-time.Second)}},
				{"MaxAttempts", badAck, []rowactor.SubscribeOption{rowactor.MaxAttempts(-1)}},
			}
			for _, c := range cases {
				var (
					s   *rowactor.Subscription
					err error
				)
				badNoPanic(t, "Subscribe "+c.option, func() { s, err = b.Subscribe(ctx, h.table, h.queue, c.h, c.opts...) })
				if s != nil {
					t.Fatalf("Subscribe with a bad %s started a subscription", c.option)
				}
				badConfigError(t, err, h.table.Name, c.option)
			}
			h.subscribe(b, badAck)
			h.publish(b, 1)
			if s := h.waitSettled(1)[0]; s.Err != nil || s.Step != "ack" {
				t.Fatalf("after the refusals: %+v", s)
			}
		})
	}
}

// TestBadClosedBroker: after Shutdown, Publish, PublishTx, Subscribe and Shutdown return
// ErrClosed, and the subscription handle of the stopped broker still answers, on every
// database.
func TestBadClosedBroker(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			h := newHarness(t, drv, drv.forms[0])
			b := h.broker()
			ctx := context.Background()
			sub := h.subscribe(b, badAck)
			if _, err := b.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			badNoPanic(t, "calls on a closed broker", func() {
				if _, err := b.Publish(ctx, h.table, h.queue, []byte("x")); !errors.Is(err, rowactor.ErrClosed) {
					t.Errorf("Publish: %v, want ErrClosed", err)
				}
				tx, _, rollback := drv.begin(t, h.d)
				if _, err := b.PublishTx(ctx, tx, h.table, h.queue, []byte("x")); !errors.Is(err, rowactor.ErrClosed) {
					t.Errorf("PublishTx: %v, want ErrClosed", err)
				}
				_ = rollback()
				if _, err := b.Subscribe(ctx, h.table, h.queue, badAck); !errors.Is(err, rowactor.ErrClosed) {
					t.Errorf("Subscribe: %v, want ErrClosed", err)
				}
				if _, err := b.Subscribe(ctx, h.table, h.queue, nil, rowactor.Workers(-3)); !errors.Is(err, rowactor.ErrClosed) {
					t.Errorf("Subscribe with bad arguments: %v, want ErrClosed", err)
				}
				if _, err := b.Shutdown(ctx); !errors.Is(err, rowactor.ErrClosed) {
					t.Errorf("second Shutdown: %v, want ErrClosed", err)
				}
				b.Wake(h.table, h.queue)
				sub.SetWorkers(3)
				if n := sub.InWork(); n != 0 {
					t.Errorf("InWork after Shutdown = %d", n)
				}
			})
			if n := drv.count(t, h.d, "SELECT COUNT(*) FROM "+badQuote(drv.name, h.table.Name)); n != 0 {
				t.Errorf("a closed broker published %d rows", n)
			}
		})
	}
}

// badQuote quotes an identifier the database's own way, written independently of the
// dialects: double quotes for SQLite and PostgreSQL, backticks for MySQL.
func badQuote(db, name string) string {
	if db == "mysql" {
		return "`" + strings.ReplaceAll(name, "`", "``") + "`"
	}
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// badExec runs one statement without placeholders straight on the dialect's pool (the
// drivers' exec would read a ? inside a name as a placeholder).
func badExec(t *testing.T, db string, d dialects.Dialect, query string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	switch db {
	case "sqlite":
		_, err = sqliteDB(d).ExecContext(ctx, query)
	case "postgres":
		_, err = pgPool(d).Exec(ctx, query)
	case "mysql":
		_, err = mysqlDB(d).ExecContext(ctx, query)
	default:
		t.Fatalf("no database %q", db)
	}
	return err
}

// badCreate creates tbl with every described column, typed as the database's dialect
// needs, quoting every name the database's own way, and drops it when the test ends
// (after the brokers the test starts later have shut down).
func badCreate(t *testing.T, db string, d dialects.Dialect, tbl rowactor.Table) {
	t.Helper()
	types := map[string]map[string]string{
		"sqlite": {"ID": "INTEGER PRIMARY KEY AUTOINCREMENT", "Payload": "BLOB NOT NULL", "Group": "TEXT NOT NULL DEFAULT ''",
			"Attempt": "INTEGER NOT NULL DEFAULT 1", "RetryAfter": "TEXT", "LockedUntil": "TEXT", "Headers": "TEXT"},
		"postgres": {"ID": "bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY", "Payload": "bytea NOT NULL",
			"Group": "text NOT NULL DEFAULT ''", "Attempt": "smallint NOT NULL DEFAULT 1", "RetryAfter": "timestamptz",
			"LockedUntil": "timestamptz", "Headers": "jsonb"},
		"mysql": {"ID": "BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY", "Payload": "LONGBLOB NOT NULL",
			"Group": "VARCHAR(191) NOT NULL DEFAULT ''", "Attempt": "SMALLINT NOT NULL DEFAULT 1",
			"RetryAfter": "DATETIME(6) NULL", "LockedUntil": "DATETIME(6) NULL", "Headers": "JSON NULL"},
	}[db]
	var cols []string
	for _, c := range tbl.Columns() {
		if c.Role == "AdvisoryKey" {
			continue // the key names role columns only
		}
		cols = append(cols, badQuote(db, c.Name)+" "+types[c.Role])
	}
	ddl := "CREATE TABLE " + badQuote(db, tbl.Name) + " (" + strings.Join(cols, ", ") + ")"
	if db == "mysql" {
		ddl += " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
	}
	if err := badExec(t, db, d, ddl); err != nil {
		t.Fatalf("%s: %v", ddl, err)
	}
	t.Cleanup(func() {
		if err := badExec(t, db, d, "DROP TABLE IF EXISTS "+badQuote(db, tbl.Name)); err != nil {
			t.Errorf("drop %q: %v", tbl.Name, err)
		}
	})
}

// badOddTable describes a table of the form whose name and every column name hold
// quotes, backticks, semicolons, comment dashes, placeholders and unicode; the table's
// name is as long as the database allows (63 bytes on PostgreSQL, 64 characters on
// MySQL).
func badOddTable(db string, form rowactor.Form) rowactor.Table {
	wide := "🚀" // MySQL names are BMP only
	if db == "mysql" {
		wide = "é"
	}
	name := fmt.Sprintf("ra%d_%d_t\"a`b'c;d--e naïve表%s", time.Now().UnixNano()%1e6, tableSeq.Add(1), wide)
	switch db {
	case "postgres":
		for len(name) < 63 {
			name += "x"
		}
	case "mysql":
		for utf8.RuneCountInString(name) < 64 {
			name += "x"
		}
	}
	tbl := rowactor.Table{
		Name:       name,
		ID:         "i\"d`" + wide,
		Payload:    "pay;load? --",
		Group:      "grp :group $1 ?'); DROP TABLE x; --",
		Attempt:    "naïve attempt",
		RetryAfter: "表 retry",
		Headers:    "hdr " + wide,
	}
	switch form {
	case rowactor.FormLease:
		tbl.LockedUntil = "lock\"until`"
	case rowactor.FormAdvisory:
		tbl.AdvisoryKey = "k'\";--" + name[:12] + "-{" + tbl.ID + "}"
	}
	return tbl
}

// TestBadIdentifiers: a table whose name and columns hold quotes, backticks, semicolons,
// comment dashes, placeholders and unicode (created with the database's own quoting)
// works through rowactor in every form of every database: Subscribe, Publish with
// headers, and the row is delivered intact and acked; the harness's own table beside it
// keeps its row untouched.
func TestBadIdentifiers(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			t.Run(drv.name+"/"+form.String(), func(t *testing.T) {
				h := newHarness(t, drv, form)
				tbl := badOddTable(drv.name, form)
				badCreate(t, drv.name, h.d, tbl)
				b := h.broker()
				ctx := context.Background()
				other := h.publish(b, 1)[0]
				plain := h.table

				h.table, h.queue = tbl, "q'\";-- 表"
				payload := []byte("payload ' \" ` ; -- 表 é")
				headers := map[string]string{"k'\"`": "v;--表"}
				got := make(chan string, 4)
				h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
					got <- fmt.Sprintf("%s|%s|%s|%d", d.Payload(), d.Header("k'\"`"), d.Table(), d.Attempt())
					return rowactor.Ack()
				})
				id, err := b.Publish(ctx, tbl, h.queue, payload, rowactor.WithHeaders(headers))
				if err != nil {
					t.Fatalf("Publish into %q: %v", tbl.Name, err)
				}
				s := h.waitSettled(1)[0]
				if s.Err != nil || s.Step != "ack" || s.ID != id || s.Table != tbl.Name {
					t.Fatalf("settlement %+v, want the ack of row %d", s, id)
				}
				want := fmt.Sprintf("%s|%s|%s|1", payload, headers["k'\"`"], tbl.Name)
				if g := <-got; g != want {
					t.Fatalf("the handler saw %q, want %q", g, want)
				}
				if n := drv.count(t, h.d, "SELECT COUNT(*) FROM "+badQuote(drv.name, tbl.Name)); n != 0 {
					t.Fatalf("%d rows left in %q after the ack", n, tbl.Name)
				}
				if st := drv.state(t, h.d, plain, other); !st.exists || st.attempt != 1 || st.lockedUntil != nil {
					t.Fatalf("the row of the other table changed: %+v", st)
				}
			})
		}
	}
}

// TestBadIdentifierTooLong: a name past the database's limit (64 bytes on PostgreSQL, which
// would truncate it silently; 65 characters on MySQL, which refuses it) is refused at
// Subscribe and Publish with a *ConfigError naming it, whether it names the table or a
// column. Limits count bytes on PostgreSQL and characters on MySQL, so the same 32 two-byte
// characters are too long for one and fine for the other.
func TestBadIdentifierTooLong(t *testing.T) {
	t.Parallel()
	cases := map[string][]string{
		"postgres": {strings.Repeat("é", 32), `"` + strings.Repeat("x", 62) + "`", strings.Repeat("表", 22)},
		"mysql":    {strings.Repeat("é", 65), "`" + strings.Repeat("x", 63) + `"`, strings.Repeat("表", 65)},
	}
	for db, names := range cases {
		t.Run(db, func(t *testing.T) {
			drv := driverNamed(t, db)
			h := newHarness(t, drv, rowactor.FormLease)
			b := h.broker()
			ctx := context.Background()
			for _, long := range names {
				asTable := h.table
				asTable.Name = long
				_, err := b.Subscribe(ctx, asTable, h.queue, badAck)
				badConfigError(t, err, long, "Table.Name")
				_, err = b.Publish(ctx, asTable, h.queue, []byte("x"))
				badConfigError(t, err, long, "Table.Name")

				asColumn := h.table
				asColumn.Payload = long
				_, err = b.Subscribe(ctx, asColumn, h.queue, badAck)
				if ce := badConfigError(t, err, h.table.Name, "Table.Payload"); ce.Column != long ||
					!strings.Contains(err.Error(), fmt.Sprintf("column %q", long)) {
					t.Errorf("%q does not name column %q", err, long)
				}
				_, err = b.Publish(ctx, asColumn, h.queue, []byte("x"))
				if ce := badConfigError(t, err, h.table.Name, "Table.Payload"); ce.Column != long {
					t.Errorf("%q does not name column %q", err, long)
				}
			}
		})
	}
}

// TestBadIdentifierOutsideTheBMP: MySQL names cannot hold characters outside the Basic
// Multilingual Plane (emoji); Subscribe and Publish on such a name return an error, and
// neither panics nor finds some other table.
func TestBadIdentifierOutsideTheBMP(t *testing.T) {
	t.Parallel()
	drv := driverNamed(t, "mysql")
	h := newHarness(t, drv, rowactor.FormLease)
	b := h.broker()
	ctx := context.Background()
	odd := h.table
	odd.Name = h.table.Name + "🚀"
	badNoPanic(t, "Subscribe", func() {
		if _, err := b.Subscribe(ctx, odd, h.queue, badAck); err == nil {
			t.Errorf("Subscribe to %q, which cannot exist, succeeded", odd.Name)
		}
	})
	badNoPanic(t, "Publish", func() {
		if _, err := b.Publish(ctx, odd, h.queue, []byte("x")); err == nil {
			t.Errorf("Publish to %q, which cannot exist, succeeded", odd.Name)
		}
	})
	odd = h.table
	odd.Payload = "pay🚀"
	badNoPanic(t, "Subscribe", func() {
		if _, err := b.Subscribe(ctx, odd, h.queue, badAck); err == nil {
			t.Errorf("Subscribe naming column %q, which cannot exist, succeeded", odd.Payload)
		}
	})
	if n := drv.count(t, h.d, "SELECT COUNT(*) FROM "+badQuote("mysql", h.table.Name)); n != 0 {
		t.Errorf("%d rows reached the harness table", n)
	}
}
