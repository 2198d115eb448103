// MySQL/MariaDB: the three claim forms, one after another, each on a table of its own.
//
// For each form it creates rowactor_example_<form>, puts 200 jobs in it, consumes them
// with 4 workers (every 10th job fails once and is retried at once with RetryAfter(0)),
// waits until all 200 are acked, shuts the broker down, checks in SQL that the table is
// empty, drops it, and prints one line. It exits 1 if anything is off.
//
// The DSN is go-sql-driver/mysql's (rowactor.Open takes it after "mysql://"; Open adds
// parseTime=true and loc=UTC):
//
//	go run ./examples/mysql -dsn 'root@tcp(127.0.0.1:3306)/test'
//	DATABASE_URL='root@tcp(127.0.0.1:3306)/test' go run ./examples/mysql -form advisory
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
)

const (
	jobs     = 200
	accounts = 4
	workers  = 4
	queue    = "jobs"
)

func main() {
	dsn := flag.String("dsn", "", "go-sql-driver DSN, e.g. root@tcp(127.0.0.1:3306)/test (default $DATABASE_URL)")
	form := flag.String("form", "", "rowlock, lease or advisory (default: all three)")
	flag.Parse()
	if *dsn == "" {
		*dsn = os.Getenv("DATABASE_URL")
	}
	*dsn = strings.TrimPrefix(*dsn, "mysql://") // a URL is welcome too
	forms := []string{"rowlock", "lease", "advisory"}
	if *form != "" {
		forms = []string{*form}
	}
	if *dsn == "" || (*form != "" && tableFor(*form).Name == "") {
		fmt.Fprintln(os.Stderr, "usage: mysql [-form rowlock|lease|advisory] -dsn 'user:pass@tcp(host:3306)/db' (or set DATABASE_URL)")
		os.Exit(2)
	}
	for _, f := range forms {
		if err := run(context.Background(), *dsn, f); err != nil {
			fmt.Fprintf(os.Stderr, "mysql %s: %v\n", f, err)
			os.Exit(1)
		}
	}
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
		// UPDATE SKIP LOCKED in a READ COMMITTED transaction left open, on its own pool
		// connection, while the handler runs; the settlement commits in that transaction.
	case "lease":
		// The claim (a locking SELECT, then an UPDATE stamping locked_until) commits at
		// once: no connection is held while the handler runs, and the settlement only
		// applies while locked_until still holds the claim's token.
		t.LockedUntil = "locked_until"
	case "advisory":
		// The handler runs while a pool connection set aside for the delivery holds
		// GET_LOCK on the row's key, so rows with one account are worked one at a time,
		// whatever their ids.
		t.AdvisoryKey = "rowactor-example-{account}"
	default:
		return rowactor.Table{}
	}
	return t
}

func run(ctx context.Context, dsn, form string) error {
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
	// Open's pool holds mysql.OpenPoolSize (20) connections: room for the row lock and
	// advisory forms' one connection per row in work.
	b, err := rowactor.Open(ctx, "mysql://"+dsn, rowactor.WithOnSettled(onSettled))
	if err != nil {
		return err
	}
	defer b.Shutdown(context.Background()) // early returns; ErrClosed after the one below

	// Schema renders the CREATE TABLE and claim index, statements separated by ";\n".
	db := b.Dialect().(*mysql.Dialect).DB()
	ddl, err := rowactor.Schema(b.Dialect(), table)
	if err != nil {
		return err
	}
	stmts := append([]string{"DROP TABLE IF EXISTS `" + table.Name + "`"}, strings.Split(ddl, ";\n")...)
	for _, s := range stmts {
		if strings.TrimSpace(s) == "" {
			continue
		}
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%w\n%s", err, s)
		}
	}

	// The payload is the job's number. Advisory rows need their account, a column
	// Publish does not fill, so they are inserted with SQL.
	for n := 1; n <= jobs; n++ {
		payload := []byte(strconv.Itoa(n))
		if form == "advisory" {
			_, err = db.ExecContext(ctx, "INSERT INTO `"+table.Name+"` (payload, queue, account) VALUES (?, ?, ?)",
				payload, queue, account(n))
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

	// Shutdown closed the broker's pool; open another to check the table and drop it.
	v, err := mysql.Open(ctx, dsn)
	if err != nil {
		return err
	}
	defer v.Close()
	var left int64
	if err := v.DB().QueryRowContext(ctx, "SELECT count(*) FROM `"+table.Name+"`").Scan(&left); err != nil {
		return err
	}
	if _, err := v.DB().ExecContext(ctx, "DROP TABLE `"+table.Name+"`"); err != nil {
		return err
	}

	line := fmt.Sprintf("mysql %s: handled=%d retried=%d seconds=%.2f", form, handled.Load(), retried.Load(), elapsed.Seconds())
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
