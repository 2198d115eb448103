// Transactional: a handler whose business writes and Ack commit together, or not at all.
//
// It publishes 100 orders (the payload is the order's id) into the queue "orders" of
// rowactor_example_orders and consumes them with Transactional() and 4 workers. Through
// the transaction each delivery lends (d.Tx()) the handler
//
//   - inserts the order's total into rowactor_example_order_totals, whose primary key is
//     the order id;
//   - publishes a receipt into the queue "receipts" of the same table with b.PublishTx;
//   - returns Retry on the first attempt of every 7th order, and Ack otherwise.
//
// Ack commits the total, the receipt and the settlement in one commit. Retry rolls the
// total and the receipt back before it settles, so the second attempt inserts both again:
// had the first insert been kept, the primary key would refuse the second, and the order
// would never be acked. A second subscription, on "receipts", counts the receipts.
//
// When every order is acked and every receipt handled, it shuts the broker down, opens the
// database again, checks in SQL that order_totals holds exactly one row per order and that
// both queues are empty, drops its tables, and prints one line. It exits 1 if anything is
// off.
//
// Without -dsn (or DATABASE_URL) it runs on a SQLite file in a temporary directory, in the
// lease form; on PostgreSQL and MySQL/MariaDB it uses the row lock form, where the
// transaction lent is the claim's own.
//
//	go run ./examples/transactional
//	go run ./examples/transactional -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run ./examples/transactional -dsn 'mysql://root@tcp(127.0.0.1:3306)/test'
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

const (
	orders         = 100
	retryEvery     = 7 // every 7th order fails its first attempt
	workers        = 4
	receiptWorkers = 2
	ordersQueue    = "orders"
	receiptsQueue  = "receipts"
	queueTable     = "rowactor_example_orders"
	totalsTable    = "rowactor_example_order_totals"
)

func main() {
	dsn := flag.String("dsn", "", "postgres://user@host:5432/db?sslmode=disable or mysql://user@tcp(host:3306)/db (default $DATABASE_URL; neither: a SQLite file in a temporary directory)")
	flag.Parse()
	if *dsn == "" {
		*dsn = os.Getenv("DATABASE_URL")
	}
	db, cleanup, err := pick(*dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "transactional:", err)
		fmt.Fprintln(os.Stderr, "usage: transactional [-dsn postgres://user@host:5432/db | -dsn 'mysql://user@tcp(host:3306)/db'] (or set DATABASE_URL)")
		os.Exit(2)
	}
	err = run(context.Background(), db)
	cleanup()
	if err != nil {
		fmt.Fprintf(os.Stderr, "transactional %s: %v\n", db.name, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, db database) error {
	// Count what the database recorded, not what the handlers returned. Drop shares the
	// "ack" step (both end the row), so the outcome tells them apart.
	var acked, dropped, retried, receipts, settleErrs, odd atomic.Int64
	onSettled := func(s rowactor.Settlement) {
		switch {
		case s.Err != nil:
			settleErrs.Add(1)
			fmt.Fprintf(os.Stderr, "settlement of %s row %d (%s): %v\n", s.Queue, s.ID, s.Step, s.Err)
		case s.Queue == ordersQueue && s.Step == "ack" && s.Outcome.String() == "drop":
			dropped.Add(1)
		case s.Queue == ordersQueue && s.Step == "ack":
			acked.Add(1)
		case s.Queue == ordersQueue && s.Step == "retry":
			retried.Add(1)
		case s.Queue == receiptsQueue && s.Step == "ack":
			receipts.Add(1)
		default:
			odd.Add(1)
			fmt.Fprintf(os.Stderr, "unexpected settlement of %s row %d: step %s, released %v, panic %v\n",
				s.Queue, s.ID, s.Step, s.Released, s.Panic)
		}
	}
	b, err := rowactor.Open(ctx, db.url, rowactor.WithOnSettled(onSettled))
	if err != nil {
		return err
	}
	defer b.Shutdown(context.Background()) // early returns; ErrClosed after the one below

	// One table holds both queues ("queue" is its group column). The columns named decide
	// the form: LockedUntil makes it the lease form, the only one SQLite serves; without
	// it PostgreSQL and MySQL use the row lock form.
	table := rowactor.Table{Name: queueTable, ID: "id", Payload: "payload", Group: "queue", Attempt: "attempt"}
	if db.name == "sqlite" {
		table.LockedUntil = "locked_until"
	}
	ddl, err := rowactor.Schema(b.Dialect(), table) // CREATE TABLE and claim index, separated by ";\n"
	if err != nil {
		return err
	}
	pool := poolOf(b.Dialect())
	setup := []string{
		"DROP TABLE IF EXISTS " + queueTable,
		"DROP TABLE IF EXISTS " + totalsTable,
		// The business table, in plain SQL that the three databases read alike.
		"CREATE TABLE " + totalsTable + " (order_id BIGINT PRIMARY KEY, total BIGINT NOT NULL)",
	}
	for _, s := range append(setup, strings.Split(ddl, ";\n")...) {
		if strings.TrimSpace(s) == "" {
			continue
		}
		if err := exec(ctx, pool, s); err != nil {
			return fmt.Errorf("%w\n%s", err, s)
		}
	}

	for n := 1; n <= orders; n++ {
		if _, err := b.Publish(ctx, table, ordersQueue, []byte(strconv.Itoa(n))); err != nil {
			return err
		}
	}

	var handlerErrs atomic.Int64
	failed := func(n int, what string, err error) rowactor.Outcome {
		handlerErrs.Add(1)
		fmt.Fprintf(os.Stderr, "order %d: %s: %v\n", n, what, err)
		// Drop rolls back whatever this attempt wrote and ends the row; the checks below
		// then miss the order. (Retry would fail the same way forever.)
		return rowactor.Drop()
	}
	insertTotal := "INSERT INTO " + totalsTable + " (order_id, total) VALUES (" + db.param(1) + ", " + db.param(2) + ")"

	handler := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		n, err := strconv.Atoi(string(d.Payload()))
		if err != nil {
			return rowactor.Drop() // a poison message
		}
		// Both writes go through the delivery's transaction, so neither is visible to
		// anyone, the receipts subscription included, until the outcome is known.
		if err := exec(ctx, d.Tx(), insertTotal, n, total(n)); err != nil {
			return failed(n, "insert total", err)
		}
		// ctx carries the delivery, so the receipts subscription is woken once the Ack
		// has committed the receipt (and never for a receipt that was rolled back).
		if _, err := b.PublishTx(ctx, d.Tx(), table, receiptsQueue, d.Payload()); err != nil {
			return failed(n, "publish receipt", err)
		}
		if n%retryEvery == 0 && d.Attempt() == 1 {
			// Rolls back the total and the receipt, then returns the row with its attempt
			// counted. Attempt 2 inserts both again; a total kept from attempt 1 would
			// make that insert fail on the primary key.
			return rowactor.Retry()
		}
		// Commits the total, the receipt and the row's settlement together: a crash
		// before the commit leaves none of them, so the order is simply delivered again.
		return rowactor.Ack()
	}

	// Receipts come from committed Acks only: exactly one per order.
	var receiptsFor [orders + 1]atomic.Int32
	countReceipt := func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if n, err := strconv.Atoi(string(d.Payload())); err == nil && n >= 1 && n <= orders {
			receiptsFor[n].Add(1)
		}
		return rowactor.Ack()
	}

	start := time.Now()
	if _, err := b.Subscribe(ctx, table, ordersQueue, handler, rowactor.Transactional(),
		rowactor.Workers(workers), rowactor.PollInterval(100*time.Millisecond)); err != nil {
		return err
	}
	if _, err := b.Subscribe(ctx, table, receiptsQueue, countReceipt,
		rowactor.Workers(receiptWorkers), rowactor.PollInterval(100*time.Millisecond)); err != nil {
		return err
	}

	// Every order ends acked (or dropped, if its handler failed), and every acked order's
	// receipt is handled.
	deadline := time.Now().Add(60 * time.Second)
	for (acked.Load()+dropped.Load() < orders || receipts.Load() < acked.Load()) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(start)

	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rep, err := b.Shutdown(sctx)
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}

	// Shutdown closed the broker's pool; open the database again to check what it holds.
	v, err := db.reopen(ctx)
	if err != nil {
		return err
	}
	defer v.Close()
	pool = poolOf(v)
	var totals, sum, leftOrders, leftReceipts int64
	for _, q := range []struct {
		text string
		into []any
	}{
		{"SELECT COUNT(*), COALESCE(SUM(total), 0) FROM " + totalsTable, []any{&totals, &sum}},
		{"SELECT COUNT(*) FROM " + queueTable + " WHERE queue = '" + ordersQueue + "'", []any{&leftOrders}},
		{"SELECT COUNT(*) FROM " + queueTable + " WHERE queue = '" + receiptsQueue + "'", []any{&leftReceipts}},
	} {
		if err := queryRow(ctx, pool, q.text, q.into...); err != nil {
			return fmt.Errorf("%w\n%s", err, q.text)
		}
	}
	for _, t := range []string{queueTable, totalsTable} {
		if err := exec(ctx, pool, "DROP TABLE "+t); err != nil {
			return err
		}
	}

	fmt.Printf("transactional %s: orders=%d retried=%d totals=%d receipts=%d seconds=%.2f\n",
		db.name, acked.Load(), retried.Load(), totals, receipts.Load(), elapsed.Seconds())

	var errs []error
	check := func(what string, got, want int64) {
		if got != want {
			errs = append(errs, fmt.Errorf("%s: got %d, want %d", what, got, want))
		}
	}
	wantSum := int64(0)
	for n := 1; n <= orders; n++ {
		wantSum += total(n)
	}
	once := int64(0)
	for n := 1; n <= orders; n++ {
		if receiptsFor[n].Load() == 1 {
			once++
		}
	}
	check("orders acked", acked.Load(), orders)
	check("orders retried", retried.Load(), orders/retryEvery)
	check("orders dropped", dropped.Load(), 0)
	check("handler errors", handlerErrs.Load(), 0)
	check("settlement errors", settleErrs.Load(), 0)
	check("unexpected settlements", odd.Load(), 0)
	check("rows in "+totalsTable, totals, orders)
	check("sum of the totals", sum, wantSum)
	check("receipts handled", receipts.Load(), orders)
	check("orders with exactly one receipt", once, orders)
	check("rows left in queue "+ordersQueue, leftOrders, 0)
	check("rows left in queue "+receiptsQueue, leftReceipts, 0)
	check("rows released unsettled at shutdown", int64(rep.Released), 0)
	return errors.Join(errs...)
}

// total is order n's total, in cents.
func total(n int) int64 { return int64(n) * 250 }

// database is where the three databases differ for the example's own SQL: the URL
// rowactor.Open takes, how to open the database again, and the placeholder style.
type database struct {
	name string // "sqlite", "postgres" or "mysql", from the URL's scheme
	url  string // for rowactor.Open
	dsn  string // for the dialect package's Open: a file path, a pgx URL or a driver DSN
}

// pick chooses the database by the URL's scheme: none at all means a SQLite file in a
// temporary directory, which cleanup removes.
func pick(url string) (db database, cleanup func(), err error) {
	cleanup = func() {}
	scheme, rest, _ := strings.Cut(url, "://")
	switch {
	case url == "":
		dir, err := os.MkdirTemp("", "rowactor-transactional-")
		if err != nil {
			return db, cleanup, err
		}
		path := filepath.Join(dir, "orders.db")
		return database{name: "sqlite", url: "sqlite:" + path, dsn: path}, func() { os.RemoveAll(dir) }, nil
	case scheme == "postgres" || scheme == "postgresql":
		url = withPoolSize(url, workers+receiptWorkers+1)
		return database{name: "postgres", url: url, dsn: url}, cleanup, nil
	case scheme == "mysql":
		return database{name: "mysql", url: url, dsn: rest}, cleanup, nil
	}
	return db, cleanup, fmt.Errorf("want a postgres:// or mysql:// URL (or none, for SQLite), got scheme %q", scheme)
}

// param is the n-th placeholder (from 1): $n on PostgreSQL, ? on MySQL and SQLite.
func (db database) param(n int) string {
	if db.name == "postgres" {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// reopen opens the database with its dialect package, outside any broker.
func (db database) reopen(ctx context.Context) (dialects.Dialect, error) {
	var (
		d   dialects.Dialect
		err error
	)
	switch db.name {
	case "sqlite":
		var s *sqlite.Dialect
		s, err = sqlite.Open(ctx, db.dsn)
		d = s
	case "postgres":
		var p *postgres.Dialect
		p, err = postgres.Open(ctx, db.dsn)
		d = p
	case "mysql":
		var m *mysql.Dialect
		m, err = mysql.Open(ctx, db.dsn)
		d = m
	}
	if err != nil {
		return nil, err
	}
	return d, nil
}

// poolOf is a dialect's pool: *pgxpool.Pool on PostgreSQL, *sql.DB on MySQL and SQLite.
func poolOf(d dialects.Dialect) any {
	switch d := d.(type) {
	case *postgres.Dialect:
		return d.Pool()
	case *mysql.Dialect:
		return d.DB()
	case *sqlite.Dialect:
		return d.DB()
	}
	return nil
}

// exec runs one statement on a pool, or in a transaction: d.Tx() is a pgx.Tx on
// PostgreSQL and a *sql.Tx on MySQL and SQLite.
func exec(ctx context.Context, on any, query string, args ...any) error {
	var err error
	switch c := on.(type) {
	case pgx.Tx:
		_, err = c.Exec(ctx, query, args...)
	case *sql.Tx:
		_, err = c.ExecContext(ctx, query, args...)
	case *pgxpool.Pool:
		_, err = c.Exec(ctx, query, args...)
	case *sql.DB:
		_, err = c.ExecContext(ctx, query, args...)
	default:
		err = fmt.Errorf("no statements on a %T", on)
	}
	return err
}

// queryRow scans the one row a query returns.
func queryRow(ctx context.Context, pool any, query string, into ...any) error {
	switch c := pool.(type) {
	case *pgxpool.Pool:
		return c.QueryRow(ctx, query).Scan(into...)
	case *sql.DB:
		return c.QueryRowContext(ctx, query).Scan(into...)
	}
	return fmt.Errorf("no queries on a %T", pool)
}

// withPoolSize asks pgxpool for n connections unless the URL says otherwise: the row lock
// form holds a pool connection per row in work, and the two subscriptions share the pool.
func withPoolSize(url string, n int) string {
	if strings.Contains(url, "pool_max_conns=") {
		return url
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "pool_max_conns=" + strconv.Itoa(n)
}
