package mysql

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// Retention must wait on no lock a delivery holds: a row lock claim (or a transactional
// delivery) holds an unfinished row with FOR UPDATE while finished old rows sit around it.
// RetainRound must delete the finished rows and come back at once.
func TestRetainRoundWaitsOnNoClaimedRow(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d, "ra_ret_lock")
	if _, err := d.DB().ExecContext(ctx, "CREATE TABLE "+quote(name)+" (id BIGINT AUTO_INCREMENT PRIMARY KEY, payload LONGBLOB NOT NULL, processed_at DATETIME(6) NULL)"); err != nil {
		t.Fatal(err)
	}
	old := time.Now().UTC().Add(-2 * time.Hour)
	// ids 1, 3: finished and old; id 2: unfinished, held by a claim.
	for _, p := range []any{old, nil, old} {
		if _, err := d.DB().ExecContext(ctx, "INSERT INTO "+quote(name)+" (payload, processed_at) VALUES ('x', ?)", p); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := d.DB().BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted}) // as a row lock claim opens it
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var id int64
	if err := tx.QueryRowContext(ctx, "SELECT id FROM "+quote(name)+" WHERE processed_at IS NULL FOR UPDATE").Scan(&id); err != nil {
		t.Fatal(err)
	}
	tbl := dialects.Table{Name: name, ID: "id", Payload: "payload", ProcessedAt: "processed_at"}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	n, led, err := d.RetainRound(dctx, tbl, name, time.Now().Add(-time.Hour), 10)
	if err != nil || !led || n != 2 || time.Since(start) > 2*time.Second {
		t.Fatalf("RetainRound beside a claimed row: %d rows (led %v), %v, after %v; want 2 rows at once", n, led, err, time.Since(start).Round(time.Millisecond))
	}
}

// A round stopped while a DELETE runs lets that statement finish and releases its lock
// on a healthy connection, so another process leads the next round at once. Cutting the
// statement instead closes the socket, and the server keeps the lock until its thread
// notices, here until a trigger's sleep ends.
func TestRetainRoundStoppedMidStatementFreesItsLockAtOnce(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d, "ra_ret_stop")
	if _, err := d.DB().ExecContext(ctx, "CREATE TABLE "+quote(name)+" (id BIGINT AUTO_INCREMENT PRIMARY KEY, payload LONGBLOB NOT NULL, processed_at DATETIME(6) NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.DB().ExecContext(ctx, "CREATE TRIGGER "+quote(name+"_slow")+" BEFORE DELETE ON "+quote(name)+" FOR EACH ROW DO SLEEP(0.4)"); err != nil {
		t.Fatal(err)
	}
	old := time.Now().UTC().Add(-2 * time.Hour)
	for i := 0; i < 20; i++ {
		if _, err := d.DB().ExecContext(ctx, "INSERT INTO "+quote(name)+" (payload, processed_at) VALUES ('x', ?)", old); err != nil {
			t.Fatal(err)
		}
	}
	tbl := dialects.Table{Name: name, ID: "id", Payload: "payload", ProcessedAt: "processed_at"}
	rctx, stop := context.WithCancel(ctx)
	time.AfterFunc(600*time.Millisecond, stop) // in the second row's DELETE
	n, led, err := d.RetainRound(rctx, tbl, name, time.Now().Add(-time.Hour), 5)
	if err != nil || !led {
		t.Fatalf("the stopped round: %d rows, led %v, %v; want led and no error", n, led, err)
	}
	other := newDialect(t)
	_, led, err = other.RetainRound(ctx, tbl, name, time.Now().Add(-3*time.Hour), 1)
	if err != nil || !led {
		t.Fatalf("another process right after the stopped round: led %v, %v; want it to lead", led, err)
	}
	// The stopped batch rolled back whole: no row is half gone, none deleted and uncounted.
	var left int64
	if err := d.DB().QueryRowContext(ctx, "SELECT count(*) FROM "+quote(name)).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left+n != 20 {
		t.Fatalf("%d rows left and %d counted deleted; want 20 together", left, n)
	}
}
