package rowactor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/rowactor/rowactor"
	_ "github.com/rowactor/rowactor/dialects/sqlite"
)

// The Go blocks of README.md and docs/*.md come from regions of this file and of the
// other Example functions (TestDocsSnippetsAreCode keeps them the same). Examples without
// an Output line are compiled, not run: they need a server, or the names they leave to
// the reader are stand-ins.

// A subscription with the options most services give it, and the rest of a broker's
// life. Not run: it writes jobs.db in the working directory.
func Example_subscribeOptions() {
	ctx := context.Background()
	var (
		quota   = struct{ Exhausted func() bool }{func() bool { return false }}
		send    = func(ctx context.Context, to, subject string) error { return nil }
		payload = []byte(`{"to":"a@example.com"}`)
		tx      *sql.Tx
	)
	// snippet subscribe: begin
	// import _ "github.com/rowactor/rowactor/dialects/sqlite": it registers "sqlite:" for Open
	b, err := rowactor.Open(ctx, "sqlite:jobs.db") // or "./jobs.db", "file:jobs.db"; or rowactor.New(sqlite.New(db))

	emails := rowactor.Table{
		Name: "email_jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", ProcessedAt: "processed_at",
		Headers: "headers", Error: "last_error",
		LockedUntil: "locked_until", // the lease form; or AdvisoryKey: "email-{id}"
	}
	ddl, err := rowactor.Schema(b.Dialect(), emails) // CREATE TABLE + claim index, if you need one

	type Email struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
	}

	// A plain Go function: nil acks; an error fails the row, which comes back after 1 s, 2 s,
	// 4 s… (RetryPolicy) with the error kept in last_error, and moves to the dead letter when
	// its attempts are spent. A payload that is not an Email's JSON goes there at once.
	sub, err := b.Subscribe(ctx, emails, "emails",
		rowactor.JSON(func(ctx context.Context, d *rowactor.Delivery, m Email) error {
			if quota.Exhausted() {
				return rowactor.Snooze(time.Minute) // later, without spending an attempt
			}
			return send(ctx, m.To, m.Subject)
		}),
		rowactor.Workers(8), rowactor.Lease(time.Minute),
		rowactor.MaxAttempts(5), rowactor.DeadLetterGroup("emails-dead"),
		rowactor.Timeout(30*time.Second), // ctx ends at 30 s; a handler past it fails, one past a grace more is given up on
	)
	sub.SetWorkers(16) // retune while running

	id, err := rowactor.PublishJSON(ctx, b, emails, "emails", Email{To: "a@example.com"}) // wakes local subscribers at once
	// raw bytes, committed with the caller's *sql.Tx:
	id, err = b.PublishTx(ctx, tx, emails, "emails", payload)

	report, err := b.Shutdown(ctx) // drains until ctx ends, then releases what is left
	// err is nil when it drained; when ctx ended with rows in work it matches
	// rowactor.ErrNotDrained and ctx.Err(), and report.Released counts what was given back
	// snippet subscribe: end
	_, _, _, _, _ = ddl, sub, id, report, err
}

// Events of the service's own: an audited ack that keeps the row in a "sent" group, a
// retry that records why, and an event a handler names (Event) that parks a row with a
// note. The table has the service's own columns besides the described ones.
func Example_events() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	settled := make(chan rowactor.Settlement, 3)
	b, _ := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"),
		rowactor.WithOnSettled(func(s rowactor.Settlement) { settled <- s }))
	defer b.Shutdown(ctx)
	db, _ := b.DB()
	_, _ = db.Exec(`CREATE TABLE email_jobs (job_id INTEGER PRIMARY KEY, body BLOB NOT NULL,
		name TEXT NOT NULL DEFAULT '', attempt INTEGER NOT NULL DEFAULT 1, locked_until TEXT,
		last_error TEXT, note TEXT)`)
	handler := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		switch {
		case string(d.Payload()) == "no-address":
			return rowactor.Event("park", "waiting for an address")
		case d.Attempt() == 1:
			return rowactor.Retry().WithError(errors.New("smtp: 451 try later"))
		}
		return rowactor.Ack()
	}

	// snippet events: begin
	emails := rowactor.Table{Name: "email_jobs", ID: "job_id", Payload: "body", Group: "name",
		Attempt: "attempt", LockedUntil: "locked_until"}
	sub, err := b.Subscribe(ctx, emails, "emails", handler,
		// An audited ack: keep the row, in a "sent" group, instead of deleting it.
		rowactor.OnEvent("ack", "UPDATE email_jobs SET name = 'sent', locked_until = NULL WHERE job_id = {id}"),
		// A retry that records why.
		rowactor.OnEvent("retry", "UPDATE email_jobs SET last_error = {error}, locked_until = NULL WHERE job_id = {id}"),
		// An event of the service's own: return rowactor.Event("park", reason).
		rowactor.OnEvent("park", "UPDATE email_jobs SET name = 'parked', note = {arg1}, locked_until = NULL WHERE job_id = {id}"),
	)
	// snippet events: end
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = sub
	_, _ = b.Publish(ctx, emails, "emails", []byte("a@example.com"))
	// The hook is called from each delivery as it ends, so a retry's report can come after
	// its redelivery's on a busy machine: print them in attempt order.
	first, second := <-settled, <-settled
	if first.Attempt > second.Attempt {
		first, second = second, first
	}
	fmt.Println(first.Event, second.Event)
	_, _ = b.Publish(ctx, emails, "emails", []byte("no-address"))
	fmt.Println((<-settled).Event)

	rows, _ := db.Query("SELECT job_id, name, attempt, COALESCE(last_error, ''), COALESCE(note, '') FROM email_jobs ORDER BY job_id")
	defer rows.Close()
	for rows.Next() {
		var id, attempt int
		var name, lastError, note string
		_ = rows.Scan(&id, &name, &attempt, &lastError, &note)
		fmt.Printf("%d %s attempt=%d error=%q note=%q\n", id, name, attempt, lastError, note)
	}
	// Output:
	// retry ack
	// park
	// 1 sent attempt=3 error="smtp: 451 try later" note=""
	// 2 parked attempt=2 error="" note="waiting for an address"
}

// Transactional mode on SQLite: the handler's insert, the receipt it publishes and the
// settlement commit together; a Retry rolls the first two back.
func Example_transactional() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	b, _ := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "shop.db"))
	db, _ := b.DB()
	orders := rowactor.Table{Name: "orders_queue", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", LockedUntil: "locked_until"}
	receipts := orders // one table, two queues
	ddl, _ := rowactor.Schema(b.Dialect(), orders)
	_, _ = db.Exec(ddl + ";\nCREATE TABLE totals (order_id INTEGER PRIMARY KEY, total INTEGER NOT NULL)")
	done := make(chan struct{})
	_, _ = b.Subscribe(ctx, receipts, "receipts", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		fmt.Printf("receipt for order %s\n", d.Payload())
		close(done)
		return rowactor.Ack()
	})

	// snippet transactional: begin
	sub, err := b.Subscribe(ctx, orders, "orders", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		tx := d.Tx() // a *sql.Tx on every database
		id, total := string(d.Payload()), 2500
		if _, err := tx.ExecContext(ctx, "INSERT INTO totals (order_id, total) VALUES (?, ?)", id, total); err != nil {
			return rowactor.Fail(err) // rolls the insert back, counts the attempt, retries after a backoff
		}
		if _, err := b.PublishTx(ctx, tx, receipts, "receipts", d.Payload()); err != nil { // commits with the Ack, wakes its subscribers after
			return rowactor.Fail(err)
		}
		if d.Attempt() == 1 {
			return rowactor.Retry() // rolls back the insert and the receipt, still counts the attempt
		}
		return rowactor.Ack() // the business rows, the receipt and the settlement: one commit
	}, rowactor.Transactional())
	// snippet transactional: end
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = sub
	_, _ = b.Publish(ctx, orders, "orders", []byte("42"))
	<-done
	_, _ = b.Shutdown(ctx)

	db, _ = sql.Open("sqlite", filepath.Join(dir, "shop.db")) // Shutdown closed the broker's
	defer db.Close()
	var n, sum int
	_ = db.QueryRow("SELECT COUNT(*), SUM(total) FROM totals").Scan(&n, &sum)
	fmt.Println("totals:", n, "sum:", sum)
	// Output:
	// receipt for order 42
	// totals: 1 sum: 2500
}

// Spans and metrics go to the providers a broker is given; here an in-memory span
// recorder and a metric reader, read after one delivery.
func Example_telemetry() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	url := "sqlite:" + filepath.Join(dir, "jobs.db")
	// snippet telemetry: begin
	// (the program imports its dialect: import _ "github.com/rowactor/rowactor/dialects/sqlite")
	spans := tracetest.NewSpanRecorder() // or an exporter to your collector
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))

	b, err := rowactor.Open(ctx, url,
		rowactor.WithTracerProvider(tp), // an sdktrace.TracerProvider of yours; otel's global if omitted
		rowactor.WithMeterProvider(mp),  // likewise for metrics; rowactor never sets a global
	)
	// snippet telemetry: end
	if err != nil {
		fmt.Println(err)
		return
	}
	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", LockedUntil: "locked_until", Headers: "headers"}
	_ = b.ApplySchema(ctx, jobs)
	acked := make(chan struct{})
	_, _ = b.Subscribe(ctx, jobs, "emails", func(context.Context, *rowactor.Delivery) rowactor.Outcome {
		close(acked)
		return rowactor.Ack()
	})
	_, _ = b.Publish(ctx, jobs, "emails", []byte("welcome@example.com"))
	<-acked
	_, _ = b.Shutdown(ctx) // drains: the delivery settles and its spans end

	// In name order: the publish span ends as Publish returns, which may come after the
	// delivery it woke has settled.
	var ended []string
	for _, s := range spans.Ended() {
		ended = append(ended, fmt.Sprint("span: ", s.Name(), " ", s.SpanKind()))
	}
	slices.Sort(ended)
	fmt.Println(strings.Join(ended, "\n"))
	var rm metricdata.ResourceMetrics
	_ = reader.Collect(ctx, &rm)
	var names []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "rowactor.deliveries" {
				for _, dp := range sum.DataPoints {
					outcome, _ := dp.Attributes.Value("rowactor.outcome")
					fmt.Println("rowactor.deliveries", outcome.AsString(), dp.Value)
				}
			}
			names = append(names, m.Name)
		}
	}
	slices.Sort(names)
	fmt.Println(strings.Join(names, " "))
	// Output:
	// span: process jobs consumer
	// span: publish jobs producer
	// span: settle jobs internal
	// rowactor.deliveries ack 1
	// rowactor.claim.duration rowactor.claim.rows rowactor.deliveries rowactor.deliveries.in_work rowactor.handler.duration rowactor.published rowactor.queue.wait
}

// FIFO groups on SQLite: each account's rows one at a time in id order, accounts side by
// side, and a retried head keeps its place.
func Example_fifo() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	b, _ := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "ledger.db"))
	defer b.Shutdown(ctx)

	// snippet fifo: begin
	ledger := rowactor.Table{Name: "ledger_jobs", ID: "id", Payload: "payload", Group: "account",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until", FIFO: true}
	_ = b.ApplySchema(ctx, ledger)

	var mu sync.Mutex
	seen := map[string][]string{}
	var wg sync.WaitGroup
	wg.Add(6)
	for _, account := range []string{"alice", "bob"} {
		_, err := b.Subscribe(ctx, ledger, account, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			if string(d.Payload()) == "op1" && d.Attempt() == 1 {
				return rowactor.Retry() // the head comes back first: op2 waits behind it
			}
			mu.Lock()
			seen[account] = append(seen[account], fmt.Sprintf("%s(attempt %d)", d.Payload(), d.Attempt()))
			mu.Unlock()
			wg.Done()
			return rowactor.Ack()
		}, rowactor.Workers(4), rowactor.PollInterval(10*time.Millisecond))
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	for i := 1; i <= 3; i++ {
		for _, account := range []string{"alice", "bob"} {
			_, _ = b.Publish(ctx, ledger, account, []byte(fmt.Sprint("op", i)))
		}
	}
	// snippet fifo: end
	wg.Wait()
	fmt.Println("alice:", seen["alice"])
	fmt.Println("bob:", seen["bob"])
	// Output:
	// alice: [op1(attempt 2) op2(attempt 1) op3(attempt 1)]
	// bob: [op1(attempt 2) op2(attempt 1) op3(attempt 1)]
}

// Batches and a running subscription's controls. Not run: SubscribeBatch needs the row
// lock form, on PostgreSQL or MySQL/MariaDB.
func Example_subscribeBatch() {
	ctx := context.Background()
	var (
		b    *rowactor.Broker
		jobs = rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue", Attempt: "attempt"}
		send = func(ctx context.Context, payloads [][]byte) []error { return make([]error, len(payloads)) }
	)
	// snippet batch: begin
	sub, err := b.SubscribeBatch(ctx, jobs, "emails", 50, func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		payloads := make([][]byte, len(ds))
		for i, d := range ds {
			payloads[i] = d.Payload()
		}
		outcomes := make([]rowactor.Outcome, len(ds)) // one per delivery, in order
		for i, err := range send(ctx, payloads) {
			outcomes[i] = rowactor.Ack()
			if err != nil {
				outcomes[i] = rowactor.Fail(err)
			}
		}
		return outcomes // one COMMIT settles them all
	})
	if err != nil {
		return
	}
	sub.SetWorkers(4)    // retune a running subscription
	err = sub.Pause(ctx) // claims stop; deliveries in work go on and settle
	err = sub.Resume(ctx)
	// snippet batch: end
	_ = err
	render := func(ctx context.Context, payload []byte) error { return nil }
	// snippet batch-cancel: begin
	handler := func(ctx context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		outcomes := make([]rowactor.Outcome, len(ds))
		for i, d := range ds {
			outcomes[i] = rowactor.Ack()
			if d.Cancelled() != nil {
				continue // Broker.Cancel took this row: it ends as cancelled whatever is returned
			}
			if err := render(ctx, d.Payload()); err != nil { // ctx runs on for the other rows
				outcomes[i] = rowactor.Fail(err)
			}
		}
		return outcomes
	}
	// snippet batch-cancel: end
	_, _ = b.SubscribeBatch(ctx, jobs, "reports", 10, handler)
}

// Opening a server. Not run: it needs the servers.
func Example_openServers() {
	ctx := context.Background()
	handle := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }
	var b *rowactor.Broker
	var err error
	// snippet servers: begin
	// import _ "github.com/rowactor/rowactor/dialects/postgres" (or …/dialects/mysql)
	b, err = rowactor.Open(ctx, "postgres://app@db:5432/app?sslmode=disable&pool_max_conns=16")
	// or rowactor.New(postgres.New(pool)) over your own *pgxpool.Pool

	b, err = rowactor.Open(ctx, "mysql://app:secret@db:3306/app") // or the driver's DSN: "mysql://app:secret@tcp(db:3306)/app"
	// or rowactor.New(mysql.New(db)) over your own *sql.DB (parseTime=true, loc=UTC)

	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after"} // no LockedUntil, no AdvisoryKey: the row lock form
	sub, err := b.Subscribe(ctx, jobs, "emails", handle, rowactor.Workers(8))
	// snippet servers: end
	_, _ = sub, err
}

// Shutdown with a deadline: a handler that outlives it has its row released, and the
// error says so.
func Example_shutdown() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "rowactor-example-")
	defer os.RemoveAll(dir)
	b, _ := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"))
	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Attempt: "attempt", LockedUntil: "locked_until"}
	_ = b.ApplySchema(ctx, jobs)
	started := make(chan struct{})
	_, _ = b.Subscribe(ctx, jobs, "", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		close(started)
		<-ctx.Done() // a long job that honours its context
		return rowactor.Retry()
	})
	_, _ = b.Publish(ctx, jobs, "", []byte("report"))
	<-started

	// snippet shutdown: begin
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	report, err := b.Shutdown(sctx) // drains until sctx ends, then releases what is left
	if errors.Is(err, rowactor.ErrNotDrained) {
		fmt.Println("released:", report.Released, "deadline:", errors.Is(err, context.DeadlineExceeded))
	}
	// snippet shutdown: end

	// Output:
	// released: 1 deadline: true
}
