package rowactor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel"

	"github.com/rowactor/rowactor/actors"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/telemetry"
	"github.com/rowactor/rowactor/supervision"
)

// Broker claims rows from a database's queue tables and runs handlers on them, and
// publishes rows into them. It is safe for concurrent use. Shutdown stops it.
type Broker struct {
	d         dialects.Dialect
	ownsD     bool
	sys       *actor.ActorSystem
	lentSys   *actors.System // the system rowactor lent this broker, nil under WithActorSystem
	log       *slog.Logger
	onSettled func(Settlement)
	now       func() time.Time
	name      string

	closed atomic.Bool
	mu     sync.Mutex
	subs   []*Subscription
	// throughput counts settlements per queue and minute, for Throughput.
	throughput throughput
	pubs       map[Table]dialects.Publisher
	// idlePolls poll the idle subscriptions of one table together. Guarded by mu.
	idlePolls map[idlePollKey]*actors.IdlePoll
	// retentions run until Shutdown. Guarded by mu.
	retentions []*Retention
	// periodics run until Shutdown. Guarded by mu.
	periodics []*PeriodicJob
	// cancelWatches read each table's cancel requests, by table name. Guarded by mu.
	cancelWatches map[string]*cancelWatch

	// Publishes in flight, which Shutdown lets finish before it closes anything they use.
	pubMu      sync.Mutex
	publishing int
	pubIdle    chan struct{} // closed when publishing drops to 0 once Shutdown waits
	closing    atomic.Bool   // Shutdown closes the queues and the dialect

	dispatcher    *actors.Dispatcher
	shutDown      chan struct{}           // closed when Shutdown finished
	stopping      chan struct{}           // closed when Shutdown begins; Done returns it
	cancelDrain   context.CancelCauseFunc // ends the drain of the Shutdown in progress; guarded by mu
	tel           *telemetry.Telemetry
	stopListening context.CancelFunc
	listening     chan struct{} // closed when the listener returned
	// notified is true while the listener runs: publishes in this process's transactions
	// wake its subscriptions at their commit, through NOTIFY.
	notified atomic.Bool
	// clock is the broker's clock when it jumps, as WithClock allows, and its follower's end.
	clock     advancingClock
	stopClock context.CancelFunc
	clockDone chan struct{}
}

var brokerSeq atomic.Int64

// New returns a broker over a dialect, such as sqlite.New(db).
// The caller keeps ownership of the dialect's pool.
func New(d dialects.Dialect, opts ...Option) (*Broker, error) {
	if d == nil || isNilPointer(d) {
		// A nil *Dialect in the interface is what a dialect's Open returns beside its error.
		return nil, errors.New("rowactor: New needs a dialect, e.g. sqlite.New(db); got nil (was an Open error ignored?)")
	}
	cfg := brokerConfig{now: time.Now}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.clockErr != nil {
		return nil, cfg.clockErr
	}
	b := &Broker{
		d: d, log: cfg.log, onSettled: cfg.onSettled, now: cfg.now,
		name:       fmt.Sprintf("rowactor-%d", brokerSeq.Add(1)),
		pubs:       make(map[Table]dialects.Publisher),
		dispatcher: actors.NewDispatcher(time.Second),
		shutDown:   make(chan struct{}),
		stopping:   make(chan struct{}),
	}
	if b.log == nil {
		b.log = slog.New(warnOnly{slog.Default().Handler()})
	}
	b.log = slog.New(guardedHandler{b.log.Handler()})
	if cfg.tracers == nil {
		cfg.tracers = otel.GetTracerProvider()
	}
	if cfg.meters == nil {
		cfg.meters = otel.GetMeterProvider()
	}
	tel, err := telemetry.New(cfg.tracers, cfg.meters, d.Name())
	if err != nil {
		return nil, fmt.Errorf("rowactor: telemetry: %w", err)
	}
	b.tel = tel
	b.sys = cfg.system
	if b.sys == nil {
		b.lentSys = actors.TakeSystem(b.log)
		b.sys = b.lentSys.ActorSystem
	}
	if n, ok := d.(dialects.Notifier); ok && !cfg.pollOnly {
		b.listen(n)
	}
	if c, ok := cfg.clock.(advancingClock); ok {
		b.clock = c
		b.followClock(c)
	}
	return b, nil
}

// listen wakes this broker's subscriptions when another process publishes, through the
// dialect's one listening connection. Polling stays the floor: a lost notification only
// delays a row until the next poll.
func (b *Broker) listen(n dialects.Notifier) {
	ctx, cancel := context.WithCancel(context.Background())
	b.stopListening, b.listening = cancel, make(chan struct{})
	b.notified.Store(true)
	go func() {
		defer close(b.listening)
		defer b.notified.Store(false)
		if err := n.Listen(ctx, b.wakeNotified); err != nil && ctx.Err() == nil {
			b.log.Warn("rowactor: listening for publishes from other processes stopped; subscriptions poll",
				slog.Any("error", err))
		}
	}()
}

// wakeNotified wakes the subscriptions a notification names; an empty table wakes all.
func (b *Broker) wakeNotified(table, group string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.subs {
		if table == "" || (s.table.Name == table && (group == "" || s.table.Group == "" || s.queue == group)) {
			s.run.Wake()
		}
	}
}

// Dialect returns the broker's dialect, for Schema and to reach its pool.
func (b *Broker) Dialect() dialects.Dialect { return b.d }

// DB returns the broker's database as a *sql.DB, on every database: for the service's
// own statements, and for a transaction to publish in with PublishTx. On PostgreSQL it is
// pgx's database/sql driver over the broker's pool, so it shares the pool and its size.
//
// The broker closes it at Shutdown when it opened the database itself (Open). It returns
// an error only for a dialect that cannot lend a *sql.DB.
func (b *Broker) DB() (*sql.DB, error) {
	s, ok := b.d.(dialects.SQLDB)
	if !ok {
		return nil, fmt.Errorf("rowactor: the %s dialect cannot lend a *sql.DB (it has no SQLDB method); use its own pool", b.d.Name())
	}
	return s.SQLDB(), nil
}

// Done is closed when Shutdown begins.
//
// Work a service runs beside the broker on its dialect should end with it, so that it
// does not hold up Shutdown: Shutdown waits for the connections in use before it closes
// the pool. A dashboard's background counts do so.
func (b *Broker) Done() <-chan struct{} { return b.stopping }

// ShutdownReport is what Shutdown found and gave back.
type ShutdownReport struct {
	// Drained is true when every delivery given to a handler settled before the context
	// ended. When it is false, Shutdown's error matches ErrNotDrained and what ended the
	// context. Rows claimed but never handed to a handler are released either way, and
	// counted in Released.
	Drained bool
	// Released counts rows given back unsettled: leases cleared, keys unlocked.
	Released int
	// ConnectionsClosed counts session connections closed rather than returned to the pool.
	ConnectionsClosed int
}

// Shutdown stops claiming, lets deliveries in work settle until ctx ends, then cancels
// the handlers' context, releases every row still in work, and reports what it released.
// Publishes already under way finish first. Afterwards Publish, Subscribe and late
// settlements return ErrClosed. No goroutine of rowactor's survives it.
//
// It returns within two seconds of ctx's end, whatever handlers do. A handler still
// running then is not waited for: its row is given back, and in transactional mode its
// writes roll back.
//
// It returns a nil error when it drained. When ctx ended with rows still in work, the
// error matches ErrNotDrained and what ended ctx, and the report says what was left:
// check errors.Is(err, ErrNotDrained). A second call waits for the first and returns
// ErrClosed.
//
// Called from a handler, or from a hook rowactor runs (WithOnSettled), Shutdown returns
// ErrShutdownInHandler at once and shuts down in the background.
//
// See docs/operations.md, "Shutdown, rule by rule", for releases the database keeps
// waiting, owned pools and the exact error text.
func (b *Broker) Shutdown(ctx context.Context) (ShutdownReport, error) {
	if !b.closed.CompareAndSwap(false, true) {
		if b.dispatcher.Running() {
			// From a handler while a Shutdown runs, which may be waiting for this very
			// delivery.
			return ShutdownReport{}, ErrClosed
		}
		select {
		case <-b.shutDown:
		case <-ctx.Done():
			// This caller's budget is spent too: end the drain, so that deliveries still
			// in work are released now rather than when the first caller's ends.
			b.endDrain(fmt.Errorf("a second Shutdown's context ended: %w", ctx.Err()))
			<-b.shutDown
		}
		return ShutdownReport{}, ErrClosed
	}
	close(b.stopping)
	if b.dispatcher.Running() {
		// The caller's context may end as its handler returns, by a deferred cancel. The
		// shutdown keeps its deadline, not its cancellation, and a later Shutdown from
		// outside can still end the drain.
		c, cancel := withoutCancelKeepDeadline(ctx)
		drainCtx := b.startDrain(c)
		go func() {
			defer cancel()
			_, _ = b.shutdown(c, drainCtx)
		}()
		return ShutdownReport{}, ErrShutdownInHandler
	}
	return b.shutdown(ctx, b.startDrain(ctx))
}

// startDrain makes the drain's context, which endDrain ends. It runs before anything
// else of the shutdown, since a second Shutdown may call endDrain at once.
func (b *Broker) startDrain(ctx context.Context) context.Context {
	drainCtx, cancel := context.WithCancelCause(ctx)
	b.mu.Lock()
	b.cancelDrain = cancel
	b.mu.Unlock()
	return drainCtx
}

// withoutCancelKeepDeadline is ctx's values and deadline without its cancellation.
func withoutCancelKeepDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok {
		return context.WithDeadline(context.WithoutCancel(ctx), dl)
	}
	return context.WithCancel(context.WithoutCancel(ctx))
}

// endDrain ends the drain of a Shutdown in progress; cause is what its error reports.
func (b *Broker) endDrain(cause error) {
	b.mu.Lock()
	cancel := b.cancelDrain
	b.mu.Unlock()
	if cancel != nil {
		cancel(cause)
	}
}

// drainEndedBy is what ended a drain. That is the caller's ctx, with its own cause when
// it has one, or else the cause a second Shutdown gave endDrain.
func drainEndedBy(ctx, drainCtx context.Context) error {
	if err := ctx.Err(); err != nil {
		if cause := context.Cause(ctx); cause != nil && cause != err {
			return fmt.Errorf("%w: %w", err, cause)
		}
		return err
	}
	return context.Cause(drainCtx)
}

// notDrained is Shutdown's error for a drain that ctx cut short: what was left, and why.
func notDrained(rep ShutdownReport, why error) error {
	left := fmt.Sprintf("%d rows released", rep.Released)
	if rep.Released == 1 {
		left = "1 row released"
	}
	if rep.ConnectionsClosed > 0 {
		left += fmt.Sprintf(", %d session connections closed", rep.ConnectionsClosed)
	}
	return &notDrainedError{msg: fmt.Sprintf("%v: %s: %v", ErrNotDrained, left, why), why: why}
}

// notDrainedError matches ErrNotDrained and unwraps to what ended the drain. It wraps one
// error, not two, so that a caller taking Shutdown's errors.Join apart finds it whole.
type notDrainedError struct {
	msg string
	why error
}

func (e *notDrainedError) Error() string        { return e.msg }
func (e *notDrainedError) Is(target error) bool { return target == ErrNotDrained }
func (e *notDrainedError) Unwrap() error        { return e.why }

func (b *Broker) shutdown(ctx, drainCtx context.Context) (ShutdownReport, error) {
	defer close(b.shutDown)
	defer b.endDrain(nil)
	var rep ShutdownReport
	b.mu.Lock()
	subs := b.subs
	b.subs = nil
	rets := b.retentions
	b.retentions = nil
	pers := b.periodics
	b.periodics = nil
	watches := b.cancelWatches
	b.cancelWatches = nil
	b.mu.Unlock()
	// The watches first: a cancel they serve waits for a delivery the drain settles.
	for _, w := range watches {
		w.end()
	}
	// Retentions and periodic jobs first: they are no deliveries, and a round holds a pool
	// connection that a handler draining now may be waiting for, for its own queries on a
	// small pool.
	for _, r := range rets {
		r.stop()
	}
	for _, p := range pers {
		if !p.stop(ctx) {
			b.log.Warn("rowactor: a periodic job's round had not ended when Shutdown's context ended (a statement of its round still waits on the database)", "table", p.table, "job", p.name)
		}
	}

	// Counted from before the drain: it gives back prefetched rows that never started.
	relRows, relConns := make([]int, len(subs)), make([]int, len(subs))
	drains := make([]actors.Draining, len(subs))
	for i, s := range subs {
		relRows[i], relConns[i] = s.run.Released()
		drains[i] = s.run.Drain()
	}
	// Drained unless a delivery was still in work when the drain ended: a subscription
	// with nothing in work drains even under a context that ended before Shutdown began.
	rep.Drained = true
	var endedBy error
	for _, dr := range drains {
		if !dr.Wait(drainCtx) {
			rep.Drained, endedBy = false, drainEndedBy(ctx, drainCtx)
			break
		}
	}
	// Publishes already under way finish; new ones were refused from the start. One the
	// context cuts short is reported to its caller as ErrClosed.
	b.waitPublishes(drainCtx)
	b.closing.Store(true)
	// The releases get a moment past ctx's end, and no more: a spent ctx must still leave
	// no lock behind, a release takes milliseconds, and Shutdown returns within
	// shutdownGrace of ctx's end whatever handlers do. A release still running then is cut
	// off, closing its connection, which ends its locks and keys; a lease is left to run
	// out, fenced. The subscriptions stop side by side, under the one budget.
	budget, endBudget := graceAfter(ctx, shutdownGrace, time.Minute)
	defer endBudget()
	stopErrs := make([]error, len(subs))
	var stops sync.WaitGroup
	for i, s := range subs {
		stops.Add(1)
		go func() {
			defer stops.Done()
			if err := s.run.Stop(budget); err != nil {
				stopErrs[i] = fmt.Errorf("table %s queue %s: %w", s.table.Name, s.queue, err)
			}
		}()
	}
	stops.Wait()
	var errs []error
	stopped := true
	for i, s := range subs {
		if stopErrs[i] != nil {
			stopped = false
			errs = append(errs, stopErrs[i])
		}
		r2, c2 := s.run.Released()
		rep.Released += r2 - relRows[i]
		rep.ConnectionsClosed += c2 - relConns[i]
		if err := s.q.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	b.mu.Lock()
	polls := b.idlePolls
	b.idlePolls = nil
	b.mu.Unlock()
	for _, p := range polls {
		p.Close()
	}
	if b.stopListening != nil {
		b.stopListening()
		<-b.listening
	}
	if b.stopClock != nil {
		b.stopClock()
		<-b.clockDone
	}
	b.dispatcher.Close()
	if b.lentSys != nil {
		// Given back only when every subscription actor, and so every actor of this
		// broker, stopped: the next broker must find none of their names taken.
		if stopped {
			b.lentSys.Give()
		} else {
			b.lentSys.Drop()
		}
	}
	if b.ownsD {
		if err := closeWithin(budget, b.d); err != nil {
			errs = append(errs, err)
		}
	}
	if !rep.Drained {
		errs = append([]error{notDrained(rep, endedBy)}, errs...)
	}
	if len(errs) == 1 {
		return rep, errs[0]
	}
	return rep, errors.Join(errs...)
}

// shutdownGrace is how long past its context's end Shutdown may take to give back what
// it still holds. The promise is that it "returns within a moment of ctx's end".
const shutdownGrace = 1500 * time.Millisecond

// graceAfter is the budget of what Shutdown does once its drain is over. The context it
// returns ends grace after ctx ends, and at most limit from now, for a ctx without a
// deadline or a drain that ended early.
func graceAfter(ctx context.Context, grace, limit time.Duration) (context.Context, context.CancelFunc) {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), limit)
	var mu sync.Mutex
	var timer *time.Timer
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if c.Err() == nil {
			timer = time.AfterFunc(grace, cancel)
		}
	})
	return c, func() {
		stop()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// closeWithin closes a dialect Shutdown owns, from Open, waiting for it until ctx ends.
// A pool's Close waits for the connections in use to be returned. Without the bound, a
// handler's own query on the broker's pool that ignores its context would hold Shutdown
// for as long as the handler runs. The pool closes once the connection is returned.
func closeWithin(ctx context.Context, d dialects.Dialect) error {
	done := make(chan error, 1)
	go func() { done <- d.Close() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	// A close that takes a moment still gets it, though the releases spent the budget.
	select {
	case err := <-done:
		return err
	case <-time.After(100 * time.Millisecond):
		return fmt.Errorf("rowactor: closing the broker's %s pool: connections were still in use when Shutdown's context ended "+
			"(a handler or a payload function still running on the pool); it closes once they are returned: %w", d.Name(), ctx.Err())
	}
}

// enterPublish counts a publish in flight; false once Shutdown began.
func (b *Broker) enterPublish() bool {
	b.pubMu.Lock()
	defer b.pubMu.Unlock()
	if b.closed.Load() {
		return false
	}
	b.publishing++
	return true
}

// leavePublish ends a publish counted by enterPublish.
func (b *Broker) leavePublish() {
	b.pubMu.Lock()
	defer b.pubMu.Unlock()
	b.publishing--
	if b.publishing == 0 && b.pubIdle != nil {
		close(b.pubIdle)
		b.pubIdle = nil
	}
}

// waitPublishes waits until no publish is in flight, or ctx ends. Shutdown has set closed,
// so no publish starts meanwhile: enterPublish reads closed under pubMu.
func (b *Broker) waitPublishes(ctx context.Context) {
	b.pubMu.Lock()
	if b.publishing == 0 {
		b.pubMu.Unlock()
		return
	}
	if b.pubIdle == nil {
		b.pubIdle = make(chan struct{})
	}
	idle := b.pubIdle
	b.pubMu.Unlock()
	select {
	case <-idle:
	case <-ctx.Done():
	}
}

// Settlement is what became of one delivery, as told to the WithOnSettled hook.
type Settlement struct {
	// Broker is the broker whose subscription settled the row. A hook shared by brokers
	// on several databases tells their rows apart by it, since rows of two databases can
	// share a table name and an id.
	Broker  *Broker
	Table   string
	Queue   string
	ID      int64
	Attempt int
	// Outcome is the handler's outcome; the zero Outcome when it panicked or never
	// returned.
	Outcome Outcome
	// Step is the statement that ran: "ack", "retry", "retry_after", "snooze",
	// "dead_letter", "event" for an event a handler named with Event, or "release" for a
	// row given back unsettled. A Fail runs "retry_after", "retry" or "dead_letter".
	Step string
	// Event names the subscription's own event, given with OnEvent, that ran in place of
	// the step's built-in statement; "" when none did.
	Event string
	// Released reports a row given back unsettled.
	Released bool
	// Err is the settlement statement's own result:
	//   - nil: the settlement took effect.
	//   - ErrLeaseLost: a later claim owns the row, and nothing changed.
	//   - ErrClosed: Shutdown released the row first, or Shutdown's context ended while
	//     the settlement waited for a row another session holds. Nothing changed; the
	//     lease runs out and the row is handled again.
	//   - ErrAbandoned, with context.DeadlineExceeded: the handler ran past its deadline
	//     and the grace after it, and the row was released with Step "release". The hook
	//     is told as the row is released, not when the handler returns.
	//   - a database error: the outcome is unknown. A connection lost during COMMIT may
	//     have committed, as MariaDB often does, so handlers must stay idempotent.
	Err error
	// HandlerErr is the error the handler's outcome carried, through Fail or
	// Outcome.WithError; nil when none. Err stays the settlement statement's own error.
	HandlerErr error
	// Panic is the handler's panic value, if it panicked.
	Panic any
}

// warnOnly keeps a handler's records at warn and above: rowactor is quiet by default.
type warnOnly struct{ slog.Handler }

func (w warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && w.Handler.Enabled(ctx, l)
}
func (w warnOnly) WithAttrs(a []slog.Attr) slog.Handler { return warnOnly{w.Handler.WithAttrs(a)} }
func (w warnOnly) WithGroup(n string) slog.Handler      { return warnOnly{w.Handler.WithGroup(n)} }

// guardedHandler runs the service's slog.Handler, whose panics it keeps from rowactor's
// own work: a log line is never worth a row. A handler that panicked while rowactor
// logged a WithOnSettled hook's panic left that delivery's in-work count behind, and
// Shutdown reported "did not drain"; one that panicked at New crashed the process.
type guardedHandler struct{ h slog.Handler }

func (g guardedHandler) Enabled(ctx context.Context, l slog.Level) (on bool) {
	defer func() {
		if recover() != nil {
			on = false
		}
	}()
	return g.h.Enabled(ctx, l)
}

func (g guardedHandler) Handle(ctx context.Context, r slog.Record) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("rowactor: the slog handler panicked: %v", v)
		}
	}()
	return g.h.Handle(ctx, r)
}

func (g guardedHandler) WithAttrs(a []slog.Attr) (h slog.Handler) {
	defer func() {
		if recover() != nil {
			h = g // the attributes are lost, the logging goes on
		}
	}()
	return guardedHandler{g.h.WithAttrs(a)}
}

func (g guardedHandler) WithGroup(n string) (h slog.Handler) {
	defer func() {
		if recover() != nil {
			h = g
		}
	}()
	return guardedHandler{g.h.WithGroup(n)}
}

// defaultPolicy is the claimer's restart backoff.
var defaultPolicy = supervision.DefaultPolicy

// isNilPointer reports whether d holds a nil pointer.
func isNilPointer(d any) bool {
	v := reflect.ValueOf(d)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
