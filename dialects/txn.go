package dialects

import (
	"context"
	"errors"
)

// Transactional mode: a subscription mounted Transactional lends each delivery a
// transaction (QueueSpec.Transactional). Ack commits the handler's writes with the
// settlement; every other outcome first rolls the handler's writes back, then settles as
// outside transactional mode. Each form lends it differently, so each form has an
// optional interface; a dialect that cannot serve a form transactionally refuses the
// QueueSpec from Open with a *ConfigError.
//
// Transactions open at the table's isolation level (PostgreSQL: plain BEGIN by default;
// MySQL/MariaDB: READ COMMITTED by default) or SQLite mode (BEGIN DEFERRED by default).

// ErrTxEnded reports a transaction lent to a handler that the database ended or aborted
// on its own before the settlement could commit it: InnoDB rolled it back as a deadlock's
// victim, SQLite rolled it back itself (an interrupted write, SQLITE_FULL, SQLITE_IOERR),
// PostgreSQL aborted it after a failed statement. Nothing written through the lent
// transaction was committed (unless the handler ran COMMIT through it itself, which it
// must never do), none of it will be, and the settlement did not take effect:
// the row returns by its form's rule (row lock: at once, the claim transaction having
// ended; lease: its lease is left to expire, or released; advisory: at the unlock). A
// settlement (LockedClaim.Settle, LeaseTx.SettleLease, TxSession.Settle or Commit, and
// TxLockedClaim.RollbackToSavepoint) that finds its transaction ended returns an error
// that wraps it, never success.
var ErrTxEnded = errors.New("rowactor: the database ended the delivery's transaction")

// DeliveryTx is a transaction lent to a transactional handler.
type DeliveryTx interface {
	// Tx is the driver's transaction: pgx.Tx on PostgreSQL, *sql.Tx on MySQL and SQLite.
	Tx() any

	// Interrupt ends the lent transaction while the handler it was lent to may still be
	// running and using it: the runtime gives up on a handler that overran its deadline
	// (rowactor.Timeout) and gives the row back without waiting for it. It is called from
	// another goroutine than the handler's, and must be safe against the handler's
	// statements on the transaction, before, during and after it. Afterwards the
	// transaction is rolled back (or will be, by the server, as after a crash), and what it
	// held is given up as Rollback (row lock: the row's lock) or Abort (advisory: the key,
	// and the session's connection) would: the row is claimable again, except in the
	// lease form, whose lease the runtime releases itself. The transaction's pool
	// connection is given up too (returned, closed, or taken out of its pool), and every
	// later call on the holder ends nothing more. The handler's later statements through the
	// transaction fail.
	//
	// It may wait for a statement the handler is running through the transaction, where
	// the driver serialises a rollback behind it (database/sql); a statement run with the
	// handler's context ends with that context, and has ended by the time the runtime
	// calls Interrupt. It never waits for a handler that runs no statement.
	Interrupt(ctx context.Context) error
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

// TxLeaseQueue opens a transaction per transactional delivery of the lease form: the
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
	// Rollback discards the transaction (a no-op once it ended).
	Rollback(ctx context.Context) error
}

// TxSession is an advisory session that opens a transaction on the connection holding
// its key. While the transaction is open, Settle runs inside it.
type TxSession interface {
	Session
	DeliveryTx
	// Begin opens the transaction, after the take.
	Begin(ctx context.Context) error
	// Commit ends the transaction with its writes (the handler's and the settlement's).
	Commit(ctx context.Context) error
	// Rollback discards the transaction (a no-op once it ended).
	Rollback(ctx context.Context) error
}
