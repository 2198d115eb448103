package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/propagation"

	"github.com/rowactor/rowactor/actors"
	"github.com/rowactor/rowactor/dialects"
	rowheaders "github.com/rowactor/rowactor/internal/headers"
	"github.com/rowactor/rowactor/supervision"
)

// ErrRelayRunning reports a second relay started on one Outbox: two relays would send
// every record twice.
var ErrRelayRunning = errors.New("rowactor/outbox: a relay is already running on this outbox")

// RelayOption configures a relay.
type RelayOption func(*relayConfig)

type relayConfig struct {
	poll   time.Duration
	batch  int
	sys    *actor.ActorSystem
	policy supervision.Policy
}

// PollInterval sets how often an idle relay looks for unsent records; Wake makes it look
// at once. Defaults to 1 s.
func PollInterval(d time.Duration) RelayOption { return func(c *relayConfig) { c.poll = d } }

// BatchSize sets how many records one round reads, sends and stamps before the relay looks
// at its mailbox again (a Wake, a Stop). Defaults to 100.
func BatchSize(n int) RelayOption { return func(c *relayConfig) { c.batch = n } }

// WithActorSystem runs the relay's actors in a service's own Proto.Actor system, which
// Stop leaves running. Defaults to a system of the relay's own.
func WithActorSystem(sys *actor.ActorSystem) RelayOption { return func(c *relayConfig) { c.sys = sys } }

// Backoff sets the delay before a failed round is tried again: initial, doubling with each
// consecutive failure up to max, drawn uniformly from its upper half. Defaults to 100 ms
// doubling to 30 s.
func Backoff(initial, max time.Duration) RelayOption {
	return func(c *relayConfig) {
		c.policy = supervision.Policy{Initial: initial, Max: max, Window: supervision.DefaultPolicy.Window}
	}
}

// Relay sends an outbox's records to a sink: one relay actor per outbox, and a worker
// actor under it that runs the rounds.
type Relay struct {
	o    *Outbox
	sink Sink
	cfg  relayConfig

	sys     *actor.ActorSystem
	lentSys *actors.System // the system rowactor lent this relay, nil under WithActorSystem
	pid     *actor.PID
	done    chan struct{} // closed when the relay actor stopped

	// ctx bounds every statement and send; Stop cancels it when its own ctx ends first.
	ctx    context.Context
	cancel context.CancelFunc

	wakePending atomic.Bool
	stopping    atomic.Bool
	stopOnce    sync.Once
	stopErr     error
	sent        atomic.Int64
}

var relaySeq atomic.Int64

// StartRelay starts the outbox's relay. It first sends every record still unprocessed,
// sent or not, in id order (a record whose earlier delivery was lost anywhere is delivered
// again), then every record not yet sent, each poll interval and at each Wake. One relay
// runs per Outbox; relays in two processes on one table may send a record twice, as a
// crash may: consumers dedupe by record id.
func (o *Outbox) StartRelay(sink Sink, opts ...RelayOption) (*Relay, error) {
	if sink == nil {
		return nil, &dialects.ConfigError{Table: o.t.Name, Option: "sink", Reason: "the sink is nil", Fix: "pass a Sink (NewQueueSink, or a SinkFunc)"}
	}
	cfg := relayConfig{poll: time.Second, batch: 100, policy: supervision.DefaultPolicy}
	for _, opt := range opts {
		opt(&cfg)
	}
	switch {
	case cfg.poll <= 0:
		return nil, &dialects.ConfigError{Table: o.t.Name, Option: "PollInterval",
			Reason: fmt.Sprintf("PollInterval(%v) is not a positive interval", cfg.poll), Fix: "use a positive duration such as time.Second"}
	case cfg.batch < 1:
		return nil, &dialects.ConfigError{Table: o.t.Name, Option: "BatchSize",
			Reason: fmt.Sprintf("BatchSize(%d) sends nothing", cfg.batch), Fix: "use BatchSize(1) or more"}
	case cfg.policy.Initial <= 0 || cfg.policy.Max < cfg.policy.Initial:
		return nil, &dialects.ConfigError{Table: o.t.Name, Option: "Backoff",
			Reason: fmt.Sprintf("Backoff(%v, %v) needs a positive initial delay no longer than its cap", cfg.policy.Initial, cfg.policy.Max),
			Fix:    "use e.g. Backoff(100*time.Millisecond, 30*time.Second)"}
	}
	r := &Relay{o: o, sink: sink, cfg: cfg, sys: cfg.sys, done: make(chan struct{})}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.relays) > 0 {
		return nil, fmt.Errorf("%w (%s)", ErrRelayRunning, o.t.Name)
	}
	if r.sys == nil {
		r.lentSys = actors.TakeSystem(o.cfg.log)
		r.sys = r.lentSys.ActorSystem
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	pid, err := r.sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &relayActor{r: r} }),
		fmt.Sprintf("rowactor-outbox/%s/%d", o.t.Name, relaySeq.Add(1)))
	if err != nil {
		r.cancel()
		if r.lentSys != nil {
			r.lentSys.Give() // nothing was spawned on it
		}
		return nil, fmt.Errorf("rowactor/outbox: start the relay of %s: %w", o.t.Name, err)
	}
	r.pid = pid
	o.relays[r] = struct{}{}
	return r, nil
}

// Wake makes the relay look for unsent records now rather than at its next poll. Wakes
// that arrive while one is pending cost one atomic operation.
func (r *Relay) Wake() {
	if !r.stopping.Load() && r.wakePending.CompareAndSwap(false, true) {
		r.sys.Root.Send(r.pid, wakeMsg{})
	}
}

// Sent is how many records the relay has handed to its sink (and stamped sent).
func (r *Relay) Sent() int64 { return r.sent.Load() }

// Stop stops the relay: it finishes the record in hand (the rest of its round waits for
// the next start) until ctx ends, then cancels the send or statement in flight, and
// returns once its actors stopped. A record cut off between its send and its stamp is sent
// again at the next start. A sink that ignores its context keeps Stop waiting. A second
// call returns the first one's result.
func (r *Relay) Stop(ctx context.Context) error {
	r.stopOnce.Do(func() {
		r.stopping.Store(true)
		r.sys.Root.Stop(r.pid)
		select {
		case <-r.done:
		case <-ctx.Done():
			r.stopErr = fmt.Errorf("rowactor/outbox: stop the relay of %s: the record in hand was cut off: %w", r.o.t.Name, ctx.Err())
			r.cancel()
			<-r.done
		}
		r.cancel()
		if r.lentSys != nil {
			r.lentSys.Give() // done closed: the relay's actors have stopped
		}
		r.o.mu.Lock()
		delete(r.o.relays, r)
		r.o.mu.Unlock()
	})
	return r.stopErr
}

type (
	wakeMsg struct{}
	tickMsg struct{}
	// roundMsg asks the worker for one round: the next batch of the start-up pass (records
	// unprocessed with an id above after) while resending, of unsent records afterwards.
	roundMsg struct {
		resending bool
		after     int64
	}
	// roundDone reports a round: how far the start-up pass got, whether more records may
	// be waiting, and the error that ended it early.
	roundDone struct {
		resending bool
		after     int64
		more      bool
		err       error
	}
)

func (wakeMsg) IgnoreDeadLetterLogging()    {}
func (tickMsg) IgnoreDeadLetterLogging()    {}
func (*roundMsg) IgnoreDeadLetterLogging()  {}
func (*roundDone) IgnoreDeadLetterLogging() {}

// relayActor keeps one round in flight on its worker whenever records may be due (at
// start, each poll, on a wake, after a full batch) and supervises the worker: a worker
// whose database or sink failed is restarted after a capped, jittered backoff, and the
// round that follows waits in its mailbox until then.
type relayActor struct {
	r         *Relay
	worker    *actor.PID
	backoff   *supervision.Backoff
	busy      bool
	due       bool
	resending bool
	after     int64
	timer     *time.Timer
	stopped   atomic.Bool
	failing   int // rounds failed in a row, for the log line when one succeeds again
}

func (a *relayActor) Receive(c actor.Context) {
	r := a.r
	switch m := c.Message().(type) {
	case *actor.Started:
		a.backoff = &supervision.Backoff{Policy: r.cfg.policy, OnRestart: a.onRestart,
			PolicyFor: func(reason any) supervision.Policy { return r.cfg.policy.ForFault(a.fault(reason)) }}
		a.worker = c.Spawn(actor.PropsFromProducer(func() actor.Actor { return &worker{r: r} }))
		a.due, a.resending = true, true
		a.arm(c)
		a.round(c)
	case tickMsg:
		if a.stopped.Load() {
			return
		}
		a.due = true
		a.round(c)
		a.arm(c)
	case wakeMsg:
		r.wakePending.Store(false)
		a.due = true
		a.round(c)
	case *roundDone:
		a.busy = false
		a.resending, a.after = m.resending, m.after
		switch {
		case m.err != nil:
			a.roundFailed(m.err)
			a.due = true // waits in the failed worker's mailbox until its restart
		case a.failing > 0:
			r.o.cfg.log.Info("rowactor/outbox: relay rounds succeed again", slog.String("outbox", r.o.t.Name),
				slog.Int("failures", a.failing))
			a.failing = 0
		}
		if m.more {
			a.due = true
		}
		a.round(c)
	case *actor.Stopping:
		a.stopped.Store(true)
		if a.timer != nil {
			a.timer.Stop()
		}
	case *actor.Stopped:
		close(r.done)
	}
}

func (a *relayActor) round(c actor.Context) {
	if a.busy || !a.due || a.stopped.Load() || a.r.stopping.Load() {
		return
	}
	a.busy, a.due = true, false
	c.Send(a.worker, &roundMsg{resending: a.resending, after: a.after})
}

// arm schedules the next poll with a plain AfterFunc (Proto.Actor's scheduler's cancel
// races under -race).
func (a *relayActor) arm(c actor.Context) {
	sys, self := c.ActorSystem(), c.Self()
	a.timer = time.AfterFunc(a.r.cfg.poll, func() {
		if !a.stopped.Load() {
			sys.Root.Send(self, tickMsg{})
		}
	})
}

// HandleFailure makes the relay actor its worker's supervisor.
func (a *relayActor) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason, msg any) {
	a.backoff.HandleFailure(sys, sup, child, rs, reason, msg)
}

// fault names the fault behind a failed round (the worker panics with the round's error),
// which picks the restart policy: a lost connection backs off growing, contention retries
// soon, a missing table or column waits for an operator.
func (a *relayActor) fault(reason any) dialects.Fault {
	err, ok := reason.(error)
	if !ok {
		return dialects.FaultUnknown
	}
	return dialects.Classify(a.r.o.d, err)
}

// roundFailed logs a failed round by its fault: an operator must fix a schema fault, so
// it is an error that says where to look; the others clear by themselves.
func (a *relayActor) roundFailed(err error) {
	a.failing++
	f := a.fault(err)
	attrs := []any{slog.String("outbox", a.r.o.t.Name), slog.String("fault", f.String()),
		slog.Int("failures", a.failing), slog.Any("error", err)}
	switch f {
	case dialects.FaultSchema:
		a.r.o.cfg.log.Error("rowactor/outbox: relay round failed: a table, a column or a privilege is missing; "+
			"compare the outbox table with outbox.Schema (and the sink's table) and the role's grants. The relay retries slowly", attrs...)
	case dialects.FaultConnection:
		a.r.o.cfg.log.Warn("rowactor/outbox: relay round failed: the database connection is lost; the relay retries after a backoff", attrs...)
	default:
		a.r.o.cfg.log.Warn("rowactor/outbox: relay round failed; it is tried again after a backoff", attrs...)
	}
}

func (a *relayActor) onRestart(child *actor.PID, reason any, failures int, delay time.Duration) {
	a.r.o.cfg.log.Debug("rowactor/outbox: restarting the relay's worker after a failure", slog.String("outbox", a.r.o.t.Name),
		slog.String("fault", a.fault(reason).String()), slog.Int("failures", failures), slog.Duration("delay", delay),
		slog.Any("reason", reason))
}

// worker runs rounds. It keeps no state worth keeping across a restart: the relay actor
// holds the start-up pass's progress, and the table holds the rest.
type worker struct{ r *Relay }

func (w *worker) Receive(c actor.Context) {
	m, ok := c.Message().(*roundMsg)
	if !ok {
		return
	}
	done := w.round(m)
	if done.err != nil && (w.r.ctx.Err() != nil || w.r.stopping.Load()) {
		done.err = nil // stopped mid-round: not a failure
	}
	c.Send(c.Parent(), done)
	if done.err != nil {
		panic(done.err) // the relay actor restarts this worker after its backoff
	}
}

// round sends one batch. The start-up pass walks unprocessed records by id; afterwards
// each round reads unsent records from the start, since a record with a lower id may
// commit after one with a higher id.
func (w *worker) round(m *roundMsg) *roundDone {
	r := w.r
	done := &roundDone{resending: m.resending, after: m.after}
	var (
		recs []dialects.OutboxRecord
		err  error
	)
	if m.resending {
		recs, err = r.o.store.Unprocessed(r.ctx, m.after, r.cfg.batch)
	} else {
		recs, err = r.o.store.Unsent(r.ctx, r.cfg.batch)
	}
	if err != nil {
		done.err = err
		return done
	}
	for _, rec := range recs {
		if r.stopping.Load() {
			return done
		}
		if err := w.send(rec); err != nil {
			done.err = err
			return done
		}
		if m.resending {
			done.after = rec.ID
		}
	}
	if m.resending && len(recs) < r.cfg.batch {
		done.resending = false // the pass is over; unsent records next, at once
	}
	done.more = m.resending || len(recs) == r.cfg.batch
	return done
}

// send hands one record to the sink, then stamps it sent.
func (w *worker) send(rec dialects.OutboxRecord) error {
	r := w.r
	headers, err := rowheaders.Decode(rec.Headers)
	if err != nil {
		// Refusing would block every later record behind this one for good.
		r.o.cfg.log.Warn("rowactor/outbox: the record's headers column is malformed; it is sent with what could be read",
			slog.String("outbox", r.o.t.Name), slog.Int64("record", rec.ID), slog.Any("error", err))
	}
	if headers == nil {
		headers = make(map[string]string, 2)
	}
	headers[IDHeader] = strconv.FormatInt(rec.ID, 10)
	headers[TableHeader] = r.o.t.Name
	// The record's own trace context (its traceparent, from the request that recorded it)
	// is the parent of what the sink does: a QueueSink's publish span is its child, and
	// the publish writes its own traceparent, of that trace, for the consumer. Without it
	// the publish would start a trace of its own and write it over the record's.
	ctx := propagation.TraceContext{}.Extract(r.ctx, propagation.MapCarrier(headers))
	if err := r.sink.Send(ctx, Record{ID: rec.ID, Topic: rec.Topic, Payload: rec.Payload, Headers: headers}); err != nil {
		return fmt.Errorf("send record %d of %s: %w", rec.ID, r.o.t.Name, err)
	}
	if err := r.o.store.MarkSent(r.ctx, rec.ID, r.o.cfg.now()); err != nil {
		return fmt.Errorf("stamp record %d of %s sent: %w", rec.ID, r.o.t.Name, err)
	}
	r.sent.Add(1) // once stamped, as Sent says: a reader then finds the stamp
	return nil
}
