package rowactor

import (
	"context"
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
	ownsSys   bool
	log       *slog.Logger
	onSettled func(Settlement)
	now       func() time.Time
	name      string

	closed atomic.Bool
	mu     sync.Mutex
	subs   []*Subscription
	// throughput counts settlements per queue and minute (Throughput).
	throughput throughput
	pubs       map[Table]dialects.Publisher
	// idlePolls poll the idle subscriptions of one table together (under mu).
	idlePolls map[idlePollKey]*actors.IdlePoll
	// retentions run until Shutdown (under mu).
	retentions []*Retention
	// periodics run until Shutdown (under mu).
	periodics []*PeriodicJob

	// Publishes in flight, which Shutdown lets finish before it closes anything they use.
	pubMu      sync.Mutex
	publishing int
	pubIdle    chan struct{} // closed when publishing drops to 0 once Shutdown waits
	closing    atomic.Bool   // Shutdown closes the queues and the dialect

	dispatcher    *actors.Dispatcher
	shutDown      chan struct{}           // closed when Shutdown finished
	stopping      chan struct{}           // closed when Shutdown begins (Done)
	cancelDrain   context.CancelCauseFunc // ends the drain of the Shutdown in progress (under mu)
	tel           *telemetry.Telemetry
	stopListening context.CancelFunc
	listening     chan struct{} // closed when the listener returned
	// clock, when the broker's clock jumps (WithClock), and its follower's end.
	clock     advancingClock
	stopClock context.CancelFunc
	clockDone chan struct{}
}

var brokerSeq atomic.Int64

// New returns a broker over a dialect (sqlite.New(db), and later postgres and mysql).
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
		b.sys, b.ownsSys = actors.NewSystem(b.log), true
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
	go func() {
		defer close(b.listening)
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

// Dialect returns the broker's dialect (for Schema, and to reach its pool).
func (b *Broker) Dialect() dialects.Dialect { return b.d }

// Done is closed when Shutdown begins. Work a service runs beside the broker on its
// dialect (a dashboard's background counts) ends with it, so that Shutdown, which waits
// for the connections in use before it closes the pool, is not held up by it.
func (b *Broker) Done() <-chan struct{} { return b.stopping }

// ShutdownReport is what Shutdown found and gave back.
type ShutdownReport struct {
	// Drained is true when every delivery given to a handler settled before the context
	// ended (rows claimed but never handed to a handler are released either way, and
	// counted in Released). When it is false, Shutdown's error matches ErrNotDrained and
	// what ended the context.
	Drained bool
	// Released counts rows given back unsettled: leases cleared, keys unlocked.
	Released int
	// ConnectionsClosed counts session connections closed rather than returned to the pool.
	ConnectionsClosed int
}

// Shutdown stops claiming, lets deliveries in work settle until ctx ends, then cancels
// the handlers' context and releases every row still in work, and reports what it
// released. Afterwards Publish, Subscribe and late settlements return ErrClosed; publishes
// already under way when it starts finish before it closes anything (until ctx ends: one
// it cuts short returns ErrClosed too, never the driver's word about a closed pool). No
// goroutine of rowactor's survives it; a handler that ignores its context keeps its own.
// A second call waits for the first to finish (or for its own ctx) and returns ErrClosed.
//
// A Shutdown that drained returns a nil error (unless a release or a close failed). One
// whose ctx ended while rows were still in work returns the report and an error that
// matches ErrNotDrained and what ended ctx (errors.Is(err, context.DeadlineExceeded) for a
// deadline, context.Canceled for a cancel), and says what was left: "rowactor: shutdown
// did not drain: 3 rows released: context deadline exceeded". A service that shuts down
// with a short budget on purpose checks errors.Is(err, ErrNotDrained) and reads the report.
//
// Called from a handler (or a hook rowactor runs), Shutdown cannot wait for the delivery
// that called it: it returns ErrShutdownInHandler at once, and the shutdown runs in the
// background, letting that delivery settle when its handler returns.
func (b *Broker) Shutdown(ctx context.Context) (ShutdownReport, error) {
	if !b.closed.CompareAndSwap(false, true) {
		if b.dispatcher.Running() {
			// From a handler while a Shutdown runs: that Shutdown may be waiting for this
			// very delivery.
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
		// The caller's context may end as its handler returns (a deferred cancel): the
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

// startDrain makes the drain's context, which endDrain ends, before anything of the
// shutdown runs: a second Shutdown may call endDrain at once.
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

// drainEndedBy is what ended a drain: the caller's ctx (its error, and its cause when it
// has one of its own), or else the cause a second Shutdown gave endDrain.
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
	b.mu.Unlock()
	// Retentions and periodic jobs first: they are no deliveries, and a round holds a pool
	// connection that a handler draining now may be waiting for (its own queries, on a
	// small pool).
	for _, r := range rets {
		r.stop()
	}
	for _, p := range pers {
		if !p.stop(ctx) {
			b.log.Warn("rowactor: a periodic job's payload function had not returned when Shutdown went on", "table", p.table, "job", p.name)
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
	// Publishes already under way finish (new ones were refused from the start); one the
	// context cuts short is reported to its caller as ErrClosed.
	b.waitPublishes(drainCtx)
	b.closing.Store(true)
	var errs []error
	for i, s := range subs {
		rows, conns := relRows[i], relConns[i]
		// Releases are bounded by the settle timeout each; give them their own budget so a
		// spent ctx still leaves no lock behind.
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		if err := s.run.Stop(stopCtx); err != nil {
			errs = append(errs, fmt.Errorf("table %s queue %s: %w", s.table.Name, s.queue, err))
		}
		cancel()
		r2, c2 := s.run.Released()
		rep.Released += r2 - rows
		rep.ConnectionsClosed += c2 - conns
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
	if b.ownsSys {
		b.sys.Shutdown()
	}
	if b.ownsD {
		if err := b.d.Close(); err != nil {
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
	Table   string
	Queue   string
	ID      int64
	Attempt int
	// Outcome is the handler's outcome (the zero Outcome when it panicked or never returned).
	Outcome Outcome
	// Step is the statement that ran: "ack", "retry", "retry_after", "snooze",
	// "dead_letter", "custom" for an event of the handler's Custom, or "release" for a row
	// given back unsettled. A Fail runs "retry_after" (or "retry", or "dead_letter").
	Step string
	// Event names the subscription's own event (OnEvent) that ran in place of the step's
	// built-in statement; "" when none did.
	Event string
	// Released reports a row given back unsettled.
	Released bool
	// Err is nil when the settlement took effect; ErrLeaseLost when a later claim owns the
	// row (nothing changed); ErrClosed when Shutdown released the row first (nothing
	// changed); ErrAbandoned, with context.DeadlineExceeded, when the handler ran past its
	// deadline and the grace after it and the row was released (Step "release"; told as
	// the row is released, not when the handler returns). A database error means the outcome is unknown: a connection lost during
	// COMMIT may have committed (MariaDB often does), so handlers must stay idempotent.
	Err error
	// HandlerErr is the error the handler's outcome carried (Fail(err), or an outcome's
	// WithError(err)); nil when none. Err stays the settlement statement's own error.
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

// defaultPolicy is the claimer's restart backoff.
var defaultPolicy = supervision.DefaultPolicy

// isNilPointer reports whether d holds a nil pointer.
func isNilPointer(d any) bool {
	v := reflect.ValueOf(d)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
