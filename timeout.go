package rowactor

import "time"

// Timeout bounds each handler call of the subscription to d from its start. The handler's
// context ends at the deadline (ctx.Err() is context.DeadlineExceeded, ctx.Deadline()
// reports it), so its statements and calls made with ctx stop there; the handler may move
// its own deadline with Delivery.SetTimeout. A batch handler's whole batch has one
// deadline.
//
// A handler that returns after its deadline has failed, whatever it returned: its row
// settles as Fail with an error wrapping context.DeadlineExceeded (a Fail whose error
// wraps it already is kept as the handler gave it), so the retry policy's delay, the
// attempt count, the error column (Table.Error) and the dead letter at the cap apply as to
// any failure. In transactional mode an Ack returned late is refused too: its writes are
// rolled back with the failure, since the deadline bounds the delivery's commit as well.
//
// A handler still running a grace past its deadline (a tenth of its timeout, at least one
// second) ignores its context, and is given up on. rowactor logs one warning (attributes
// table, queue, id, attempt, form, timeout, grace), counts it in the
// rowactor.deliveries.abandoned metric, gives the row back by its form's rule as Shutdown
// gives back a row whose handler still runs (lease: released at once; row lock: the claim
// transaction rolled back, its connection back to the pool; advisory: the key unlocked and
// its session's connection closed), and frees the worker, so the subscription claims the
// next row. The WithOnSettled hook is told then: Step "release", Released, and an Err
// wrapping ErrAbandoned and context.DeadlineExceeded. Whatever the handler returns later
// changes nothing (it is logged at INFO); in the meantime its row may be delivered again,
// so the abandoned call and the next can overlap, and with WorkersByKey the row's key is
// free for the next row of the key.
//
// In transactional mode the lent transaction is ended under the handler, and its later
// statements through it fail: on PostgreSQL rowactor closes the transaction's connection
// (its socket: a pgx connection takes no other call from a second goroutine) and takes it
// out of the pool, so the server rolls the transaction back and drops its locks; on MySQL
// and SQLite the transaction is rolled back through database/sql, which waits for a
// statement the handler is running through it (one run with the handler's context has
// ended at the deadline already). On PostgreSQL a statement the handler runs through the
// lent transaction when the deadline passes is cut off by closing its connection (pgx's
// way of cancelling): the transaction is gone, so a row lock or advisory row then returns
// as after a crash (the row lock form counts no attempt) rather than failed with backoff.
//
// Defaults to 0: no deadline. A negative d is refused at Subscribe.
func Timeout(d time.Duration) SubscribeOption { return func(c *subscribeConfig) { c.timeout = d } }

// SetTimeout moves the delivery's deadline to d from now, whatever the subscription's
// Timeout (which need not be set): the handler's context reflects it at once (Deadline,
// and Done and Err once it passes), and the rules of Timeout apply to the new deadline,
// its grace counted from it. A handler that knows a row needs longer calls it before the
// deadline: a deadline that passed has ended the context for good, and SetTimeout then
// changes nothing. d <= 0 removes the deadline. In a batch handler it moves the batch's
// deadline. It is safe to call from any goroutine while the handler runs, and does nothing
// after it returned.
func (d *Delivery) SetTimeout(timeout time.Duration) {
	if d.deadline != nil {
		d.deadline.SetTimeout(timeout)
	}
}
