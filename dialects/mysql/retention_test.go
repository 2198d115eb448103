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
