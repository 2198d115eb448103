// Outbox: an order service's event leaves only with its order, and is handled once.
//
// The order service keeps its orders in one SQLite file (orders.db). Each order and its
// "order.created" record are written in one transaction through outbox.Record, so the
// record exists exactly when the order does: the third order is refused (out of stock)
// and rolled back, and no record is ever sent for it.
//
// A relay (one actor) sends each record into a rowactor queue table in a second SQLite
// file (shipping.db), with the record's id in a header. The shipping consumer handles the
// queue transactionally: in the delivery's transaction it checks the record id with an
// outbox.Dedupe and inserts a shipment, and acks. outbox's Handler then stamps the record
// processed in orders.db, once the Ack committed.
//
// The program waits until every record shows processed, prints each order's record with
// its sent and processed stamps, checks in SQL that there is one shipment per committed
// order, and exits 1 if anything is off. It needs no server.
//
//	go run ./examples/outbox
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/sqlite"
	"github.com/rowactor/rowactor/outbox"
)

var (
	events = outbox.Table{Name: "order_outbox", ID: "id", Topic: "topic", Payload: "payload",
		Headers: "headers", SentAt: "sent_at", ProcessedAt: "processed_at"}
	shipping = rowactor.Table{Name: "shipping_jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until", Headers: "headers"}
	seen = outbox.DedupeTable{Name: "shipping_seen", ID: "record_id", SeenAt: "seen_at"}
)

type order struct {
	id    int
	item  string
	stock bool // false: the service refuses the order and rolls back
}

func main() {
	dir, err := os.MkdirTemp("", "rowactor-outbox-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox:", err)
		os.Exit(1)
	}
	err = run(context.Background(), dir)
	os.RemoveAll(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dir string) error {
	orders, err := sqlite.Open(ctx, filepath.Join(dir, "orders.db"))
	if err != nil {
		return err
	}
	defer orders.Close()
	ship, err := sqlite.Open(ctx, filepath.Join(dir, "shipping.db"))
	if err != nil {
		return err
	}
	defer ship.Close()

	ddl, err := outbox.Schema(orders, events)
	if err != nil {
		return err
	}
	if err := execAll(orders.DB(), ddl+"CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL);\n"); err != nil {
		return fmt.Errorf("orders.db: %w", err)
	}
	qDDL, err := rowactor.Schema(ship, shipping)
	if err != nil {
		return err
	}
	dDDL, err := outbox.DedupeSchema(ship, seen)
	if err != nil {
		return err
	}
	if err := execAll(ship.DB(), qDDL+dDDL+"CREATE TABLE shipments (record_id INTEGER NOT NULL, item TEXT NOT NULL);\n"); err != nil {
		return fmt.Errorf("shipping.db: %w", err)
	}

	ob, err := outbox.New(ctx, orders, events)
	if err != nil {
		return err
	}
	defer ob.Close()
	dedupe, err := outbox.NewDedupe(ctx, ship, seen)
	if err != nil {
		return err
	}
	defer dedupe.Close()

	// The shipping side: its broker tells ob of each settlement, so a transactional Ack
	// stamps the record only once it committed.
	b, err := rowactor.New(ship, rowactor.WithOnSettled(ob.Settled))
	if err != nil {
		return err
	}
	defer b.Shutdown(ctx)
	_, err = b.Subscribe(ctx, shipping, "order.created", ob.Handler(func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		id, _ := outbox.RecordID(d)
		tx := d.Tx()
		first, err := dedupe.Once(ctx, tx, id)
		if err != nil {
			return rowactor.RetryAfter(time.Second)
		}
		if first { // a record delivered twice ships once
			if _, err := tx.ExecContext(ctx, "INSERT INTO shipments (record_id, item) VALUES (?, ?)", id, string(d.Payload())); err != nil {
				return rowactor.RetryAfter(time.Second)
			}
		}
		return rowactor.Ack() // the shipment, the dedupe row and the settlement: one commit
	}), rowactor.Workers(2), rowactor.Transactional())
	if err != nil {
		return err
	}

	// The relay: from orders.db into shipping.db's queue, through the shipping broker.
	sink, err := outbox.NewQueueSink(b, shipping, "")
	if err != nil {
		return err
	}
	relay, err := ob.StartRelay(sink)
	if err != nil {
		return err
	}
	defer relay.Stop(ctx)

	// The order service.
	placed := map[int]int64{} // order id -> record id
	for _, o := range []order{{1, "book", true}, {2, "lamp", true}, {3, "piano", false}, {4, "pen", true}} {
		rec, err := place(ctx, orders.DB(), ob, o)
		switch {
		case errors.Is(err, errOutOfStock):
			continue
		case err != nil:
			return err
		}
		placed[o.id] = rec
		ob.Wake() // after the commit: send now rather than at the next poll
	}

	// Wait for every record to show processed.
	deadline := time.Now().Add(20 * time.Second)
	for oid := 1; oid <= 4; oid++ {
		rec, ok := placed[oid]
		if !ok {
			fmt.Printf("order %d: refused and rolled back; no record\n", oid)
			continue
		}
		for {
			st, err := ob.Status(ctx, rec)
			if err != nil {
				return err
			}
			if st.Processed() {
				fmt.Printf("order %d: record %d sent %s, processed %s\n", oid, rec,
					st.SentAt.Format(time.RFC3339Nano), st.ProcessedAt.Format(time.RFC3339Nano))
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("order %d: record %d is not processed after 20 s (sent: %v)", oid, rec, st.Sent())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	var records, shipments, distinct int
	if err := orders.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM order_outbox").Scan(&records); err != nil {
		return err
	}
	if err := ship.DB().QueryRowContext(ctx, "SELECT COUNT(*), COUNT(DISTINCT record_id) FROM shipments").Scan(&shipments, &distinct); err != nil {
		return err
	}
	fmt.Printf("records=%d shipments=%d\n", records, shipments)
	if records != len(placed) || shipments != len(placed) || distinct != len(placed) {
		return fmt.Errorf("want %d records and one shipment each; have %d records, %d shipments of %d records", len(placed), records, shipments, distinct)
	}
	return nil
}

var errOutOfStock = errors.New("out of stock")

// place writes the order and its record in one transaction and returns the record's id;
// a refused order rolls both back and returns errOutOfStock.
func place(ctx context.Context, db *sql.DB, ob *outbox.Outbox, o order) (int64, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, item) VALUES (?, ?)", o.id, o.item); err != nil {
		return 0, err
	}
	rec, err := ob.Record(ctx, tx, "order.created", []byte(o.item), map[string]string{"order": fmt.Sprint(o.id)})
	if err != nil {
		return 0, err
	}
	if !o.stock {
		return 0, errOutOfStock // the deferred rollback takes the order and its record
	}
	return rec, tx.Commit()
}

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
