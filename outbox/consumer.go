package outbox

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rowactor/rowactor"
)

// markTimeout bounds the consumer's processed stamp.
const markTimeout = 10 * time.Second

// maxPending caps the transactional stamps waiting for Settled: past it, Settled is taken
// to be missing (see Handler), and later stamps are left to the next relay start.
const maxPending = 10000

// RecordID returns the outbox record id a delivery carries in its IDHeader; false when it
// carries none (the row did not come from an outbox).
func RecordID(d *rowactor.Delivery) (int64, bool) {
	v := d.Header(IDHeader)
	if v == "" {
		return 0, false
	}
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, false
	}
	return id, true
}

// Consumer is an outbox's consumer side on one consumer broker: its Handler settles the
// outbox's records by a handler's outcome, and its Settled, the broker's WithOnSettled
// hook, stamps the records of transactional deliveries once their settlement committed.
//
// A transactional delivery's stamp waits for its settlement, which is matched by broker,
// queue table and row id (rows of two databases can share a table name and an id). A
// Consumer per consumer broker keeps each broker's waiting stamps apart, and a settlement
// reported to another Consumer never touches them:
//
//	c := ob.Consumer()
//	b, err := rowactor.New(shippingDialect, rowactor.WithOnSettled(c.Settled))
//	sub, err := b.Subscribe(ctx, jobs, "order.created", c.Handler(handle), rowactor.Transactional())
//
// Outbox.Handler and Outbox.Settled are the outbox's own Consumer; several brokers may
// share them too. It is safe for concurrent use.
type Consumer struct {
	o *Outbox

	// Transactional deliveries whose stamp awaits their settlement, by queue table and
	// row: unique within the one broker's database.
	mu       sync.Mutex
	pending  map[pendingKey]int64
	hooked   atomic.Bool // Settled was called at least once
	warnHook sync.Once
}

// Consumer returns a new consumer side of the outbox, for one consumer broker: give that
// broker its Settled (rowactor.WithOnSettled) and its subscriptions its Handler. Every
// consumer broker needs its own; see Consumer.
func (o *Outbox) Consumer() *Consumer {
	return &Consumer{o: o, pending: make(map[pendingKey]int64)}
}

// Handler wraps h with the outbox's own Consumer's Handler, whose stamps Outbox.Settled
// reports: give every consumer broker using it Outbox.Settled as its WithOnSettled hook.
// Brokers on several databases may share the pair: stamps are matched by broker, table
// and row id.
func (o *Outbox) Handler(h rowactor.Handler) rowactor.Handler { return o.own.Handler(h) }

// Settled is the outbox's own Consumer's Settled: the WithOnSettled hook of the consumer
// brokers whose subscriptions use Outbox.Handler.
func (o *Outbox) Settled(s rowactor.Settlement) { o.own.Settled(s) }

// Handler wraps h so that each delivery of a record of this outbox settles the record by
// h's outcome:
//
//   - before h runs, the record is read: one already processed is acked without running h
//     (a copy sent again); when it cannot be read, the delivery is retried after
//     FetchRetry without running h;
//   - Ack and Drop stamp the record processed (in the outbox's database, through its
//     pool) and keep h's outcome;
//   - Retry, RetryAfter, a dead-letter move and an unsettled delivery (a panic) leave it
//     unprocessed: the queue retries the row as usual, and the next relay start sends the
//     record again.
//
// The stamp comes only once h's effect has committed, so that a record shown processed is
// never skipped for an effect that rolled back. Outside transactional mode h commits its
// own writes before it returns, and the stamp follows at once. In a Transactional
// subscription h's writes commit with the queue's settlement, after h returns: the stamp
// then waits for Settled, which the broker must be given with
// rowactor.WithOnSettled(c.Settled) (or called from the service's own hook). Without it
// transactional deliveries are never stamped (a warning says so), and their records are
// sent again at every relay start.
//
// A failed stamp is logged as a warning and h's outcome stands: the record stays
// unprocessed and is sent again at the next relay start, which a Dedupe in h makes
// harmless. The stamp is a commit of its own, in the outbox's database: a crash right
// before it has the same effect.
//
// Deliveries without IDHeader, of another outbox (TableHeader), or of a record that does
// not exist (purged, or sent from elsewhere) run h unchanged and settle nothing.
//
// Costs: one SELECT before h and one UPDATE after an Ack or Drop, each on a connection of
// the outbox's pool taken for the statement. On SQLite, keep the outbox in another file
// than a transactional consumer's queue: a stamp through the pool would wait for the
// write lock of the delivery's own transaction.
func (c *Consumer) Handler(h rowactor.Handler) rowactor.Handler {
	o := c.o
	return func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		id, ok := RecordID(d)
		if !ok {
			return h(ctx, d)
		}
		if table := d.Header(TableHeader); table != "" && table != o.t.Name {
			return h(ctx, d)
		}
		st, err := o.store.State(ctx, id)
		if err != nil {
			o.cfg.log.Warn("rowactor/outbox: cannot read the record; the delivery is retried without its handler",
				slog.String("outbox", o.t.Name), slog.Int64("record", id), slog.Any("error", err))
			return rowactor.RetryAfter(o.cfg.fetchRetry)
		}
		if !st.Exists {
			o.cfg.log.Warn("rowactor/outbox: the delivery names a record the outbox does not hold; its handler runs and nothing is stamped",
				slog.String("outbox", o.t.Name), slog.Int64("record", id))
			return h(ctx, d)
		}
		if !st.ProcessedAt.IsZero() {
			return rowactor.Ack()
		}
		out := h(ctx, d)
		// By name: Outcome is not comparable, and only these two end the record.
		if v := out.String(); v != "ack" && v != "drop" {
			return out
		}
		if d.Tx() != nil {
			c.await(d.Broker(), d.Table(), d.ID(), id)
			return out
		}
		// ctx may have ended with the handler (Shutdown gave up waiting); the stamp is
		// still worth making, within a bound of its own.
		o.stamp(context.WithoutCancel(ctx), id)
		return out
	}
}

// pendingKey names a queue row whose transactional delivery awaits its settlement: its
// broker, table and id (rows of two databases can share a table name and an id).
type pendingKey struct {
	broker *rowactor.Broker
	table  string
	row    int64
}

// await keeps a transactional delivery's record until Settled reports its settlement.
func (c *Consumer) await(broker *rowactor.Broker, table string, row, record int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) >= maxPending {
		if !c.hooked.Load() {
			c.warnHook.Do(func() {
				c.o.cfg.log.Warn("rowactor/outbox: transactional deliveries wait for Settled, which is never called: "+
					"their records stay unprocessed; give the broker the Settled of the Consumer whose Handler its subscriptions use "+
					"(rowactor.WithOnSettled(c.Settled), or ob.Settled with ob.Handler)",
					slog.String("outbox", c.o.t.Name))
			})
		}
		return
	}
	c.pending[pendingKey{broker, table, row}] = record
}

// Settled stamps the record of a transactional delivery of this Consumer's Handler
// processed once its settlement committed the handler's effect (an Ack or Drop settled
// without error); any other settlement leaves the record unprocessed. Give it to the
// consumer broker with rowactor.WithOnSettled(c.Settled), or call it from the service's
// own hook with that broker's settlements only. It runs one UPDATE on the outbox's pool,
// on the delivery's actor, for the deliveries that await it, and returns at once for
// every other settlement.
func (c *Consumer) Settled(s rowactor.Settlement) {
	c.hooked.Store(true)
	c.mu.Lock()
	key := pendingKey{s.Broker, s.Table, s.ID}
	record, ok := c.pending[key]
	if ok {
		delete(c.pending, key)
	}
	c.mu.Unlock()
	if !ok || s.Err != nil || s.Step != "ack" {
		return
	}
	c.o.stamp(context.Background(), record)
}

func (o *Outbox) stamp(ctx context.Context, id int64) {
	ctx, cancel := context.WithTimeout(ctx, markTimeout)
	defer cancel()
	if _, err := o.store.MarkProcessed(ctx, id, o.cfg.now()); err != nil {
		o.cfg.log.Warn("rowactor/outbox: cannot stamp the record processed; it is sent again at the next relay start",
			slog.String("outbox", o.t.Name), slog.Int64("record", id), slog.Any("error", err))
	}
}
