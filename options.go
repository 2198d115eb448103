package rowactor

import (
	"fmt"
	"github.com/rowactor/rowactor/dialects"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Option configures a Broker.
type Option func(*brokerConfig)

type brokerConfig struct {
	log       *slog.Logger
	system    *actor.ActorSystem
	onSettled func(Settlement)
	now       func() time.Time
	clock     Clock
	clockErr  error // WithClock(nil)
	pollOnly  bool
	tracers   trace.TracerProvider
	meters    metric.MeterProvider
}

// WithTracerProvider makes spans through tp: a producer span per publish, whose context
// rides in the headers column, and a consumer span per delivery with its settlement as a
// child. Defaults to the otel global provider; rowactor never sets a global.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *brokerConfig) { c.tracers = tp }
}

// WithMeterProvider records metrics through mp: deliveries by outcome, handler and claim
// durations, rows per claim, rows in work, time from publish to claim, lease extensions and
// leases lost, dead letters, deliveries abandoned past their deadline (Timeout), restarts.
// Defaults to the otel global provider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *brokerConfig) { c.meters = mp }
}

// WithLogger sends rowactor's logs to l. Without it rowactor logs warnings and errors
// through slog.Default() and nothing below; Proto.Actor's own INFO chatter is always
// demoted to DEBUG.
func WithLogger(l *slog.Logger) Option { return func(c *brokerConfig) { c.log = l } }

// WithActorSystem runs rowactor's actors in a service's own Proto.Actor system. rowactor
// stops its own actors at Shutdown and leaves the system running. Defaults to a system of
// rowactor's own.
func WithActorSystem(sys *actor.ActorSystem) Option { return func(c *brokerConfig) { c.system = sys } }

// WithOnSettled registers a hook told what became of every delivery: its outcome, the
// statement that ran, and the error (ErrLeaseLost, ErrClosed, a database error) if it did
// not take effect. It is called from delivery actors, concurrently, and must not block.
func WithOnSettled(f func(Settlement)) Option { return func(c *brokerConfig) { c.onSettled = f } }

// WithPollOnly turns off waking by the database's notifications (PostgreSQL LISTEN/NOTIFY),
// which hold one connection for the broker's life; subscriptions then find rows published
// by other processes at their next poll. Use it behind a pooler in transaction mode, where
// LISTEN does not work. Publishes from this process still wake its subscriptions at once.
func WithPollOnly() Option { return func(c *brokerConfig) { c.pollOnly = true } }

// SubscribeOption configures one subscription.
type SubscribeOption func(*subscribeConfig)

type subscribeConfig struct {
	workers         int
	lease           time.Duration
	leaseSet        bool
	poll            time.Duration
	maxAttempts     int
	deadLetterGroup string
	deadLetterTable string
	transactional   bool
	prefetch        int
	prefetchSet     bool
	keyOf           func(*Delivery) string
	keyWorkers      bool
	events          map[string]string
	eventErr        error
	retryPolicy     func(attempt int, err error) time.Duration
	timeout         time.Duration
}

func defaultSubscribeConfig() subscribeConfig {
	return subscribeConfig{workers: 1, lease: 30 * time.Second, poll: time.Second}
}

// Workers sets how many deliveries the subscription keeps in work at once. Change it
// while running with Subscription.SetWorkers. Defaults to 1.
func Workers(n int) SubscribeOption { return func(c *subscribeConfig) { c.workers = n } }

// Prefetch fixes how many claimed rows a lease-form subscription may hold beyond its
// Workers, waiting for a worker. Without it a lease-form subscription sizes that room
// itself: enough rows to keep its workers busy through one claim's round trip (measured:
// the claim's latency times the rate its workers finish rows), no more, so fast handlers
// get rows claimed many at a time while slow handlers hold about Workers plus one. Rows
// that wait sit leased in this process (their leases renewed) where no other consumer can
// take them; Shutdown gives them back. Prefetch(0) claims only for free workers;
// Prefetch(n) lets up to n wait whatever the measurements say. The lease form only (a row
// lock or advisory row waiting would hold a connection).
func Prefetch(n int) SubscribeOption {
	return func(c *subscribeConfig) { c.prefetch, c.prefetchSet = n, true }
}

// WorkersByKey runs n workers where rows of one partition key are handled one at a time,
// in claim order, and rows of different keys side by side. key names a delivery's
// partition key, from its payload or headers (d.Header("account"), say); it must be
// quick and must not keep d. A row waits while an earlier row of its key is in work, and
// rows of other keys claimed after it go first; up to n rows may wait so. The
// subscription keeps one claim in flight, to keep claim order. A retried row goes back to
// the queue, and later rows of its key may run before it comes back (after a RetryAfter,
// every row of its key due earlier does); the order holds only within this subscription.
// For strict order across retries and processes, declare the table's groups FIFO
// instead: a FIFO group's head is its unfinished row with the lowest id, Retry and
// RetryAfter keep it the head, and while it waits for its retry_after its whole group
// waits.
func WorkersByKey(n int, key func(d *Delivery) string) SubscribeOption {
	return func(c *subscribeConfig) { c.workers, c.keyOf, c.keyWorkers = n, key, true }
}

// Lease sets the lease length of a lease-form table, rounded up to whole seconds, at
// least one. The renewer extends every lease in work each half lease, so a handler may
// run longer than its lease. Defaults to 30 s.
func Lease(d time.Duration) SubscribeOption {
	return func(c *subscribeConfig) { c.lease, c.leaseSet = d, true }
}

// PollInterval sets how often an idle subscription looks for due rows; a publish from
// this process (or, on PostgreSQL, from any process) wakes it at once. The idle
// subscriptions of one table with one interval are polled together, by one statement that
// asks which of their queues have a due row. Defaults to 1 s.
func PollInterval(d time.Duration) SubscribeOption { return func(c *subscribeConfig) { c.poll = d } }

// MaxAttempts caps deliveries: a Fail, Retry or RetryAfter of a row whose attempt reached
// n moves it to its dead letter instead (MaxAttempts(1) moves on the first failure); a
// Snooze never does. It needs the table's attempt column and a dead letter
// (DeadLetterGroup or DeadLetterTable). Defaults to DefaultMaxAttempts (25) when the
// subscription has a dead letter; without one, rows are retried for ever.
func MaxAttempts(n int) SubscribeOption { return func(c *subscribeConfig) { c.maxAttempts = n } }

// DeadLetterGroup moves spent rows to group g of the same table (an UPDATE of the group
// column). It needs the table's attempt column; without MaxAttempts a row's attempts are
// spent at DefaultMaxAttempts.
func DeadLetterGroup(g string) SubscribeOption {
	return func(c *subscribeConfig) { c.deadLetterGroup = g }
}

// DeadLetterTable moves spent rows into table t (a copy and a delete in one transaction,
// or one statement where the database can). The move keeps the whole row: every column
// the two tables share by name (without case on MySQL and SQLite), as their catalogs list
// them at Subscribe, the service's own columns included; columns t computes are left to
// it. t needs every described column; Subscribe refuses a t that lacks a column the queue
// table has as NOT NULL without a default (its value would be lost), or that has such a
// column the queue table lacks (every move would fail). A move the database refuses
// anyway (a constraint, a trigger) leaves the row in the queue table, set aside at its
// next claim rather than delivered again, and logs an error. It needs the table's attempt
// column; without MaxAttempts a row's attempts are spent at DefaultMaxAttempts.
func DeadLetterTable(t string) SubscribeOption {
	return func(c *subscribeConfig) { c.deadLetterTable = t }
}

// Transactional lends each delivery a transaction (Delivery.Tx) for the handler's own
// queries. Ack commits the handler's writes together with the settlement, in one commit;
// any other outcome, and a panic, rolls them back first and then settles as outside
// transactional mode. Rows the handler publishes through the transaction (PublishTx with
// d.Tx()) commit with the Ack and wake this process's subscribers after the commit.
//
// Row lock form: the claim transaction is lent, with a savepoint right after the claim.
// Lease form: a transaction of its own per delivery; Ack takes effect only while the lease
// holds, and a lost lease rolls everything back (ErrLeaseLost). Advisory form: a
// transaction on the connection holding the key, ended before the key is unlocked. Every
// transactional delivery holds a pool connection while its handler runs.
func Transactional() SubscribeOption { return func(c *subscribeConfig) { c.transactional = true } }

// OnEvent gives the subscription an event of the service's own: sql runs in place of a
// built-in settlement when name is one ("ack", "drop", "retry", "retry_after",
// "dead_letter", and "extend" for the lease extension), or when a handler returns
// Custom(name) for any other name. A Fail runs the event of the step it plans
// ("retry_after", "retry" or "dead_letter"); a Snooze has no event and always runs its
// built-in statement.
//
// The SQL is the database's own dialect, with its values named in braces: {id} (which
// every event must name), {now}, {group}, {attempt}, {error} (the text given with Fail or
// Outcome.WithError), {at} (retry_after), {dead_letter} (the dead-letter group),
// {arg1}, {arg2}, ... (Custom's values), and for extend {held} and {until}. Write a quote
// inside a string literal doubled (”), not escaped with a backslash.
//
// It runs where the form runs a settlement: in the claim transaction (row lock), on the
// connection holding the key (advisory), or, in the lease form, in a transaction that
// first locks the row and confirms the delivery's lease (a delivery whose lease was lost
// runs nothing and reports ErrLeaseLost). An event that ends the row must take it out of
// the claimable rows (delete it, move it to another group, set processed_at), and a lease
// form event that returns it should clear locked_until, or the row waits for its lease to
// run out. An extend event must write {until} only where the lease is still {held}: its
// row count says whether the lease was kept.
func OnEvent(name, sql string) SubscribeOption {
	return func(c *subscribeConfig) {
		if c.events == nil {
			c.events = map[string]string{}
		}
		if _, dup := c.events[name]; dup && c.eventErr == nil {
			c.eventErr = &ConfigError{Option: fmt.Sprintf("OnEvent(%q)", name), Reason: "the event is given twice",
				Fix: "give each event once"}
		}
		c.events[name] = sql
	}
}

// check refuses an option set that cannot work for table t.
func (c *subscribeConfig) check(t Table, queue string) error {
	bad := func(option, reason, fix string) error {
		return &ConfigError{Table: t.Name, Option: option, Reason: reason, Fix: fix}
	}
	if c.eventErr != nil {
		err := *c.eventErr.(*ConfigError)
		err.Table = t.Name
		return &err
	}
	for name := range c.events {
		if err := dialects.CheckEventName(t.Name, name); err != nil {
			return err
		}
	}
	switch {
	case c.workers < 1:
		return bad("Workers", fmt.Sprintf("Workers(%d) leaves nothing to do the work", c.workers), "use Workers(1) or more")
	case c.keyWorkers && c.keyOf == nil:
		return bad("WorkersByKey", "WorkersByKey needs a function that names each delivery's partition key", "pass a key function, e.g. func(d *rowactor.Delivery) string { return d.Header(\"account\") }")
	case t.FIFO && c.prefetch > 0:
		return bad("Prefetch", "a FIFO group is handled one row at a time, so no row can wait ahead of a worker", "drop Prefetch")
	case t.FIFO && c.keyWorkers:
		return bad("WorkersByKey", "a FIFO group is handled one row at a time in order already", "drop WorkersByKey, or FIFO")
	case c.timeout < 0:
		return bad("Timeout", fmt.Sprintf("Timeout(%v) is negative", c.timeout), "use a positive duration, or Timeout(0) for no deadline")
	case c.prefetch < 0:
		return bad("Prefetch", fmt.Sprintf("Prefetch(%d) is negative", c.prefetch), "use Prefetch(0) or more")
	case c.prefetch > 0 && t.Form() != FormLease:
		return bad("Prefetch", "Prefetch holds claimed rows waiting for a worker, and only a lease row costs nothing to hold (a row lock or advisory row holds a connection)",
			"drop Prefetch, or use the lease form")
	case c.poll <= 0:
		return bad("PollInterval", fmt.Sprintf("PollInterval(%v) is not a positive interval", c.poll), "use a positive duration such as time.Second")
	case c.leaseSet && t.Form() != FormLease:
		return bad("Lease", "Lease applies to the lease form, and the table has no LockedUntil column", "drop the Lease option or name the table's LockedUntil column")
	case c.lease <= 0:
		return bad("Lease", fmt.Sprintf("Lease(%v) is not a positive duration", c.lease), "use a lease of one second or more")
	case t.Group != "" && queue == "":
		return bad("queue", "the table has groups, so a subscription names the group it reads", "pass the group as the queue name")
	case c.maxAttempts < 0:
		return bad("MaxAttempts", fmt.Sprintf("MaxAttempts(%d) is negative", c.maxAttempts), "use MaxAttempts(1) or more")
	case c.deadLetterGroup != "" && c.deadLetterTable != "":
		return bad("DeadLetterGroup", "a subscription has one dead letter: a group or a table", "drop DeadLetterGroup or DeadLetterTable")
	case c.maxAttempts > 0 && !c.hasDeadLetter():
		return bad("MaxAttempts", "MaxAttempts without a dead letter leaves nowhere to move spent rows", "add DeadLetterGroup(...) or DeadLetterTable(...)")
	case c.maxAttempts > 0 && t.Attempt == "":
		return bad("MaxAttempts", "MaxAttempts counts deliveries in the attempt column, and the table names none", "set Table.Attempt to an INTEGER column defaulting to 1")
	case c.hasDeadLetter() && t.Attempt == "":
		return bad(c.deadLetterOption(), fmt.Sprintf("a dead letter takes the rows whose attempts are spent (MaxAttempts, by default %d), counted in the attempt column, and the table names none", DefaultMaxAttempts),
			"set Table.Attempt to an INTEGER column defaulting to 1")
	case c.deadLetterGroup != "" && t.Group == "":
		return bad("DeadLetterGroup", "a dead-letter group needs the table's group column, and the table names none", "set Table.Group, or use DeadLetterTable")
	case c.deadLetterGroup != "" && c.deadLetterGroup == queue:
		return bad("DeadLetterGroup", "the dead-letter group is the queue itself, so spent rows would come straight back", "name another group")
	case c.deadLetterTable == t.Name:
		return bad("DeadLetterTable", "the dead-letter table is the queue table itself", "name another table")
	case t.DatabaseClock && t.Form() != FormLease:
		// Refused rather than ignored: every dialect still reads "now" from the host.
		return bad("Table.DatabaseClock", "the database clock is not implemented yet; claims and settlements use the host's clock",
			"drop DatabaseClock and keep the hosts' clocks in step")
	}
	return nil
}

func (c *subscribeConfig) hasDeadLetter() bool {
	return c.deadLetterGroup != "" || c.deadLetterTable != ""
}

func (c *subscribeConfig) deadLetterOption() string {
	if c.deadLetterGroup != "" {
		return "DeadLetterGroup"
	}
	return "DeadLetterTable"
}

// attemptCap is where a row's attempts are spent: MaxAttempts, DefaultMaxAttempts for a
// subscription with a dead letter and no MaxAttempts, 0 (never) without a dead letter.
func (c *subscribeConfig) attemptCap() int {
	if c.maxAttempts == 0 && c.hasDeadLetter() {
		return DefaultMaxAttempts
	}
	return c.maxAttempts
}

// leaseLength rounds the lease up to whole seconds, at least one.
func (c *subscribeConfig) leaseLength() time.Duration {
	l := c.lease.Round(0)
	if r := l.Truncate(time.Second); r != l {
		l = r + time.Second
	}
	return max(l, time.Second)
}

// autoPrefetch says whether the subscription sizes its waiting room itself: the lease
// form without Prefetch (a FIFO group's head is handled alone, so nothing waits).
func (c *subscribeConfig) autoPrefetch(t Table) bool {
	return !c.prefetchSet && t.Form() == FormLease && !t.FIFO
}
