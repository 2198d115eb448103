package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/sqlite"
	"github.com/rowactor/rowactor/outbox"
)

// execAll runs a schema's statements.
func execAll(db *sql.DB, ddl string) error {
	for _, s := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(s) == "" {
			continue
		}
		if _, err := db.Exec(s); err != nil {
			return err
		}
	}
	return nil
}

// An order service records an event in the transaction that writes the order; the relay
// publishes it into a rowactor queue; the consumer's Ack stamps the record processed.
func Example() {
	// snippet outbox: begin
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example-")
	defer os.RemoveAll(dir)
	d, err := sqlite.Open(ctx, filepath.Join(dir, "orders.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()

	events := outbox.Table{Name: "order_outbox", ID: "id", Topic: "topic", Payload: "payload",
		Headers: "headers", SentAt: "sent_at", ProcessedAt: "processed_at"}
	jobs := rowactor.Table{Name: "order_events", ID: "id", Payload: "payload", Group: "queue",
		LockedUntil: "locked_until", Headers: "headers"}
	obDDL, _ := outbox.Schema(d, events)
	jobsDDL, _ := rowactor.Schema(d, jobs)
	if err := execAll(d.DB(), obDDL+jobsDDL+"CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT);\n"); err != nil {
		fmt.Println(err)
		return
	}
	ob, err := outbox.New(ctx, d, events)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ob.Close()

	// The consumer: ob.Handler settles the record by the handler's outcome.
	b, _ := rowactor.New(d)
	defer b.Shutdown(ctx)
	handled := make(chan string, 1)
	if _, err := b.Subscribe(ctx, jobs, "order.created", ob.Handler(func(ctx context.Context, dl *rowactor.Delivery) rowactor.Outcome {
		handled <- fmt.Sprintf("handled %s (record %s)", dl.Payload(), dl.Header(outbox.IDHeader))
		return rowactor.Ack()
	}), rowactor.Lease(time.Minute)); err != nil {
		fmt.Println(err)
		return
	}

	// The relay: publishes each record into the queue named by its topic.
	sink, _ := outbox.NewQueueSink(b, jobs, "")
	relay, err := ob.StartRelay(sink)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer relay.Stop(ctx)

	// The order and its event commit together.
	tx, _ := d.DB().BeginTx(ctx, nil)
	_, _ = tx.ExecContext(ctx, "INSERT INTO orders (id, item) VALUES (1, 'book')")
	id, err := ob.Record(ctx, tx, "order.created", []byte(`{"order":1}`), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := tx.Commit(); err != nil {
		fmt.Println(err)
		return
	}
	ob.Wake() // send it now rather than at the next poll

	fmt.Println(<-handled)
	for {
		st, err := ob.Status(ctx, id)
		if err != nil {
			fmt.Println(err)
			return
		}
		if st.Processed() {
			fmt.Println("record", id, "sent:", st.Sent(), "processed:", st.Processed())
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// snippet outbox: end

	// Output:
	// handled {"order":1} (record 1)
	// record 1 sent: true processed: true
}

// Schema renders an outbox table for the dialect.
func ExampleSchema() {
	ddl, err := outbox.Schema(sqlite.New(nil), outbox.Table{Name: "outbox", ID: "id", Topic: "topic",
		Payload: "payload", Headers: "headers", SentAt: "sent_at", ProcessedAt: "processed_at"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(ddl)
	// Output:
	// CREATE TABLE IF NOT EXISTS `outbox` (
	//   `id` INTEGER PRIMARY KEY AUTOINCREMENT,
	//   `topic` TEXT NOT NULL,
	//   `payload` BLOB NOT NULL,
	//   `headers` TEXT,
	//   `sent_at` TEXT,
	//   `processed_at` TEXT
	// );
	// CREATE INDEX IF NOT EXISTS `outbox_unsent` ON `outbox` (`id`) WHERE `sent_at` IS NULL;
	// CREATE INDEX IF NOT EXISTS `outbox_unprocessed` ON `outbox` (`id`) WHERE `processed_at` IS NULL;
}

// A consumer makes its effect once per record, in the transaction that makes it.
func ExampleDedupe_Once() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example-")
	defer os.RemoveAll(dir)
	d, err := sqlite.Open(ctx, filepath.Join(dir, "consumer.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()
	seen := outbox.DedupeTable{Name: "seen", ID: "record_id", SeenAt: "seen_at"}
	ddl, _ := outbox.DedupeSchema(d, seen)
	if err := execAll(d.DB(), ddl+"CREATE TABLE shipments (record_id INTEGER);\n"); err != nil {
		fmt.Println(err)
		return
	}
	dd, err := outbox.NewDedupe(ctx, d, seen)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dd.Close()

	ship := func(recordID int64) {
		tx, _ := d.DB().BeginTx(ctx, nil)
		defer tx.Rollback()
		first, err := dd.Once(ctx, tx, recordID)
		if err != nil {
			fmt.Println(err)
			return
		}
		if first {
			_, _ = tx.ExecContext(ctx, "INSERT INTO shipments (record_id) VALUES (?)", recordID)
		}
		fmt.Println("record", recordID, "first:", first)
		_ = tx.Commit()
	}
	ship(42)
	ship(42) // delivered twice: no second shipment
	var n int
	_ = d.DB().QueryRow("SELECT COUNT(*) FROM shipments").Scan(&n)
	fmt.Println("shipments:", n)
	// Output:
	// record 42 first: true
	// record 42 first: false
	// shipments: 1
}

// A relay can send to anything through a SinkFunc; the record's id rides in IDHeader.
func ExampleSinkFunc() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example-")
	defer os.RemoveAll(dir)
	d, err := sqlite.Open(ctx, filepath.Join(dir, "orders.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()
	events := outbox.Table{Name: "outbox", ID: "id", Topic: "topic", Payload: "payload",
		SentAt: "sent_at", ProcessedAt: "processed_at"}
	ddl, _ := outbox.Schema(d, events)
	if err := execAll(d.DB(), ddl); err != nil {
		fmt.Println(err)
		return
	}
	ob, err := outbox.New(ctx, d, events)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ob.Close()
	for _, item := range []string{"book", "pen"} {
		tx, _ := d.DB().BeginTx(ctx, nil)
		_, _ = ob.Record(ctx, tx, "order.created", []byte(item), nil)
		_ = tx.Commit()
	}

	sent := make(chan string, 2)
	relay, err := ob.StartRelay(outbox.SinkFunc(func(ctx context.Context, r outbox.Record) error {
		sent <- fmt.Sprintf("%s %s id=%s", r.Topic, r.Payload, r.Headers[outbox.IDHeader])
		return nil // in the sink's keeping: the relay stamps it sent
	}))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(<-sent)
	fmt.Println(<-sent)
	_ = relay.Stop(ctx)
	// Output:
	// order.created book id=1
	// order.created pen id=2
}

// Records routed to two consumer services on two databases: each consumer broker takes a
// Consumer of its own, whose Handler wraps its subscriptions and whose Settled is its
// broker's hook, so a settlement on one database never stamps a record the other awaits.
func ExampleOutbox_Consumer() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example-")
	defer os.RemoveAll(dir)
	open := func(file string) *sqlite.Dialect {
		d, err := sqlite.Open(ctx, filepath.Join(dir, file))
		if err != nil {
			panic(err)
		}
		return d
	}
	orders, shipping, billing := open("orders.db"), open("shipping.db"), open("billing.db")
	defer orders.Close()
	defer shipping.Close()
	defer billing.Close()
	events := outbox.Table{Name: "order_outbox", ID: "id", Topic: "topic", Payload: "payload",
		Headers: "headers", SentAt: "sent_at", ProcessedAt: "processed_at"}
	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
		LockedUntil: "locked_until", Headers: "headers"}
	obDDL, _ := outbox.Schema(orders, events)
	jobsDDL, _ := rowactor.Schema(shipping, jobs)
	for db, ddl := range map[*sql.DB]string{orders.DB(): obDDL, shipping.DB(): jobsDDL, billing.DB(): jobsDDL} {
		if err := execAll(db, ddl); err != nil {
			fmt.Println(err)
			return
		}
	}
	ob, err := outbox.New(ctx, orders, events)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ob.Close()

	// snippet consumers: begin
	handled := make(chan string, 2)
	consume := func(d *sqlite.Dialect, topic string) *rowactor.Broker {
		c := ob.Consumer() // one per consumer broker
		b, _ := rowactor.New(d, rowactor.WithOnSettled(c.Settled))
		_, err := b.Subscribe(ctx, jobs, topic, c.Handler(func(ctx context.Context, dl *rowactor.Delivery) rowactor.Outcome {
			// ... the effect, written through dl.Tx(), commits with the Ack
			handled <- fmt.Sprintf("%s: record %s", topic, dl.Header(outbox.IDHeader))
			return rowactor.Ack()
		}), rowactor.Transactional(), rowactor.Lease(time.Minute))
		if err != nil {
			panic(err)
		}
		return b
	}
	toShipping, toBilling := consume(shipping, "order.created"), consume(billing, "invoice.due")
	defer toShipping.Shutdown(ctx)
	defer toBilling.Shutdown(ctx)
	// The relay routes each record by its topic to its consumer's database.
	shipSink, _ := outbox.NewQueueSink(toShipping, jobs, "")
	billSink, _ := outbox.NewQueueSink(toBilling, jobs, "")
	relay, err := ob.StartRelay(outbox.SinkFunc(func(ctx context.Context, r outbox.Record) error {
		if r.Topic == "invoice.due" {
			return billSink.Send(ctx, r)
		}
		return shipSink.Send(ctx, r)
	}))
	// snippet consumers: end
	if err != nil {
		fmt.Println(err)
		return
	}
	defer relay.Stop(ctx)

	tx, _ := orders.DB().BeginTx(ctx, nil)
	_, _ = ob.Record(ctx, tx, "order.created", []byte(`{"order":1}`), nil)
	_, _ = ob.Record(ctx, tx, "invoice.due", []byte(`{"order":1}`), nil)
	_ = tx.Commit()
	ob.Wake()
	got := []string{<-handled, <-handled}
	sort.Strings(got)
	fmt.Println(got[0])
	fmt.Println(got[1])
	for id := int64(1); id <= 2; id++ {
		for {
			st, err := ob.Status(ctx, id)
			if err != nil {
				fmt.Println(err)
				return
			}
			if st.Processed() {
				fmt.Println("record", id, "processed")
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Output:
	// invoice.due: record 2
	// order.created: record 1
	// record 1 processed
	// record 2 processed
}
