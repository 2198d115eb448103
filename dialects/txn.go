package dialects

import (
	"context"
	"database/sql"
	"errors"
)

// Transactional mode: a subscription mounted Transactional lends each delivery a
// transaction (QueueSpec.Transactional).
//
//   - Ack commits the handler's writes with the settlement.
//   - Every other outcome first rolls the handler's writes back, then settles as outside
//     transactional mode.
//
// Each form lends the transaction differently, so each form has an optional interface.
// A dialect that cannot serve a form transactionally refuses the QueueSpec from Open
// with a *ConfigError.
//
// Transactions open at the table's isolation level, or in its SQLite mode. By default
// that is a plain BEGIN on PostgreSQL, READ COMMITTED on MySQL/MariaDB, and BEGIN
// DEFERRED on SQLite.

// ErrTxEnded reports a transaction lent to a handler that the database ended or aborted
// on its own before the settlement could commit it. For example:
//
//   - InnoDB rolled it back as a deadlock's victim;
//   - SQLite rolled it back itself, after an interrupted write, SQLITE_FULL or
//     SQLITE_IOERR;
//   - PostgreSQL aborted it after a failed statement.
//
// Nothing written through the lent transaction was committed, and none of it will be,
// unless the handler ran COMMIT through it itself, which it must never do. The
// settlement did not take effect, and the row returns by its form's rule: at once in the
// row lock form, since the claim transaction ended; in the lease form its lease is left
// to expire, or released; in the advisory form at the unlock.
//
// The rule for a dialect: a settlement that finds its transaction ended returns an
// error that wraps ErrTxEnded, never success. The settlements are LockedClaim.Settle,
// LeaseTx.SettleLease, TxSession.Settle and Commit, and TxLockedClaim.RollbackToSavepoint.
var ErrTxEnded = errors.New("rowactor: the database ended the delivery's transaction")

// DeliveryTx is a transaction lent to a transactional handler.
type DeliveryTx interface {
	// Tx is the driver's transaction: pgx.Tx on PostgreSQL, *sql.Tx on MySQL and SQLite.
	Tx() any

	// Interrupt ends the lent transaction while the handler it was lent to may still be
	// running and using it. The runtime calls it when it gives up on a handler that
	// overran its deadline (rowactor.Timeout), and gives the row back without waiting.
	//
	// It is called from another goroutine than the handler's, and must be safe against
	// the handler's statements on the transaction, before, during and after it.
	//
	// Afterwards:
	//
	//   - the transaction is rolled back, or will be by the server, as after a crash;
	//   - what it held is given up as Rollback or Abort would: the row's lock in the row
	//     lock form, the key and the session's connection in the advisory form. The row
	//     is claimable again, except in the lease form, whose lease the runtime releases
	//     itself;
	//   - the transaction's pool connection is given up too: returned, closed, or taken
	//     out of its pool;
	//   - every later call on the holder ends nothing more, and the handler's later
	//     statements through the transaction fail.
	//
	// It may wait for a statement the handler is running through the transaction, where
	// the driver serialises a rollback behind it, as database/sql does. A statement run
	// with the handler's context ends with that context, and has ended by the time the
	// runtime calls Interrupt. It never waits for a handler that runs no statement.
	Interrupt(ctx context.Context) error
}

// SQLLender is a DeliveryTx whose driver transaction is not a *sql.Tx (pgx.Tx on
// PostgreSQL): it lends the same transaction, on the same session, as a *sql.Tx.
//
// SQLTx returns it until end is called. Its Commit and Rollback run nothing: the
// settlement ends the transaction. end ends it as database/sql ends a transaction,
// running nothing on the session: it waits for statements in flight through it and
// closes its rows left open, and afterwards its statements fail with sql.ErrTxDone. The
// runtime calls end once the handler returned, before the settlement. SQLTx returns nil
// where Tx does.
type SQLLender interface {
	SQLTx() (tx *sql.Tx, end func())
}

// SQLTx returns dt's transaction as a *sql.Tx: through SQLLender where dt implements it,
// else Tx itself when it is a *sql.Tx (end then does nothing); nil otherwise.
func SQLTx(dt DeliveryTx) (tx *sql.Tx, end func()) {
	if l, ok := dt.(SQLLender); ok {
		return l.SQLTx()
	}
	stx, _ := dt.Tx().(*sql.Tx)
	return stx, func() {}
}

// TxLockedClaim is a row lock claim whose transaction is lent to the handler. A
// transactional subscription's RowLockQueue returns one from ClaimLocked.
type TxLockedClaim interface {
	LockedClaim
	DeliveryTx
	// Savepoint sets a savepoint right after the claim.
	Savepoint(ctx context.Context) error
	// RollbackToSavepoint discards the handler's writes and keeps the row locked, so a
	// retry can still count the attempt in the same transaction.
	RollbackToSavepoint(ctx context.Context) error
}

// TxLeaseQueue opens a transaction per transactional delivery of the lease form, whose
// claim has committed already.
type TxLeaseQueue interface {
	LeaseQueue
	// BeginDelivery opens a transaction on a pool connection of its own.
	BeginDelivery(ctx context.Context) (LeaseTx, error)
}

// LeaseTx is a lease-form delivery's transaction.
type LeaseTx interface {
	DeliveryTx
	// SettleLease runs the step fenced by the token inside the transaction and commits
	// when the row still held the token. Otherwise it rolls everything back, the
	// handler's writes included, and reports false. Either way the transaction is over.
	SettleLease(ctx context.Context, step Step, held Lease) (bool, error)
	// Rollback discards the transaction. Once it ended, Rollback does nothing.
	Rollback(ctx context.Context) error
}

// TxSession is an advisory session that opens a transaction on the connection holding
// its key. While the transaction is open, Settle runs inside it.
type TxSession interface {
	Session
	DeliveryTx
	// Begin opens the transaction, after the take.
	Begin(ctx context.Context) error
	// Commit ends the transaction with its writes: the handler's and the settlement's.
	Commit(ctx context.Context) error
	// Rollback discards the transaction. Once it ended, Rollback does nothing.
	Rollback(ctx context.Context) error
}
