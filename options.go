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
// child. It defaults to the otel global provider; rowactor never sets a global.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *brokerConfig) { c.tracers = tp }
}

// WithMeterProvider records metrics through mp. It defaults to the otel global
// provider. The metrics count:
//   - deliveries by outcome, and dead letters;
//   - handler and claim durations, rows per claim, rows in work;
//   - the time from publish to claim;
//   - lease extensions and leases lost;
//   - deliveries abandoned past their deadline, set by Timeout;
//   - restarts.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *brokerConfig) { c.meters = mp }
}

// WithLogger sends rowactor's logs to l. Without it, rowactor logs warnings and errors
// through slog.Default, and nothing below. Proto.Actor's own INFO chatter is always
// demoted to DEBUG. A handler that panics loses the record it panicked on, and nothing
// else: the panic is recovered where rowactor logs.
func WithLogger(l *slog.Logger) Option { return func(c *brokerConfig) { c.log = l } }

// WithActorSystem runs rowactor's actors in a service's own Proto.Actor system. rowactor
// stops its own actors at Shutdown and leaves the system running. Defaults to a system of
// rowactor's own.
func WithActorSystem(sys *actor.ActorSystem) Option { return func(c *brokerConfig) { c.system = sys } }

// WithOnSettled registers a hook told what became of every delivery: its outcome, the
// statement that ran, and the error if it did not take effect, such as ErrLeaseLost,
// ErrClosed or a database error. It is called from delivery actors, concurrently, and
// must not block.
//
// Calls follow no order, even for one row: a retry's call may come after the next
// delivery's. Settlement.Attempt orders the deliveries of a row.
func WithOnSettled(f func(Settlement)) Option { return func(c *brokerConfig) { c.onSettled = f } }

// WithPollOnly turns off waking by the database's notifications, PostgreSQL's
// LISTEN/NOTIFY, which hold one connection for the broker's life. Subscriptions then find
// rows published by other processes at their next poll; publishes from this process still
// wake them at once. Use it behind a pooler in transaction mode, where LISTEN does not
// work.
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
// Workers, waiting for a worker. Prefetch(0) claims only for free workers; Prefetch(n) lets
// up to n rows wait. Only Prefetch(0) applies to the other forms, since a waiting row lock
// holds a connection, and so does an advisory row on PostgreSQL and MySQL.
//
// Without it, a lease-form subscription, and an advisory one on SQLite outside
// transactional mode (whose keys cost no connection), sizes that room itself: enough
// rows to keep its workers busy through one claim's round trip, and at least 2 ms of
// their work, measured as the claim's latency times the rate its workers finish rows.
// Fast handlers then get rows claimed many at a time, while slow handlers hold about
// Workers plus one. See docs/operations.md, "Throughput", for the rule.
//
// Rows that wait sit leased in this process, their leases renewed (an advisory row holds
// its key), where no other consumer can take them. Shutdown and Pause give them back
// with the attempt they had before their claim, since their handlers never started. So
// does the measured room when its workers all stay busy: once no worker has freed for the
// longest of PollInterval, twice the measured handling time and 250 ms, the rows that
// waited that long go back to the table (reported to WithOnSettled as a release without
// error) for another consumer's free worker, and nothing is claimed ahead until a worker
// frees. Prefetch(n) keeps its rows until a worker takes them.
func Prefetch(n int) SubscribeOption {
	return func(c *subscribeConfig) { c.prefetch, c.prefetchSet = n, true }
}

// WorkersByKey runs n workers where rows of one partition key are handled one at a time,
// in claim order, and rows of different keys side by side. key names a delivery's
// partition key from its payload or headers, such as d.Header("account"). It must be
// quick and must not keep d.
//
// A row waits while an earlier row of its key is in work, and rows of other keys claimed
// after it go first; up to n rows may wait so. The subscription keeps one claim in flight,
// to keep claim order.
//
// The order holds only within this subscription, and not across retries: a retried row
// goes back to the queue, and later rows of its key may run before it comes back. For
// strict order across retries and processes, declare the table's groups FIFO instead. See
// docs/ordering.md.
func WorkersByKey(n int, key func(d *Delivery) string) SubscribeOption {
	return func(c *subscribeConfig) { c.workers, c.keyOf, c.keyWorkers = n, key, true }
}

// Lease sets the lease length of a lease-form table, rounded up to whole seconds, at
// least one. The renewer extends every lease in work each half lease, so a handler may
// run longer than its lease. It defaults to 30 s.
func Lease(d time.Duration) SubscribeOption {
	return func(c *subscribeConfig) { c.lease, c.leaseSet = d, true }
}

// PollInterval sets how often an idle subscription looks for due rows. It defaults to
// 1 s. A publish from this process wakes the subscription at once; on PostgreSQL, so does
// a publish from any process. The idle subscriptions of one table with one interval are
// polled together, by one statement that asks which of their queues have a due row.
func PollInterval(d time.Duration) SubscribeOption { return func(c *subscribeConfig) { c.poll = d } }

// MaxAttempts caps deliveries. A Fail, Retry or RetryAfter of a row whose attempt
// reached n moves it to its dead letter instead; a Snooze never does. MaxAttempts(1) moves
// a row on its first failure.
//
// It needs the table's attempt column and a dead letter, given with DeadLetterGroup or
// DeadLetterTable. With a dead letter it defaults to DefaultMaxAttempts, 25; without one,
// rows are retried for ever.
func MaxAttempts(n int) SubscribeOption { return func(c *subscribeConfig) { c.maxAttempts = n } }

// DeadLetterGroup moves spent rows to group g of the same table, by an UPDATE of the
// group column. It needs the table's attempt column; without MaxAttempts, a row's
// attempts are spent at DefaultMaxAttempts.
func DeadLetterGroup(g string) SubscribeOption {
	return func(c *subscribeConfig) { c.deadLetterGroup = g }
}

// DeadLetterTable moves spent rows into table t: a copy and a delete in one
// transaction, or one statement where the database can. It needs the table's attempt
// column; without MaxAttempts, a row's attempts are spent at DefaultMaxAttempts.
//
// The move keeps the whole row: every column the two tables share by name, the service's
// own columns included, as their catalogs list them at Subscribe. Names match without
// case on MySQL and SQLite. Columns t computes are left to it.
//
// t needs every described column. Subscribe refuses a t that lacks a NOT NULL column
// without a default that the queue table has, since its value would be lost. It refuses a
// t that has such a column the queue table lacks, since every move would fail. A move the
// database refuses anyway, by a constraint or a trigger, leaves the row in the queue
// table and logs an error; the row is set aside at its next claim, not delivered again.
func DeadLetterTable(t string) SubscribeOption {
	return func(c *subscribeConfig) { c.deadLetterTable = t }
}

// Transactional lends each delivery a transaction, Delivery.Tx, for the handler's own
// queries. Ack commits the handler's writes together with the settlement, in one commit.
// Any other outcome, and a panic, rolls them back first and then settles as outside
// transactional mode. Rows the handler publishes with PublishTx through d.Tx commit with
// the Ack, and wake this process's subscribers after the commit.
//
// Every transactional delivery holds a pool connection while its handler runs. The
// transaction depends on the form:
//   - row lock: the claim transaction, with a savepoint right after the claim;
//   - lease: a transaction of its own per delivery. Ack takes effect only while the lease
//     holds, and a lost lease rolls everything back with ErrLeaseLost;
//   - advisory: a transaction on the connection holding the key, ended before the key is
//     unlocked.
//
// See docs/transactional.md.
func Transactional() SubscribeOption { return func(c *subscribeConfig) { c.transactional = true } }

// OnEvent gives the subscription an event of the service's own: sql runs in place of a
// built-in settlement when name is one of "ack", "drop", "retry", "retry_after",
// "dead_letter" or "extend", or when a handler returns Custom with any other name.
//
// The SQL is the database's own dialect, with its values named in braces: {id}, which
// every event must name, {now}, {group}, {attempt}, {error}, {at}, {dead_letter},
// {arg1}, {arg2} and so on, and for extend {held} and {until}. Write a quote inside a
// string literal doubled, not escaped with a backslash.
//
// An event that ends the row must take it out of the claimable rows. A lease-form event
// that returns it should clear locked_until, or the row waits for its lease to run out.
// See docs/forms.md, "OnEvent, rule by rule", for where each event runs and what it binds.
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

// check refuses an option set that cannot work for table t. It runs its steps in a fixed
// order, so the first problem found is the one reported.
func (c *subscribeConfig) check(t Table, queue string) error {
	if err := c.checkEvents(t); err != nil {
		return err
	}
	if err := c.checkWorkers(t); err != nil {
		return err
	}
	if err := c.checkClaiming(t); err != nil {
		return err
	}
	if t.Group != "" && queue == "" {
		return refuseOption(t, "queue", "the table has groups, so a subscription names the group it reads", "pass the group as the queue name")
	}
	if err := c.checkAttemptCap(t); err != nil {
		return err
	}
	if err := c.checkDeadLetterTarget(t, queue); err != nil {
		return err
	}
	if t.DatabaseClock && t.Form() != FormLease {
		// Refused rather than ignored: every dialect still reads "now" from the host.
		return refuseOption(t, "Table.DatabaseClock", "the database clock is not implemented yet; claims and settlements use the host's clock",
			"drop DatabaseClock and keep the hosts' clocks in step")
	}
	return nil
}

// refuseOption is the ConfigError of check and its steps: option cannot work for table t.
func refuseOption(t Table, option, reason, fix string) error {
	return &ConfigError{Table: t.Name, Option: option, Reason: reason, Fix: fix}
}

// checkEvents reports what OnEvent refused when it was given, adding the table's name,
// which was not known then. Then it refuses any event name no dialect can run.
func (c *subscribeConfig) checkEvents(t Table) error {
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
	return nil
}

// checkWorkers refuses a worker count or partitioning that cannot share out the rows,
// including what a FIFO group's one-row-at-a-time order rules out.
func (c *subscribeConfig) checkWorkers(t Table) error {
	switch {
	case c.workers < 1:
		return refuseOption(t, "Workers", fmt.Sprintf("Workers(%d) leaves nothing to do the work", c.workers), "use Workers(1) or more")
	case c.keyWorkers && c.keyOf == nil:
		return refuseOption(t, "WorkersByKey", "WorkersByKey needs a function that names each delivery's partition key", "pass a key function, e.g. func(d *rowactor.Delivery) string { return d.Header(\"account\") }")
	case t.FIFO && c.prefetch > 0:
		return refuseOption(t, "Prefetch", "a FIFO group is handled one row at a time, so no row can wait ahead of a worker", "drop Prefetch")
	case t.FIFO && c.keyWorkers:
		return refuseOption(t, "WorkersByKey", "a FIFO group is handled one row at a time in order already", "drop WorkersByKey, or FIFO")
	}
	return nil
}

// checkClaiming refuses the durations and counts that govern claiming and holding rows,
// given by Timeout, Prefetch, PollInterval and Lease, and those the table's form cannot
// use.
func (c *subscribeConfig) checkClaiming(t Table) error {
	switch {
	case c.timeout < 0:
		return refuseOption(t, "Timeout", fmt.Sprintf("Timeout(%v) is negative", c.timeout), "use a positive duration, or Timeout(0) for no deadline")
	case c.prefetch < 0:
		return refuseOption(t, "Prefetch", fmt.Sprintf("Prefetch(%d) is negative", c.prefetch), "use Prefetch(0) or more")
	case c.prefetch > 0 && t.Form() != FormLease:
		return refuseOption(t, "Prefetch", "Prefetch holds claimed rows waiting for a worker, and only a lease row costs nothing to hold on every database (a row lock holds a connection, and so does an advisory key on PostgreSQL and MySQL; on SQLite the advisory form sizes its room itself)",
			"drop Prefetch, or use the lease form")
	case c.poll <= 0:
		return refuseOption(t, "PollInterval", fmt.Sprintf("PollInterval(%v) is not a positive interval", c.poll), "use a positive duration such as time.Second")
	case c.leaseSet && t.Form() != FormLease:
		return refuseOption(t, "Lease", "Lease applies to the lease form, and the table has no LockedUntil column", "drop the Lease option or name the table's LockedUntil column")
	case c.lease <= 0:
		return refuseOption(t, "Lease", fmt.Sprintf("Lease(%v) is not a positive duration", c.lease), "use a lease of one second or more")
	}
	return nil
}

// checkAttemptCap refuses a MaxAttempts and dead letter that do not go together: a
// negative cap, two dead letters, a cap with nowhere to move spent rows, or no attempt
// column to count the attempts in.
func (c *subscribeConfig) checkAttemptCap(t Table) error {
	switch {
	case c.maxAttempts < 0:
		return refuseOption(t, "MaxAttempts", fmt.Sprintf("MaxAttempts(%d) is negative", c.maxAttempts), "use MaxAttempts(1) or more")
	case c.deadLetterGroup != "" && c.deadLetterTable != "":
		return refuseOption(t, "DeadLetterGroup", "a subscription has one dead letter: a group or a table", "drop DeadLetterGroup or DeadLetterTable")
	case c.maxAttempts > 0 && !c.hasDeadLetter():
		return refuseOption(t, "MaxAttempts", "MaxAttempts without a dead letter leaves nowhere to move spent rows", "add DeadLetterGroup(...) or DeadLetterTable(...)")
	case c.maxAttempts > 0 && t.Attempt == "":
		return refuseOption(t, "MaxAttempts", "MaxAttempts counts deliveries in the attempt column, and the table names none", "set Table.Attempt to an INTEGER column defaulting to 1")
	case c.hasDeadLetter() && t.Attempt == "":
		return refuseOption(t, c.deadLetterOption(), fmt.Sprintf("a dead letter takes the rows whose attempts are spent (MaxAttempts, by default %d), counted in the attempt column, and the table names none", DefaultMaxAttempts),
			"set Table.Attempt to an INTEGER column defaulting to 1")
	}
	return nil
}

// checkDeadLetterTarget refuses a dead letter that cannot take spent rows away: a group
// without the table's group column, or the queue or the queue table itself.
func (c *subscribeConfig) checkDeadLetterTarget(t Table, queue string) error {
	switch {
	case c.deadLetterGroup != "" && t.Group == "":
		return refuseOption(t, "DeadLetterGroup", "a dead-letter group needs the table's group column, and the table names none", "set Table.Group, or use DeadLetterTable")
	case c.deadLetterGroup != "" && c.deadLetterGroup == queue:
		return refuseOption(t, "DeadLetterGroup", "the dead-letter group is the queue itself, so spent rows would come straight back", "name another group")
	case c.deadLetterTable == t.Name:
		return refuseOption(t, "DeadLetterTable", "the dead-letter table is the queue table itself", "name another table")
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

// attemptCap is where a row's attempts are spent: MaxAttempts; DefaultMaxAttempts for a
// subscription with a dead letter and no MaxAttempts; 0, never, without a dead letter.
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

// autoPrefetch says whether the subscription sizes its waiting room itself: without
// Prefetch, where a row waiting for a worker holds nothing but its claim. A lease row
// holds nothing; an advisory row holds its key, which costs a connection on a server
// but nothing on SQLite, whose keys live in the process (Limits.SessionConnections),
// unless the row's transaction is open from its take (transactional mode). A FIFO
// group's head is handled alone, so nothing waits there.
func (c *subscribeConfig) autoPrefetch(t Table, l dialects.Limits) bool {
	if c.prefetchSet || t.FIFO {
		return false
	}
	switch t.Form() {
	case FormLease:
		return true
	case FormAdvisory:
		return !l.SessionConnections && !c.transactional
	}
	return false
}
