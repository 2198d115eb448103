// Forms: the claim forms a database serves, one after another, each on a table of its own.
//
// For each form it creates rowactor_example_<form>, puts 200 jobs in it, consumes them
// with 4 workers (every 10th job fails once and is retried at once with RetryAfter(0)),
// waits until all 200 are acked, shuts the broker down, checks in SQL that the table is
// empty, drops it, and prints one line. It exits 1 if anything is off.
//
// The database is the URL's: without -dsn (or DATABASE_URL) a SQLite file in a temporary
// directory, which serves the lease and advisory forms; PostgreSQL and MySQL/MariaDB serve
// the row lock form too. A MySQL URL is "mysql://" and a go-sql-driver DSN, or the DSN
// alone (rowactor.Open adds parseTime=true and loc=UTC).
//
//	go run ./examples/forms
//	go run ./examples/forms -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run ./examples/forms -dsn 'root@tcp(127.0.0.1:3306)/test' -form advisory
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rowactor/rowactor"
	// Each dialect registers its URLs for rowactor.Open when imported: this program opens
	// any of the three. (exampledb imports them too, for their pools.)
	_ "github.com/rowactor/rowactor/dialects/mysql"
	_ "github.com/rowactor/rowactor/dialects/postgres"
	_ "github.com/rowactor/rowactor/dialects/sqlite"
	"github.com/rowactor/rowactor/examples/internal/exampledb"
)

const (
	jobs     = 200
	accounts = 4
	workers  = 4
	queue    = "jobs"
)

func main() {
	dsn := flag.String("dsn", "", "postgres://user@host:5432/db?sslmode=disable, mysql://user@tcp(host:3306)/db or the bare MySQL DSN (default $DATABASE_URL; neither: a SQLite file in a temporary directory)")
	form := flag.String("form", "", "rowlock, lease or advisory (default: every form the database serves)")
	flag.Parse()
	if *dsn == "" {
		*dsn = os.Getenv("DATABASE_URL")
	}
	// The row lock and advisory forms hold a pool connection per row in work, and a
	// subscription leaves one for publishes, so Workers(4) needs 5.
	db, cleanup, err := exampledb.Pick(*dsn, workers+1)
	forms := []string{"rowlock", "lease", "advisory"}
	if err == nil && db.Name == "sqlite" {
		forms = []string{"lease", "advisory"} // SQLite has no row locks
	}
	if err == nil && *form != "" && !slices.Contains(forms, *form) {
		err = fmt.Errorf("%s serves the forms %v, not %q", db.Name, forms, *form)
	}
	if err != nil {
		cleanup()
		fmt.Fprintln(os.Stderr, "forms:", err)
		fmt.Fprintln(os.Stderr, "usage: forms [-form rowlock|lease|advisory] [-dsn postgres://user@host:5432/db | -dsn 'mysql://user@tcp(host:3306)/db'] (or set DATABASE_URL)")
		os.Exit(2)
	}
	if *form != "" {
		forms = []string{*form}
	}
	for _, f := range forms {
		if err := run(context.Background(), db, f); err != nil {
			cleanup()
			fmt.Fprintf(os.Stderr, "%s %s: %v\n", db.Name, f, err)
			os.Exit(1)
		}
	}
	cleanup()
}

// tableFor describes each form's table; the columns named decide the form.
func tableFor(form string) rowactor.Table {
	t := rowactor.Table{
		Name: "rowactor_example_" + form, ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after",
	}
	switch form {
	case "rowlock":
		// Neither LockedUntil nor AdvisoryKey: each row in work is held by SELECT … FOR
		// UPDATE SKIP LOCKED in a transaction left open (READ COMMITTED on MySQL), on its
		// own pool connection, while the handler runs; the settlement commits in that
		// transaction.
	case "lease":
		// The claim stamps locked_until and commits at once: no connection is held while
		// the handler runs, and the settlement only applies while locked_until still
		// holds the claim's token.
		t.LockedUntil = "locked_until"
	case "advisory":
		// The handler runs while the row's key is locked: on PostgreSQL by
		// pg_advisory_lock and on MySQL by GET_LOCK, on a pool connection set aside for
		// the delivery; on SQLite, which has no session locks, in the process. Rows with
		// one account are worked one at a time, whatever their ids.
		t.AdvisoryKey = "rowactor-example-{account}"
	}
	return t
}

func run(ctx context.Context, db exampledb.DB, form string) error {
	table := tableFor(form)

	// Count what the database recorded, not what the handler returned.
	var handled, retried, settleErrs atomic.Int64
	onSettled := func(s rowactor.Settlement) {
		switch {
		case s.Err != nil:
			settleErrs.Add(1)
			fmt.Fprintf(os.Stderr, "settlement of row %d (%s): %v\n", s.ID, s.Step, s.Err)
		case s.Step == "ack":
			handled.Add(1)
		case s.Step == "retry_after":
			retried.Add(1)
		}
	}
	b, err := rowactor.Open(ctx, db.URL, rowactor.WithOnSettled(onSettled))
	if err != nil {
		return err
	}
	defer b.Shutdown(context.Background()) // early returns; ErrClosed after the one below

	// Schema renders the CREATE TABLE and claim index (and, for the advisory form, the
	// account column its key names).
	pool := exampledb.Pool(b.Dialect())
	ddl, err := rowactor.Schema(b.Dialect(), table)
	if err != nil {
		return err
	}
	if err := exampledb.ExecAll(ctx, pool, "DROP TABLE IF EXISTS "+table.Name, ddl); err != nil {
		return err
	}

	// The payload is the job's number. Advisory rows need their account, a column
	// Publish does not fill, so they are inserted with SQL.
	insert := "INSERT INTO " + table.Name + " (payload, queue, account) VALUES (" + db.Param(1) + ", " + db.Param(2) + ", " + db.Param(3) + ")"
	for n := 1; n <= jobs; n++ {
		payload := []byte(strconv.Itoa(n))
		if form == "advisory" {
			err = exampledb.Exec(ctx, pool, insert, payload, queue, account(n))
		} else {
			_, err = b.Publish(ctx, table, queue, payload)
		}
		if err != nil {
			return err
		}
	}

	// In the advisory form, count the deliveries in the handler at once, per account
	// and in all.
	var mu sync.Mutex
	inWork := map[string]int{}
	maxInWork, total, maxTotal := 0, 0, 0
	handler := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		n, err := strconv.Atoi(string(d.Payload()))
		if err != nil {
			return rowactor.Drop()
		}
		if form == "advisory" {
			a := account(n)
			mu.Lock()
			inWork[a]++
			total++
			maxInWork, maxTotal = max(maxInWork, inWork[a]), max(maxTotal, total)
			mu.Unlock()
			time.Sleep(2 * time.Millisecond) // long enough for an overlap to show
			defer func() { mu.Lock(); inWork[a]--; total--; mu.Unlock() }()
		}
		if n%10 == 0 && d.Attempt() == 1 {
			return rowactor.RetryAfter(0) // fails once, due again at once
		}
		return rowactor.Ack()
	}

	// Publishes from this process wake the subscription at once; the poll finds the
	// rest: the advisory rows inserted with SQL, and (as things stand) an advisory row
	// whose account was in work when it was last looked at, so keep the interval short.
	start := time.Now()
	_, err = b.Subscribe(ctx, table, queue, handler, rowactor.Workers(workers), rowactor.PollInterval(100*time.Millisecond))
	if err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for handled.Load() < jobs && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(start)

	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rep, err := b.Shutdown(sctx)
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}

	// Shutdown closed the broker's pool; open the database again to check the table and
	// drop it.
	v, err := db.Reopen(ctx)
	if err != nil {
		return err
	}
	defer v.Close()
	var left int64
	if err := exampledb.QueryRow(ctx, exampledb.Pool(v), "SELECT count(*) FROM "+table.Name, &left); err != nil {
		return err
	}
	if err := exampledb.Exec(ctx, exampledb.Pool(v), "DROP TABLE "+table.Name); err != nil {
		return err
	}

	line := fmt.Sprintf("%s %s: handled=%d retried=%d seconds=%.2f", db.Name, form, handled.Load(), retried.Load(), elapsed.Seconds())
	if form == "advisory" {
		line += fmt.Sprintf(" max_in_work_per_account=%d", maxInWork)
	}
	fmt.Println(line)

	var errs []error
	check := func(what string, got, want int64) {
		if got != want {
			errs = append(errs, fmt.Errorf("%s: got %d, want %d", what, got, want))
		}
	}
	check("acked jobs", handled.Load(), jobs)
	check("retries", retried.Load(), jobs/10)
	check("settlement errors", settleErrs.Load(), 0)
	check("rows left in the table", left, 0)
	check("rows released unsettled at shutdown", int64(rep.Released), 0)
	if form == "advisory" {
		check("most deliveries of one account in work at once", int64(maxInWork), 1)
		if maxTotal < 2 {
			// Otherwise max_in_work_per_account=1 would prove nothing.
			errs = append(errs, fmt.Errorf("accounts never ran side by side (at most %d delivery in work)", maxTotal))
		}
	}
	return errors.Join(errs...)
}

// account spreads the jobs over the accounts.
func account(n int) string { return "account-" + strconv.Itoa(n%accounts) }
