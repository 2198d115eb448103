package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
)

var (
	_ dialects.Elector         = (*Dialect)(nil)
	_ dialects.UniqueKeyReader = (*Dialect)(nil)
)

// Elect holds lock's advisory key in a transaction of its own while fn runs: the server
// ends the wait itself (lock_timeout), and a session that dies takes the key with it.
func (d *Dialect) Elect(ctx context.Context, lock string, wait time.Duration, fn func(ctx context.Context, tx any) error) (bool, error) {
	begin, take := "BEGIN", "SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))::text"
	if wait > 0 {
		begin += "; SET LOCAL lock_timeout = " + strconv.FormatInt(max(wait.Milliseconds(), 1), 10)
	} else {
		take = "SELECT pg_try_advisory_xact_lock(hashtextextended($1::text, 0))::text"
	}
	tx, err := d.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
	if err != nil {
		return false, fmt.Errorf("postgres: elect %s: %w", lock, err)
	}
	rollback := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = tx.Rollback(rctx)
		cancel()
	}
	got, err := takeLock(ctx, tx, take, dialects.LockKey(lock), wait)
	if err == nil && ctx.Err() != nil {
		err = ctx.Err() // taken as the caller gave up: the rollback lets it go
	}
	if err != nil {
		rollback()
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "55P03" {
			return false, nil
		}
		return false, fmt.Errorf("postgres: elect %s: %w", lock, err)
	}
	if got == "false" {
		rollback()
		return false, nil
	}
	if wait > 0 {
		// fn's statements wait for row locks as any would.
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout TO DEFAULT"); err != nil {
			rollback()
			return true, fmt.Errorf("postgres: elect %s: %w", lock, err)
		}
	}
	if err := fn(ctx, tx); err != nil {
		rollback()
		return true, err
	}
	// The commit lets the key go with what fn wrote; a commit the server refuses (the
	// session ended) wrote nothing and held nothing.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	err = tx.Commit(cctx)
	cancel()
	if err != nil {
		return true, fmt.Errorf("postgres: elect %s: commit: %w", lock, err)
	}
	return true, nil
}

// NewestUniqueKey compares the keys in the "C" collation, byte by byte as UTF-8; Schema
// renders the key column in it, so its unique index serves the scan.
func (d *Dialect) NewestUniqueKey(ctx context.Context, tx any, t dialects.Table, low, high string) (string, bool, error) {
	var db interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	}
	switch x := tx.(type) {
	case nil:
		db = d.pool
	case pgx.Tx:
		db = x
	default:
		return "", false, fmt.Errorf("postgres: NewestUniqueKey needs a pgx.Tx, got %T", tx)
	}
	if tx == nil { // in a transaction, the caller checked the table before (its own connection)
		if err := d.checkTable(ctx, t); err != nil {
			return "", false, err
		}
	}
	if err := tablecheck.CheckKeyRange(t, low, high); err != nil {
		return "", false, err
	}
	k := quote(t.UniqueKey) + ` COLLATE "C"`
	var key string
	err := db.QueryRow(ctx, "SELECT "+quote(t.UniqueKey)+" FROM "+quote(t.Name)+" WHERE "+k+" >= $1 AND "+k+" < $2 ORDER BY "+
		k+" DESC LIMIT 1", low, high).Scan(&key)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, adminErr("read unique keys", t.Name, err)
	}
	return key, true, nil
}

// takeLock runs the lock's statement without letting ctx cut it off: pgx gives up on a
// statement whose context ends by closing its socket, and the server, which does not
// notice while the statement waits in the lock's queue, would take the lock for a client
// that left and hold it until it finds the socket closed. Here, when ctx ends first, the
// server is asked to cancel the wait (a cancel request on a connection of its own), and
// the statement ends on the session, which stays usable. got is "" from the waiting
// lock (void), "true" or "false" from the try.
func takeLock(ctx context.Context, tx pgx.Tx, take, key string, wait time.Duration) (string, error) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait+10*time.Second)
	defer cancel()
	sent := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(sent)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Conn().PgConn().CancelRequest(cctx)
	})
	var got string
	err := tx.QueryRow(sctx, take, key).Scan(&got)
	if !stop() {
		<-sent // the caller rolls back next; the request went before it
	}
	return got, err
}
