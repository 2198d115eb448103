package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// A round stopped while a DELETE runs lets that statement finish and releases its key on
// a healthy connection, so another process leads the next round at once, and the rows
// the round counts are the rows gone.
func TestRetainRoundStoppedMidStatementFreesItsKeyAtOnce(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d)
	q := quote(name)
	for _, stmt := range []string{
		"CREATE TABLE " + q + " (id bigserial PRIMARY KEY, payload bytea NOT NULL, processed_at timestamptz)",
		"CREATE FUNCTION " + quote(name+"_slow") + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.1); RETURN OLD; END $$",
		"CREATE TRIGGER " + quote(name+"_slow") + " BEFORE DELETE ON " + q + " FOR EACH ROW EXECUTE FUNCTION " + quote(name+"_slow") + "()",
		"INSERT INTO " + q + " (payload, processed_at) SELECT 'x', now() - interval '2 hours' FROM generate_series(1, 20)",
	} {
		if _, err := d.Pool().Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = d.Pool().Exec(context.Background(), "DROP FUNCTION IF EXISTS "+quote(name+"_slow")+"() CASCADE")
	})
	tbl := dialects.Table{Name: name, ID: "id", Payload: "payload", ProcessedAt: "processed_at"}
	rctx, stop := context.WithCancel(ctx)
	time.AfterFunc(300*time.Millisecond, stop) // in the first batch's DELETE
	n, led, err := d.RetainRound(rctx, tbl, name, time.Now().Add(-time.Hour), 5)
	if err != nil || !led {
		t.Fatalf("the stopped round: %d rows, led %v, %v; want led and no error", n, led, err)
	}
	other := newDialect(t)
	_, led, err = other.RetainRound(ctx, tbl, name, time.Now().Add(-3*time.Hour), 1)
	if err != nil || !led {
		t.Fatalf("another process right after the stopped round: led %v, %v; want it to lead", led, err)
	}
	var left int64
	if err := d.Pool().QueryRow(ctx, "SELECT count(*) FROM "+q).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left+n != 20 {
		t.Fatalf("%d rows left and %d counted deleted; want 20 together", left, n)
	}
}
