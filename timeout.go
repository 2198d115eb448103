package rowactor

import "time"

// Timeout bounds each handler call of the subscription to d from its start. The
// handler's context ends at the deadline with context.DeadlineExceeded. A batch's handler
// has one deadline for the whole batch.
//
// A handler that returns after its deadline has failed, whatever it returned: its row
// settles as a Fail whose error wraps context.DeadlineExceeded. In transactional mode a
// late Ack is refused and its writes roll back.
//
// A handler still running a grace past its deadline is given up on. The grace is a tenth
// of the timeout, at least one second. Its row is given back and the worker takes the
// next row, so the abandoned call and the row's next delivery can overlap. The
// WithOnSettled hook sees Step "release" with an Err wrapping ErrAbandoned.
//
// The default is 0, no deadline. A negative d is refused at Subscribe. The handler may
// move its own deadline with Delivery.SetTimeout. See docs/timeouts.md for what each
// form and database does to a handler given up on.
func Timeout(d time.Duration) SubscribeOption { return func(c *subscribeConfig) { c.timeout = d } }

// SetTimeout moves the delivery's deadline to timeout from now, with or without the
// subscription's Timeout. The handler's context reflects it at once, and the rules of
// Timeout apply to the new deadline. A timeout of 0 or less removes the deadline. In a
// batch handler it moves the batch's deadline.
//
// Call it before the deadline: once the deadline passed, the context has ended for good
// and SetTimeout changes nothing. It is safe to call from any goroutine while the handler
// runs, and does nothing after the handler returned. See docs/timeouts.md.
func (d *Delivery) SetTimeout(timeout time.Duration) {
	if d.deadline != nil {
		d.deadline.SetTimeout(timeout)
	}
}
