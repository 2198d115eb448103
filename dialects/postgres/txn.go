package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor/dialects"
)

// Transactional mode lends pgx.Tx values: the row lock claim's own transaction, a
// transaction of its own per lease delivery (on a pool connection acquired for it), and
// one on the advisory session's connection. Each opens at the table's isolation level
// (txOptions). A connection that carried a lent transaction returns to the pool only when
// the server reports it idle outside a transaction; otherwise it is closed, and the server
// rolls back whatever it held.

// errNotInTx is a lent transaction ended behind rowactor's back (a COMMIT or ROLLBACK run
// through it by the handler): what rowactor would run next would not be in it.
var errNotInTx = errors.New("the transaction was ended outside rowactor (the handler must not commit or roll back the transaction it is lent)")

// errTxEnded is a delivery's transaction used after it ended.
var errTxEnded = errors.New("the delivery's transaction has already ended")

// inTx refuses a connection that is no longer inside a transaction (open or failed).
func inTx(conn *pgxpool.Conn) error {
	if conn.Conn().PgConn().TxStatus() == 'I' {
		return errNotInTx
	}
	return nil
}

// settleable refuses a connection whose transaction cannot commit a settlement: ended
// outside rowactor (inTx), or aborted by the server (a statement in it failed: a
// deadlock's victim, a serialization failure, any error the handler met), whose every
// statement fails and whose COMMIT is a ROLLBACK. An aborted transaction is reported
// wrapping dialects.ErrTxEnded: nothing of it was or will be committed. pgconn tracks the
// status from each ReadyForQuery, so the check runs no statement.
func settleable(conn *pgxpool.Conn) error {
	if err := inTx(conn); err != nil {
		return err
	}
	if conn.Conn().PgConn().TxStatus() == 'E' {
		return fmt.Errorf("%w: the transaction is aborted (a statement in it failed), so it can only roll back", dialects.ErrTxEnded)
	}
	return nil
}

// ended wraps with dialects.ErrTxEnded the error of a statement or COMMIT that ended its
// transaction by rolling it back: a COMMIT that found the transaction aborted, or a
// statement the server failed with a transaction rollback error (class 40: a deadlock's
// victim, a serialization failure).
func ended(err error) error {
	if err == nil || errors.Is(err, dialects.ErrTxEnded) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.Is(err, pgx.ErrTxCommitRollback) || errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "40") {
		return fmt.Errorf("%w: %w", dialects.ErrTxEnded, err)
	}
	return err
}

// rollbackConn rolls tx back and gives its connection up (endConn). The rollback runs even
// when ctx is what ended the delivery. A transaction pgx has already ended (a commit that
// failed, or one the handler ran) needs no rollback: pgx.ErrTxClosed is no failure.
func rollbackConn(ctx context.Context, conn *pgxpool.Conn, tx claimTx) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	err := tx.Rollback(rctx)
	if errors.Is(err, pgx.ErrTxClosed) {
		err = nil
	}
	endConn(conn, err)
	return err
}

// endConn returns conn to the pool when nothing failed and the server reports it idle
// outside a transaction, and closes it otherwise. Either way the caller no longer owns it.
func endConn(conn *pgxpool.Conn, failed error) {
	pc := conn.Conn().PgConn()
	if failed != nil || pc.IsClosed() || pc.TxStatus() != 'I' {
		_ = closeConn(conn)
		return
	}
	conn.Release()
}

// sever gives up a lent transaction's connection from a goroutine other than the
// handler's, which may still be using it (Interrupt). A pgx connection is not safe for
// concurrent use, so no statement runs on it and none of its state is touched: its socket
// is closed (a net.Conn is safe for concurrent use; pgx closes it from other goroutines
// too), so the server ends the session, rolling its transaction back and releasing its row
// locks and advisory keys, as after a crash; and the pool connection is hijacked out of the
// pool, so the pool's slot is free at once and a pool's Close does not wait for the
// handler. The *pgx.Conn, its socket closed, stays with the handler's pgx.Tx: its next
// statement fails, and nothing else of it needs closing.
func sever(conn *pgxpool.Conn) error {
	err := conn.Conn().PgConn().Conn().Close()
	conn.Hijack()
	if errors.Is(err, net.ErrClosed) {
		err = nil // pgx closed it already (a statement cut off by the handler's context)
	}
	return err
}
