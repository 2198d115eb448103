package rowactor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// The calls that let one program run on every database, changing only its URL: the
// schema applied through the broker, the broker's database as a *sql.DB, and PublishTx
// taking a *sql.Tx from it, whose row this process sees soon after the commit.

// schemaOnly runs a scenario in one form: the schema is applied before any claim.
var schemaOnly = []rowactor.Form{rowactor.FormLease}

var oneModelScenarios = []scenario{
	{name: "ApplySchema creates the table and its indexes once, and a second call changes nothing", forms: schemaOnly, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		ctx := context.Background()
		tb := h.table
		tb.Name = h.table.Name + "_applied"
		tb.DeadAt = "dead_at" // a dead-letter group's index too
		tb.UniqueKey = "unique_key"
		t.Cleanup(func() { h.exec("DROP TABLE IF EXISTS " + tb.Name) })
		if err := b.ApplySchema(ctx, tb); err != nil {
			t.Fatalf("ApplySchema: %v", err)
		}
		before := indexesOf(t, h, tb.Name)
		if before < 3 {
			t.Fatalf("%s has %d indexes after ApplySchema, want the claim, dead-letter and unique ones at least", tb.Name, before)
		}
		id, err := b.Publish(ctx, tb, h.queue, []byte("kept"))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.ApplySchema(ctx, tb); err != nil {
			t.Fatalf("ApplySchema a second time: %v", err)
		}
		if after := indexesOf(t, h, tb.Name); after != before {
			t.Fatalf("%d indexes after the second ApplySchema, %d after the first", after, before)
		}
		if !h.drv.state(t, h.d, tb, id).exists {
			t.Fatal("the second ApplySchema lost a row")
		}
	}},
	{name: "a bad description reaches ApplySchema's caller before any statement runs", forms: schemaOnly, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		tb := h.table
		tb.Name = h.table.Name + "_bad"
		tb.Payload = ""
		err := b.ApplySchema(context.Background(), tb)
		var ce *rowactor.ConfigError
		if !errors.As(err, &ce) {
			t.Fatalf("ApplySchema of a description without Payload: %v, want a *ConfigError", err)
		}
		if n := h.drv.count(t, h.d, tablesNamedSQL(h, tb.Name)); n != 0 {
			t.Fatalf("ApplySchema of a bad description created %s", tb.Name)
		}
	}},
	{name: "PublishTx takes a *sql.Tx from DB, with the service's own write, on every database", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		ctx := context.Background()
		db, err := b.DB()
		if err != nil {
			t.Fatal(err)
		}
		orders := h.table.Name + "_orders"
		t.Cleanup(func() { h.exec("DROP TABLE IF EXISTS " + orders) })
		if _, err := db.ExecContext(ctx, "CREATE TABLE "+orders+" (n INTEGER NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		publishWithOrder := func(n int) (int64, *sql.Tx) {
			t.Helper()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+orders+" (n) VALUES ("+fmt.Sprint(n)+")"); err != nil {
				t.Fatal(err)
			}
			id, err := b.PublishTx(ctx, tx, h.table, h.queue, []byte(fmt.Sprintf("order %d", n)))
			if err != nil {
				t.Fatalf("PublishTx with a *sql.Tx: %v", err)
			}
			return id, tx
		}
		gone, tx := publishWithOrder(1)
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		kept, tx := publishWithOrder(2)
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		// SQLite may give the committed row the rolled-back one's id: count them instead.
		if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name); n != 1 || (gone != kept && h.row(gone).exists) {
			t.Fatalf("%d rows after one rolled-back and one committed publish, want 1", n)
		}
		if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+orders); n != 1 {
			t.Fatalf("%d orders, want the committed one", n)
		}
		h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
		if s := h.waitSettled(1)[0]; s.ID != kept || s.Err != nil {
			t.Fatalf("settlement %+v, want row %d acked", s, kept)
		}
	}},
	{name: "a row PublishTx commits is handled soon after the commit, without Wake or NOTIFY", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		// Polling only (PostgreSQL's NOTIFY off) and an hour's poll: only the idle poll's
		// hurry after PublishTx finds the row before the test gives up (15 s).
		b := h.broker(rowactor.WithPollOnly())
		ctx := context.Background()
		h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }, rowactor.PollInterval(time.Hour))
		time.Sleep(200 * time.Millisecond) // the first (empty) claim passed: the subscription idles
		db, err := b.DB()
		if err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		id, err := b.PublishTx(ctx, tx, h.table, h.queue, []byte("committed later"))
		if err != nil {
			t.Fatal(err)
		}
		h.quiet(300 * time.Millisecond) // not before the commit
		committed := time.Now()
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if s := h.waitSettled(1)[0]; s.ID != id {
			t.Fatalf("settled row %d, want %d", s.ID, id)
		}
		t.Logf("handled %v after the commit", time.Since(committed))
		if h.row(id).exists {
			t.Fatal("the row outlived its ack")
		}
	}},
}

// indexesOf counts the indexes of table, the primary key's included where the database
// lists it.
func indexesOf(t *testing.T, h *harness, table string) int {
	t.Helper()
	var q string
	switch h.drv.name {
	case "postgres":
		q = "SELECT COUNT(*) FROM pg_indexes WHERE tablename = '" + table + "'"
	case "mysql":
		q = "SELECT COUNT(DISTINCT index_name) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = '" + table + "'"
	case "sqlite":
		q = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = '" + table + "'"
	default:
		t.Fatalf("indexesOf: no query for %s", h.drv.name)
	}
	return h.drv.count(t, h.d, q)
}

// tablesNamedSQL counts the tables named table.
func tablesNamedSQL(h *harness, table string) string {
	switch h.drv.name {
	case "postgres":
		return "SELECT COUNT(*) FROM pg_tables WHERE tablename = '" + table + "'"
	case "mysql":
		return "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = '" + table + "'"
	}
	return "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '" + strings.ReplaceAll(table, "'", "''") + "'"
}
