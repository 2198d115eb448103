package main

import (
	"context"
	"fmt"
	"runtime"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// table is a lease-form table without groups.
var table = rowactor.Table{Name: "bench_jobs", ID: "id", Payload: "payload", Attempt: "attempt", LockedUntil: "locked_until"}

// payloadSize is the size of every row's payload.
const payloadSize = 64

// refill drops and recreates the table and inserts rows in one transaction. It runs
// outside the timed window and leaves the WAL checkpointed and the heap collected, so
// every drain starts from the same state.
func refill(ctx context.Context, d *sqlite.Dialect, rows int) error {
	db := d.DB()
	ddl, err := rowactor.Schema(d, table)
	if err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+table.Name+"`"); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op after Commit
	ins, err := tx.PrepareContext(ctx, "INSERT INTO `"+table.Name+"` (`payload`) VALUES (?)")
	if err != nil {
		return err
	}
	payload := make([]byte, payloadSize)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	for range rows {
		if _, err := ins.ExecContext(ctx, payload); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		return err
	}
	runtime.GC()
	return nil
}

// checkEmpty verifies a drain left nothing behind.
func checkEmpty(ctx context.Context, d *sqlite.Dialect) error {
	var n int
	if err := d.DB().QueryRowContext(ctx, "SELECT count(*) FROM `"+table.Name+"`").Scan(&n); err != nil {
		return err
	}
	if n != 0 {
		return fmt.Errorf("%d rows left in the table after the drain", n)
	}
	return nil
}
