package rowactor

import (
	"context"
	"database/sql"
	"errors"
	"sync"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/deadline"
	"github.com/rowactor/rowactor/internal/headers"
)

// Handler handles one delivery and returns its outcome. It runs on a goroutine of its own
// while its delivery actor holds the row. A panic is an unsettled delivery: the row is
// released at once.
//
// ctx ends when the handler returns, and before that:
//   - at the delivery's deadline, if Timeout or Delivery.SetTimeout gave it one; ctx.Err
//     is then context.DeadlineExceeded;
//   - when the broker's Shutdown gives up waiting;
//   - when Broker.Cancel cancels the row. context.Cause then wraps ErrCancelled, and the
//     row ends as cancelled whatever the handler returns.
type Handler func(ctx context.Context, d *Delivery) Outcome

// Delivery is one claimed row lent to a handler.
type Delivery struct {
	broker *Broker
	row    dialects.Row
	table  string
	queue  string

	// lent is the transaction a transactional subscription lends, nil otherwise; sqlTx
	// is it as a *sql.Tx, made by the first Tx, and endSQL ends that once the handler
	// returned. lendingEnded says it has; a later Tx makes none. Guarded by sqlMu.
	lent         dialects.DeliveryTx
	sqlMu        sync.Mutex
	sqlTx        *sql.Tx
	endSQL       func()
	lendingEnded bool

	headersOnce sync.Once
	headers     map[string]string
	// deadline is the handler's context, whose deadline SetTimeout moves; nil outside a
	// subscription's handler.
	deadline *deadline.Context
	// batchCancelled answers Cancelled for a row of a batch, index its place in the batch:
	// the batch's context is shared by its rows, so it cannot tell.
	batchCancelled func(i int) error
	index          int

	mu      sync.Mutex
	pending []wakeTarget // queues published into through tx, woken once the Ack commits
}

type wakeTarget struct {
	table Table
	queue string
}

type deliveryKey struct{}

// Tx is the transaction a Transactional subscription lends the handler, as a *sql.Tx on
// every database; nil outside transactional mode. Use it for the service's own queries
// and for PublishTx. Ack commits them with the settlement; any other outcome rolls them
// back.
//
// It is the delivery's: do not commit or roll it back, and do not use it after the handler
// returned. On PostgreSQL both refuse and run nothing; a COMMIT or ROLLBACK statement
// run through it makes its later statements fail rather than autocommit; and once the
// handler returned its statements fail with sql.ErrTxDone (the settlement waits for
// those in flight). On MySQL and SQLite it is the driver's own *sql.Tx.
//
// On PostgreSQL it runs on the same session as DriverTx's pgx.Tx: a handler may use
// either, or both.
func (d *Delivery) Tx() *sql.Tx {
	if d.lent == nil {
		return nil
	}
	d.sqlMu.Lock()
	defer d.sqlMu.Unlock()
	if d.sqlTx == nil {
		d.sqlTx, d.endSQL = dialects.SQLTx(d.lent)
		if d.lendingEnded {
			d.endSQL() // asked for after the handler returned: done from the start
		}
	}
	return d.sqlTx
}

// endLending ends the *sql.Tx that Tx lent, if it did: it waits for its statements in
// flight and closes its rows left open, so that the settlement has the session to
// itself, and its later statements fail (on PostgreSQL, where the *sql.Tx is rowactor's).
func (d *Delivery) endLending() {
	d.sqlMu.Lock()
	d.lendingEnded = true
	end := d.endSQL
	d.sqlMu.Unlock()
	if end != nil {
		end()
	}
}

// DriverTx is the same transaction as the driver's own type: a pgx.Tx on PostgreSQL, the
// *sql.Tx that Tx returns on MySQL and SQLite; nil outside transactional mode. Use it where
// a library needs pgx's API; PublishTx takes either.
func (d *Delivery) DriverTx() any {
	if d.lent == nil {
		return nil
	}
	return d.lent.Tx()
}

// lends reports whether tx is this delivery's transaction, in either of its types.
func (d *Delivery) lends(tx any) bool {
	if d.lent == nil || tx == nil {
		return false
	}
	if stx, ok := tx.(*sql.Tx); ok {
		return stx == d.Tx()
	}
	return tx == d.lent.Tx()
}

func (d *Delivery) publishedTo(t Table, queue string) {
	d.mu.Lock()
	d.pending = append(d.pending, wakeTarget{t, queue})
	d.mu.Unlock()
}

func (d *Delivery) published() []wakeTarget {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pending
}

// ID is the row's id.
func (d *Delivery) ID() int64 { return d.row.ID }

// Payload is the row's payload. The handler may keep it.
func (d *Delivery) Payload() []byte { return d.row.Payload }

// Attempt is the delivery's attempt: 1 on the first delivery, counted by the table's
// attempt column under the form's rule; 0 when the table has no attempt column. A claim
// given back before its handler started counts none, as when Pause, Shutdown, or a Cancel
// of a row waiting for a worker gives it back.
func (d *Delivery) Attempt() int { return d.row.Attempt }

// Table is the queue table's name.
func (d *Delivery) Table() string { return d.table }

// Broker is the broker whose subscription delivered the row, as Settlement.Broker names
// it too. It is nil for a Delivery made outside a subscription.
func (d *Delivery) Broker() *Broker { return d.broker }

// Queue is the subscription's queue: its group, in a table with groups.
func (d *Delivery) Queue() string { return d.queue }

// Key is the row's advisory key, in the advisory form.
func (d *Delivery) Key() string { return d.row.Key }

// Headers returns the row's headers column, a JSON object of strings; nil when the table
// has none. The map is decoded once per delivery: every call returns the same map.
//
// A malformed column is read as far as it can be. A value that is not a string reads as
// its JSON text: {"n":1} as n="1", a nested object as its compact JSON. A column that is
// not a JSON object reads as nil. rowactor logs a malformed column once per delivery, as
// the delivery starts, with a warning naming the table, queue and id.
func (d *Delivery) Headers() map[string]string {
	d.headersOnce.Do(func() {
		d.headers, _ = headers.Decode(d.row.Headers) // logged by the runtime as the delivery started
	})
	return d.headers
}

// Header returns one header's value.
func (d *Delivery) Header(name string) string { return d.Headers()[name] }

// Cancelled returns the cause Broker.Cancel gave this delivery's row: an error wrapping
// ErrCancelled that names the reason. It returns nil while the row was not cancelled, and
// is safe to call from any goroutine. A cancelled row ends as cancelled whatever outcome
// the handler returns for it, so a handler may stop working on it.
//
// In a Subscribe handler it is what context.Cause of the handler's context tells once a
// Cancel ended it. In a SubscribeBatch handler it is the only way to tell: the batch's
// rows share one context, which is cancelled only once every row of the batch is.
func (d *Delivery) Cancelled() error {
	if d.batchCancelled != nil {
		return d.batchCancelled(d.index)
	}
	if d.deadline == nil {
		return nil
	}
	if cause := context.Cause(d.deadline); errors.Is(cause, ErrCancelled) {
		return cause
	}
	return nil
}
