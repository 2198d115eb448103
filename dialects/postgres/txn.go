package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// rollbackConn rolls tx back and gives its connection up (endConn). The rollback runs even
// when ctx is what ended the delivery. A transaction pgx has already ended (a commit that
// failed, or one the handler ran) needs no rollback: pgx.ErrTxClosed is no failure.
func rollbackConn(ctx context.Context, conn *pgxpool.Conn, tx pgx.Tx) error {
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
