package rowactor

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rowactor/rowactor/actors"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/deadline"
	"github.com/rowactor/rowactor/settler"
)

// Subscription is a running subscription: one claimer keeping up to Workers deliveries
// of one table's queue in work.
type Subscription struct {
	table Table
	queue string
	q     dialects.Queue
	run   *actors.Subscription
	// paused is what the last Pause or Resume that took effect asked.
	paused atomic.Bool
}

// Table is the subscription's table.
func (s *Subscription) Table() Table { return s.table }

// Queue is the subscription's queue name: its group, in a table with groups.
func (s *Subscription) Queue() string { return s.queue }

// SetWorkers changes how many deliveries the subscription keeps in work. It takes effect
// at the next claim; deliveries already in work are kept. n must be 1 or more, as for
// Workers. A smaller n returns a *ConfigError matching ErrConfig and changes nothing. To
// stop claiming for a while, use Pause.
func (s *Subscription) SetWorkers(n int) error {
	if n < 1 {
		return &ConfigError{Table: s.table.Name, Option: "SetWorkers",
			Reason: fmt.Sprintf("SetWorkers(%d) leaves nothing to do the work; the subscription keeps its workers", n),
			Fix:    "use SetWorkers(1) or more, or Pause to stop claiming"}
	}
	s.run.SetWorkers(n)
	return nil
}

// InWork is the number of deliveries in work.
func (s *Subscription) InWork() int { return s.run.InWork() }

// Pause stops claiming. Deliveries in work go on and settle as usual. Rows claimed ahead
// of a worker, by Prefetch or WorkersByKey, go back to the queue at once, with the attempt
// they had before their claim, since their handlers never started. It returns once the
// subscription stopped claiming; a claim already in flight may still deliver its rows.
func (s *Subscription) Pause(ctx context.Context) error {
	if err := s.run.Pause(ctx); err != nil {
		return err
	}
	s.paused.Store(true)
	return nil
}

// Resume claims again after Pause.
func (s *Subscription) Resume(ctx context.Context) error {
	if err := s.run.Resume(ctx); err != nil {
		return err
	}
	s.paused.Store(false)
	return nil
}

// Paused reports whether the subscription is paused: the last Pause or Resume that
// returned nil was a Pause.
func (s *Subscription) Paused() bool { return s.paused.Load() }

// Subscribe checks the table description and options against the live table and starts
// claiming its queue. In a table with groups, queue is the group the subscription reads.
// Otherwise the subscription reads the whole table, and queue is a free-form label.
//
// A description or option that cannot work returns a *ConfigError, before any row is
// claimed. After Shutdown began it returns ErrClosed.
func (b *Broker) Subscribe(ctx context.Context, t Table, queue string, h Handler, opts ...SubscribeOption) (*Subscription, error) {
	if b.closed.Load() {
		return nil, ErrClosed
	}
	if h == nil {
		return nil, &ConfigError{Table: t.Name, Option: "handler", Reason: "the handler is nil", Fix: "pass a rowactor.Handler"}
	}
	return b.subscribe(ctx, t, queue, h, nil, 0, opts)
}

// BatchHandler handles a batch of deliveries and returns one outcome per delivery, in
// order. A panic, or a slice of another length, releases the whole batch unsettled; rows
// Broker.Cancel cancelled still end as cancelled.
//
// ctx is the batch's, shared by its deliveries. Broker.Cancel of one row leaves it
// running for the others: Delivery.Cancelled tells which rows were cancelled, and ctx is
// cancelled once all are.
type BatchHandler func(ctx context.Context, ds []*Delivery) []Outcome

// SubscribeBatch subscribes a batch handler to a row lock table. Each call gets up to
// size due rows, claimed in one transaction. Their settlements, one per row as the
// outcomes say, commit together in that transaction: one claim and one commit for size
// rows. Workers(n) runs n batches at once, each holding one connection.
//
// A failed settlement statement rolls back the whole batch, and every row returns as it
// was. Batches cannot be transactional, and the other forms keep one row per delivery.
func (b *Broker) SubscribeBatch(ctx context.Context, t Table, queue string, size int, h BatchHandler, opts ...SubscribeOption) (*Subscription, error) {
	switch {
	case b.closed.Load():
		return nil, ErrClosed
	case h == nil:
		return nil, &ConfigError{Table: t.Name, Option: "handler", Reason: "the batch handler is nil", Fix: "pass a rowactor.BatchHandler"}
	case size < 1:
		return nil, &ConfigError{Table: t.Name, Option: "SubscribeBatch size", Reason: fmt.Sprintf("a batch of %d rows holds nothing", size), Fix: "use a size of 1 or more"}
	case t.Form() != FormRowLock:
		return nil, &ConfigError{Table: t.Name, Option: "SubscribeBatch", Reason: fmt.Sprintf("batch handlers serve the row lock form, and the table is in the %s form", t.Form()),
			Fix: "use Subscribe, or a table without LockedUntil and AdvisoryKey"}
	case t.FIFO:
		return nil, &ConfigError{Table: t.Name, Option: "SubscribeBatch", Reason: "a FIFO group is handled one row at a time", Fix: "use Subscribe"}
	}
	return b.subscribe(ctx, t, queue, nil, h, size, opts)
}

func (b *Broker) subscribe(ctx context.Context, t Table, queue string, h Handler, bh BatchHandler, size int, opts []SubscribeOption) (*Subscription, error) {
	if b.closed.Load() {
		return nil, ErrClosed
	}
	if err := dialects.CheckDescription(t); err != nil {
		return nil, err
	}
	cfg := defaultSubscribeConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.check(t, queue); err != nil {
		return nil, err
	}
	if bh != nil {
		switch {
		case cfg.transactional:
			return nil, &ConfigError{Table: t.Name, Option: "Transactional", Reason: "batch handlers cannot be transactional: one transaction settles the whole batch",
				Fix: "drop Transactional, or use Subscribe"}
		case cfg.keyWorkers:
			return nil, &ConfigError{Table: t.Name, Option: "WorkersByKey", Reason: "a batch mixes keys", Fix: "drop WorkersByKey, or use Subscribe"}
		}
	}
	spec := dialects.QueueSpec{Table: t, Group: queue, DeadLetterGroup: cfg.deadLetterGroup, DeadLetterTable: cfg.deadLetterTable,
		Transactional: cfg.transactional, Events: cfg.events}
	if t.Group == "" {
		spec.Group = ""
	}
	var reqs *dialects.CancelRequests
	if t.CancelRequests != "" {
		var err error
		if reqs, err = b.checkCancelRequests(ctx, t); err != nil {
			return nil, err
		}
	}
	q, err := b.d.Open(ctx, spec)
	if err != nil {
		return nil, err
	}
	if err := servesForm(b.d, q, t, cfg.transactional); err != nil {
		_ = q.Close()
		return nil, err
	}
	if _, ok := q.(dialects.RowLockBatchQueue); bh != nil && !ok {
		_ = q.Close()
		return nil, &ConfigError{Table: t.Name, Option: "SubscribeBatch", Reason: fmt.Sprintf("the %s dialect cannot claim rows in batches", b.d.Name()),
			Fix: "use Subscribe"}
	}
	if _, ok := q.(dialects.FIFOQueue); t.FIFO && !ok {
		_ = q.Close()
		return nil, &ConfigError{Table: t.Name, Option: "Table.FIFO", Reason: fmt.Sprintf("the %s dialect does not serve FIFO groups in the %s form", b.d.Name(), t.Form()),
			Fix: "drop FIFO, or use a form and database that serve it (row lock or lease)"}
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		_ = q.Close()
		return nil, ErrClosed
	}
	for _, s := range b.subs {
		if s.table.Name == t.Name && (t.Group == "" || s.queue == queue) {
			_ = q.Close()
			return nil, fmt.Errorf("%w: table %q queue %q; raise Workers on the existing subscription instead", ErrAlreadySubscribed, t.Name, queue)
		}
	}
	deadLetter := cfg.deadLetterGroup
	if deadLetter == "" {
		deadLetter = cfg.deadLetterTable
	}
	run, err := actors.Start(b.sys, fmt.Sprintf("%s/%s/%s", b.name, t.Name, queue), actors.Config{
		Table: t.Name, QueueName: queue, DeadLetter: deadLetter, DeadLetterTable: cfg.deadLetterTable != "",
		Form: t.Form(), Queue: q,
		Workers: cfg.workers, Prefetch: cfg.prefetch, AutoPrefetch: cfg.autoPrefetch(t, b.d.Limits()), FIFO: t.FIFO, KeyOf: keyOf(cfg.keyOf, t.Name, queue), Lease: cfg.leaseLength(), Poll: cfg.poll,
		IdlePoll: b.idlePoll(t, cfg.poll),
		Rules: settler.Rules{MaxAttempts: cfg.attemptCap(), HasRetryAfter: t.RetryAfter != "", LeaseDelays: t.Form() == FormLease,
			Backoff: safePolicy(cfg.retryPolicy, b.log, t.Name, queue), Events: eventNames(cfg.events)},
		Handler: b.wrap(h, t.Name, queue), BatchHandler: b.wrapBatch(bh, t.Name, queue), BatchSize: size,
		Now: b.now, Log: b.log, Policy: defaultPolicy, Limits: b.d.Limits(), Dispatcher: b.dispatcher,
		Classify:      func(err error) dialects.Fault { return dialects.Classify(b.d, err) },
		Culprit:       func(err error) dialects.Culprit { return dialects.CulpritOf(b.d, err) },
		Transactional: cfg.transactional,
		Timeout:       cfg.timeout,
		Telemetry:     b.tel.Subscription(t.Name, queue, t.Form().String()),
		OnSettled:     b.settledHook(t.Name, queue),
	})
	if err != nil {
		_ = q.Close()
		return nil, fmt.Errorf("rowactor: start subscription to %s/%s: %w", t.Name, queue, err)
	}
	s := &Subscription{table: t, queue: queue, q: q, run: run}
	b.subs = append(b.subs, s)
	if reqs != nil {
		b.watchCancels(t, reqs)
	}
	return s, nil
}

// idlePollKey names the subscriptions one probe serves: one table, described alike since
// the probe runs the claim's condition, polled at one interval.
type idlePollKey struct {
	table Table
	poll  time.Duration
}

// idlePoll returns the table's idle poll, made on first use. It returns nil when the
// dialect cannot probe; the subscription then polls by a timer of its own. Called under
// b.mu.
func (b *Broker) idlePoll(t Table, poll time.Duration) *actors.IdlePoll {
	prober, ok := b.d.(dialects.DueProber)
	if !ok {
		return nil
	}
	key := idlePollKey{table: t, poll: poll}
	if p := b.idlePolls[key]; p != nil {
		return p
	}
	lease := t.Form() == FormLease
	p := actors.NewIdlePoll(t.Name, poll, b.now, b.log, func(ctx context.Context, groups []string, now time.Time) ([]bool, error) {
		return prober.DueQueues(ctx, t, lease, groups, now)
	})
	if b.idlePolls == nil {
		b.idlePolls = map[idlePollKey]*actors.IdlePoll{}
	}
	b.idlePolls[key] = p
	return p
}

// servesForm refuses a queue whose dialect cannot serve the table's form.
func servesForm(d dialects.Dialect, q dialects.Queue, t Table, transactional bool) error {
	ok := false
	switch t.Form() {
	case FormLease:
		_, ok = q.(dialects.LeaseQueue)
		if _, tx := q.(dialects.TxLeaseQueue); ok && transactional && !tx {
			return &ConfigError{Table: t.Name, Option: "Transactional", Reason: fmt.Sprintf("the %s dialect cannot lend lease deliveries a transaction", d.Name()),
				Fix: "drop Transactional"}
		}
	case FormAdvisory:
		_, ok = q.(dialects.AdvisoryQueue)
	case FormRowLock:
		_, ok = q.(dialects.RowLockQueue)
	}
	if ok {
		return nil
	}
	return &ConfigError{Table: t.Name, Option: "form", Reason: fmt.Sprintf("the %s dialect cannot serve the %s form", d.Name(), t.Form()),
		Fix: "pick a form the database serves (LockedUntil for the lease form, AdvisoryKey for the advisory form)"}
}

// wrap adapts a public handler to the runtime's. The handler's context carries its
// delivery, so PublishTx through the delivery's transaction can wake subscribers once the
// Ack committed it.
func (b *Broker) wrap(h Handler, table, queue string) actors.Handler {
	return func(ctx context.Context, row dialects.Row, tx dialects.DeliveryTx) (settler.Outcome, any) {
		d := &Delivery{broker: b, row: row, table: table, queue: queue, lent: tx, deadline: deadline.From(ctx)}
		if tx == nil {
			return h(ctx, d).o, d
		}
		ctx = context.WithValue(ctx, deliveryKey{}, d)
		// The *sql.Tx that Tx makes is lent until the handler returns, panicking or not.
		defer d.endLending()
		return h(ctx, d).o, d
	}
}

// wrapBatch adapts a public batch handler to the runtime's.
func (b *Broker) wrapBatch(h BatchHandler, table, queue string) actors.BatchHandler {
	if h == nil {
		return nil
	}
	return func(ctx context.Context, rows []dialects.Row, cancelled func(int) error) ([]settler.Outcome, []any) {
		ds := make([]*Delivery, len(rows))
		tags := make([]any, len(rows))
		dl := deadline.From(ctx) // the batch's, shared by its deliveries
		for i, r := range rows {
			ds[i] = &Delivery{broker: b, row: r, table: table, queue: queue, deadline: dl, batchCancelled: cancelled, index: i}
			tags[i] = ds[i]
		}
		out := h(ctx, ds)
		os := make([]settler.Outcome, len(out))
		for i, o := range out {
			os[i] = o.o
		}
		return os, tags
	}
}

func (b *Broker) settledHook(table, queue string) func(actors.Result) {
	key := throughputKey{table, queue}
	return func(r actors.Result) {
		b.throughput.note(key, r, b.now())
		if d, ok := r.Tag.(*Delivery); ok && r.Err == nil && (r.Step == dialects.StepAck || r.Step == dialects.StepCustom) {
			for _, w := range d.published() {
				b.wake(w.table, w.queue)
			}
		}
		if b.onSettled == nil {
			return
		}
		b.onSettled(Settlement{
			Broker: b, Table: table, Queue: queue, ID: r.Row.ID, Attempt: r.Row.Attempt,
			Outcome: Outcome{r.Outcome}, Step: r.Step.String(), Event: r.Event, Released: r.Released, Err: r.Err,
			HandlerErr: r.Outcome.Err, Panic: r.Panic,
		})
	}
}

func eventNames(events map[string]string) map[string]bool {
	if len(events) == 0 {
		return nil
	}
	names := make(map[string]bool, len(events))
	for n := range events {
		names[n] = true
	}
	return names
}

// keyOf adapts WorkersByKey's key function to the runtime's rows.
func keyOf(key func(*Delivery) string, table, queue string) func(dialects.Row) string {
	if key == nil {
		return nil
	}
	return func(row dialects.Row) string { return key(&Delivery{row: row, table: table, queue: queue}) }
}
