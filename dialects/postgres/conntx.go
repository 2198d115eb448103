package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// claimTx is what a row lock claim runs in its transaction: a pgx.Tx, or a connTx.
type claimTx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// connTx is a claim transaction whose BEGIN was sent in one round trip with the claim's
// statement (rowLockQueue.take), and whose settlement goes in one round trip with its
// COMMIT (execCommit): a row lock delivery then costs two round trips, not four (BEGIN,
// claim, settlement, COMMIT each waiting for the server). pgx opens a pgx.Tx only with a
// BEGIN of its own, so connTx runs the transaction on the connection, ending it as pgx's
// does: a COMMIT the server answers with ROLLBACK reports pgx.ErrTxCommitRollback, and a
// COMMIT or ROLLBACK that fails closes the connection, so the server rolls back.
//
// What it must not break: a transaction the server ended never autocommits. Both round
// trips are one pipeline of statements with one Sync: a statement that fails makes the
// server skip the rest (the COMMIT too) and leaves the transaction aborted, never ended,
// and Settle sends its pipeline only after settleable saw the transaction open and not
// aborted, as it does before a statement of its own.
//
// What it changes: the COMMIT reaches the server with the statement. A settlement whose
// context ends while its statement waits (a trigger's or a foreign key's lock) closes the
// connection, and pgx asks the server to cancel the statement; if the statement finishes
// before the cancel lands, the server runs the COMMIT it has already read. The settlement
// is then reported failed (ErrClosed, or the settle timeout) though it committed, as one
// cut during its COMMIT always could be. It committed what the outcome asked for, once:
// the row is not settled twice, and nothing is lost.
type connTx struct {
	conn *pgx.Conn
	// done says COMMIT or ROLLBACK was sent: later calls report pgx.ErrTxClosed.
	done bool
}

func (t *connTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.done {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.conn.Exec(ctx, sql, args...)
}

func (t *connTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.done {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Query(ctx, sql, args...)
}

func (t *connTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.done {
		return errRow{pgx.ErrTxClosed}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *connTx) Commit(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	tag, err := t.conn.Exec(ctx, "COMMIT")
	return t.ended(ctx, tag, err)
}

func (t *connTx) Rollback(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	if _, err := t.conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = t.conn.Close(ctx)
		return err
	}
	return nil
}

// execCommit runs one statement and the COMMIT in a single round trip.
func (t *connTx) execCommit(ctx context.Context, sql string, args ...any) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	var b pgx.Batch
	b.Queue(sql, args...)
	b.Queue("COMMIT")
	br := t.conn.SendBatch(ctx, &b)
	if _, err := br.Exec(); err != nil {
		// The server skipped the COMMIT: the transaction is aborted, left to a ROLLBACK.
		_ = br.Close()
		return err
	}
	t.done = true
	tag, err := br.Exec()
	cerr := br.Close()
	if err == nil && tag.String() == "COMMIT" {
		// Committed, and the server said so. The session may end before it reads the
		// pipeline's Sync (a pg_terminate_backend then reports FATAL to Close): that
		// undoes nothing, and the connection, closed, is not returned to the pool.
		return nil
	}
	if err == nil {
		err = cerr
	}
	return t.ended(ctx, tag, err)
}

// ended reports a COMMIT's answer: a failure closes the connection unless the server
// says it is outside a transaction (pgx's Commit does the same).
func (t *connTx) ended(ctx context.Context, tag pgconn.CommandTag, err error) error {
	if err != nil {
		if t.conn.PgConn().TxStatus() != 'I' {
			_ = t.conn.Close(ctx)
		}
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// errRow is a pgx.Row whose Scan fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
