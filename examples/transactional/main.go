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
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/rowactor/rowactor"
	// Each dialect registers its URLs for rowactor.Open when imported: this program opens
	// any of the three. (exampledb imports them too, for their pools and transactions.)
	_ "github.com/rowactor/rowactor/dialects/mysql"
	_ "github.com/rowactor/rowactor/dialects/postgres"
	_ "github.com/rowactor/rowactor/dialects/sqlite"
	"github.com/rowactor/rowactor/examples/internal/exampledb"
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
	// The row lock form holds a pool connection per row in work, and the two
	// subscriptions share the pool.
	db, cleanup, err := exampledb.Pick(*dsn, workers+receiptWorkers+1)
	if err != nil {
		fmt.Fprintln(os.Stderr, "transactional:", err)
		fmt.Fprintln(os.Stderr, "usage: transactional [-dsn postgres://user@host:5432/db | -dsn 'mysql://user@tcp(host:3306)/db'] (or set DATABASE_URL)")
		os.Exit(2)
	}
	err = run(context.Background(), db)
	cleanup()
	if err != nil {
		fmt.Fprintf(os.Stderr, "transactional %s: %v\n", db.Name, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, db exampledb.DB) error {
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
	b, err := rowactor.Open(ctx, db.URL, rowactor.WithOnSettled(onSettled))
	if err != nil {
		return err
	}
	defer b.Shutdown(context.Background()) // early returns; ErrClosed after the one below

	// One table holds both queues ("queue" is its group column). The columns named decide
	// the form: LockedUntil makes it the lease form, the only one SQLite serves; without
	// it PostgreSQL and MySQL use the row lock form.
	table := rowactor.Table{Name: queueTable, ID: "id", Payload: "payload", Group: "queue", Attempt: "attempt"}
	if db.Name == "sqlite" {
		table.LockedUntil = "locked_until"
	}
	ddl, err := rowactor.Schema(b.Dialect(), table) // CREATE TABLE and claim index, separated by ";\n"
	if err != nil {
		return err
	}
	pool := exampledb.Pool(b.Dialect())
	if err := exampledb.ExecAll(ctx, pool,
		"DROP TABLE IF EXISTS "+queueTable,
		"DROP TABLE IF EXISTS "+totalsTable,
		// The business table, in plain SQL that the three databases read alike.
		"CREATE TABLE "+totalsTable+" (order_id BIGINT PRIMARY KEY, total BIGINT NOT NULL)",
		ddl); err != nil {
		return err
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
	insertTotal := "INSERT INTO " + totalsTable + " (order_id, total) VALUES (" + db.Param(1) + ", " + db.Param(2) + ")"

	handler := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		n, err := strconv.Atoi(string(d.Payload()))
		if err != nil {
			return rowactor.Drop() // a poison message
		}
		// Both writes go through the delivery's transaction, so neither is visible to
		// anyone, the receipts subscription included, until the outcome is known.
		if err := exampledb.Exec(ctx, d.Tx(), insertTotal, n, total(n)); err != nil {
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
	v, err := db.Reopen(ctx)
	if err != nil {
		return err
	}
	defer v.Close()
	pool = exampledb.Pool(v)
	var totals, sum, leftOrders, leftReceipts int64
	for _, q := range []struct {
		text string
		into []any
	}{
		{"SELECT COUNT(*), COALESCE(SUM(total), 0) FROM " + totalsTable, []any{&totals, &sum}},
		{"SELECT COUNT(*) FROM " + queueTable + " WHERE queue = '" + ordersQueue + "'", []any{&leftOrders}},
		{"SELECT COUNT(*) FROM " + queueTable + " WHERE queue = '" + receiptsQueue + "'", []any{&leftReceipts}},
	} {
		if err := exampledb.QueryRow(ctx, pool, q.text, q.into...); err != nil {
			return fmt.Errorf("%w\n%s", err, q.text)
		}
	}
	for _, t := range []string{queueTable, totalsTable} {
		if err := exampledb.Exec(ctx, pool, "DROP TABLE "+t); err != nil {
			return err
		}
	}

	fmt.Printf("transactional %s: orders=%d retried=%d totals=%d receipts=%d seconds=%.2f\n",
		db.Name, acked.Load(), retried.Load(), totals, receipts.Load(), elapsed.Seconds())

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
