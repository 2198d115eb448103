package rowactor

import (
	"errors"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/settler"
)

var (
	// ErrLeaseLost reports a lease-form settlement that found another token on its row:
	// the lease ran out and a later claim owns the row. The settlement changed nothing.
	ErrLeaseLost = settler.ErrLeaseLost

	// ErrClosed reports a call on a broker that was shut down, and a settlement that came
	// after its row was released by Shutdown. It is also the cause a handler's context
	// reads when Shutdown cuts the handler off: errors.Is(context.Cause(ctx), ErrClosed)
	// tells a shutdown from a Cancel (ErrCancelled) or a deadline.
	ErrClosed = settler.ErrClosed

	// ErrUnknownEvent reports a handler's Event outcome naming an event the subscription
	// was not given with OnEvent; the row was released unsettled.
	ErrUnknownEvent = settler.ErrUnknownEvent

	// ErrAbandoned reports a delivery given up on. Its handler ran past its deadline and
	// the grace after it without returning, so rowactor released its row by the form's
	// rule and freed its worker. Whatever the handler returns later changes nothing. The
	// WithOnSettled hook is told at the abandonment, with an error that wraps
	// ErrAbandoned and context.DeadlineExceeded. See Timeout.
	ErrAbandoned = settler.ErrAbandoned

	// ErrDuplicate reports a publish with Unique whose key a row holds already: nothing
	// was inserted, and Publish and PublishTx return that row's id beside an error
	// matching ErrDuplicate. Treat it as "already queued" when that is what you want:
	//
	//	id, err := b.Publish(ctx, jobs, "reports", payload, rowactor.Unique(key))
	//	if err != nil && !errors.Is(err, rowactor.ErrDuplicate) { ... }
	ErrDuplicate = dialects.ErrDuplicate

	// ErrConfig matches every *ConfigError.
	ErrConfig = dialects.ErrConfig

	// ErrNotFound reports a row id the table does not hold, to Inspect, RetryNow or
	// Cancel.
	ErrNotFound = dialects.ErrRowNotFound

	// ErrInWork reports a row a delivery holds, which RetryNow leaves to it. Cancel leaves
	// it too, unless the delivery is the calling broker's own, which Cancel cancels.
	ErrInWork = dialects.ErrRowInWork

	// ErrFinished reports a processed row, which RetryNow and Cancel leave as it is.
	ErrFinished = dialects.ErrRowFinished

	// ErrCancelled is wrapped by the cause of a handler's context that Broker.Cancel
	// cancelled, as context.Cause reads it. The cause names the table, the row and the
	// reason. The delivery's row is then settled as cancelled whatever the handler
	// returns. A row of a batch is cancelled alone: Delivery.Cancelled returns the cause,
	// and the batch's context ends with it only once every row of the batch is cancelled.
	ErrCancelled = errors.New("rowactor: the row was cancelled")

	// ErrShutdownInHandler reports a Shutdown called from a handler, or from a hook
	// rowactor runs such as WithOnSettled. It cannot wait for the delivery that called
	// it, so it returns at once, and the broker shuts down in the background once that
	// handler returns. A later Shutdown waits for that one to finish.
	ErrShutdownInHandler = errors.New("rowactor: Shutdown was called from a handler, or a hook rowactor runs (WithOnSettled), and cannot wait for the delivery that called it; " +
		"the broker shuts down once that call returns (call Shutdown outside them, or again from outside, to wait for it)")

	// ErrNotDrained reports a Shutdown whose context ended while rows were still in work,
	// or whose drain a second Shutdown ended. The rows were released unsettled, as its
	// ShutdownReport counts. The error also matches what ended the context, such as
	// context.DeadlineExceeded or context.Canceled.
	ErrNotDrained = errors.New("rowactor: shutdown did not drain")

	// ErrAlreadySubscribed reports a second subscription to the same table and queue on
	// one broker; scale one subscription with Workers instead.
	ErrAlreadySubscribed = errors.New("rowactor: already subscribed")

	// ErrDialectNotImported reports an Open of a database whose dialect package the
	// program does not import. Each dialect registers its URLs when imported, so that a
	// program links only the drivers it uses. The error names the import to add, such as
	// import _ "github.com/rowactor/rowactor/dialects/postgres".
	ErrDialectNotImported = errors.New("rowactor: the database's dialect is not imported")
)

// ConfigError is a table description or option that cannot work. It names the table, the
// column or option at fault, and the fix, and is returned before anything is claimed.
type ConfigError = dialects.ConfigError
