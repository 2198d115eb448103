package actors

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/rowactor/rowactor/claimer"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/deadline"
	"github.com/rowactor/rowactor/internal/telemetry"
	"github.com/rowactor/rowactor/leaserenewer"
	"github.com/rowactor/rowactor/settler"
	"github.com/rowactor/rowactor/supervision"
)

// Handler handles one claimed row, with the transaction lent to it in transactional mode
// (nil otherwise). Beside its outcome it returns a tag, handed back in the Result.
type Handler func(ctx context.Context, row dialects.Row, tx dialects.DeliveryTx) (settler.Outcome, any)

// Config is a subscription's runtime configuration; the root package checked it.
type Config struct {
	Table      string // the queue table, for logs
	QueueName  string // the queue (group) name, for logs
	DeadLetter string // where spent rows go, for logs
	// DeadLetterTable says DeadLetter names a table (else a group).
	DeadLetterTable bool
	Form            dialects.Form
	// Queue serves Form.
	Queue   dialects.Queue
	Workers int
	// Prefetch is how many claimed rows may wait for a worker beyond Workers (lease form;
	// the root package refuses it elsewhere). Their leases are renewed while they wait.
	Prefetch int
	// AutoPrefetch sizes the waiting room from what the subscription measures (room.go)
	// instead of Prefetch.
	AutoPrefetch bool
	// BatchHandler, when set, makes each delivery a batch of up to BatchSize rows of the
	// row lock form, claimed in one transaction and settled in one commit; each batch
	// takes one worker. Handler is not used then.
	BatchHandler BatchHandler
	BatchSize    int
	// FIFO: the table's groups are ordered, so a claim takes the group's head alone, one
	// claim at a time.
	FIFO bool
	// KeyOf, when set, names each row's partition key: rows of one key are handled one at
	// a time in claim order, rows of different keys side by side (WorkersByKey).
	KeyOf func(dialects.Row) string
	Lease time.Duration
	Poll  time.Duration
	// IdlePoll, when set, polls the subscription with the other idle subscriptions of its
	// table, in one probe, instead of by a timer of its own (idlepoll.go).
	IdlePoll *IdlePoll
	Rules    settler.Rules
	Handler  Handler
	Now      func() time.Time
	Log      *slog.Logger
	// OnSettled, if set, is told what became of every delivery.
	OnSettled func(Result)
	Policy    supervision.Policy
	// Classify names the fault behind a claimer's or renewer's failure, which picks the
	// restart policy and the log level; nil treats every failure as FaultUnknown.
	Classify func(error) dialects.Fault
	// Culprit names the constraint or column a failed statement's error blames, for logs
	// (nil: none is named).
	Culprit func(error) dialects.Culprit
	// settleTimeout bounds each settlement and release statement; Start sets it.
	settleTimeout time.Duration
	// Limits bounds the connections the subscription holds and its claims in flight.
	Limits dialects.Limits
	// Dispatcher runs every mailbox and handler of the subscription.
	Dispatcher *Dispatcher
	// Transactional lends each delivery a transaction.
	Transactional bool
	// Timeout is each handler's deadline from its start (0: none); a handler may move its
	// own (timeout.go).
	Timeout time.Duration
	// Telemetry records the subscription's spans and metrics.
	Telemetry *telemetry.Sub

	// ctx bounds the subscription's statements; book holds its leases. Start sets both.
	ctx  context.Context
	book *leaserenewer.Book
}

// Subscription is a running subscription's handle.
type Subscription struct {
	cfg  Config
	sys  *actor.ActorSystem
	pid  *actor.PID
	done chan struct{} // closed when the subscription actor stopped

	stopStatements context.CancelFunc
	handlerCtx     context.Context
	handlers       *deadline.Group // of handlerCtx
	stopHandlers   func()
	// waits bounds a settlement's wait for a row another session holds: Stop ends it
	// first (Shutdown's context has ended, or the drain is done), so that such a wait
	// cannot hold the stop up; the settlement is cut short and reported ErrClosed, and
	// its row returns when its lease runs out (see waitEnded).
	waits     context.Context
	stopWaits context.CancelFunc

	// mb is the subscription actor's mailbox, where its deliveries' first runs may wait
	// (mailbox.deferStart).
	mb mailbox

	// batcher gathers the lease form's acks and releases (nil when the queue cannot
	// batch, and in transactional mode).
	batcher *settler.Batcher
	// poison is the record of rows set aside, shared by the claimers (poison.go).
	poison *claimer.Poison

	// claimCfg is what the claimers are spawned with, and what a settling row lock
	// delivery claims with (chain.go); set as the subscription actor starts.
	claimCfg claimer.Config
	// severalWorkers says the subscription has more than one worker: only then does a
	// settling row lock delivery claim its worker's next row (chain.go).
	severalWorkers atomic.Bool

	// The handoff of claims (handoff.go).
	handMu     sync.Mutex
	handClosed bool
	inHand     map[*claimer.Claimed]struct{}

	wakePending atomic.Bool
	// warnedFailNoDelay and warnedSnooze: the table's missing retry_after was logged for
	// a Fail, for a Snooze (outcome.go).
	warnedFailNoDelay, warnedSnooze atomic.Bool

	// book holds the deliveries in work by row id, for Cancel (cancel.go); batchBook the
	// batches in work, under each of their rows' ids.
	book      inWorkBook[delivery]
	batchBook inWorkBook[batchDelivery]
	// claiming mirrors the claims in flight, whose rows the book and the backlog do not
	// show yet, and claimsDone counts the claims whose rows were taken in: a Cancel that
	// found the row held by nobody it knows looks again while a claim may hold it unseen.
	claiming   atomic.Int64
	claimsDone atomic.Uint64
	// givingBack counts the rows of the measured room being given back for other
	// consumers (strand.go): out of the backlog, in no book, and still held until their
	// release commits, so a Cancel looks again while it is not 0. Each ends by adding to
	// claimsDone, so that a Cancel that looked before the release committed looks again.
	givingBack atomic.Int64

	inWork   atomic.Int64
	released atomic.Int64
	closed   atomic.Int64
}

// batchMax is the most rows one batched settlement statement writes.
const batchMax = 128

// Start spawns a subscription actor named name and its claimer (and renewer).
func Start(sys *actor.ActorSystem, name string, cfg Config) (*Subscription, error) {
	if cfg.settleTimeout <= 0 {
		cfg.settleTimeout = statementTimeout
	}
	if cfg.Dispatcher == nil {
		return nil, errors.New("rowactor: a subscription needs a dispatcher")
	}
	s := &Subscription{sys: sys, done: make(chan struct{}), poison: newPoison(&cfg)}
	cfg.ctx, s.stopStatements = context.WithCancel(context.Background())
	// A handler cut off by the stop reads ErrClosed as its context's cause, whichever
	// comes first: its own delivery's stop, or this one when the stop's budget ran out.
	var stopHandlers context.CancelCauseFunc
	s.handlerCtx, stopHandlers = context.WithCancelCause(context.Background())
	s.handlers = deadline.NewGroup(s.handlerCtx)
	s.stopHandlers = func() { stopHandlers(settler.ErrClosed) }
	s.waits, s.stopWaits = context.WithCancel(cfg.ctx)
	if cfg.Form == dialects.FormLease {
		cfg.book = leaserenewer.NewBook()
	}
	s.cfg = cfg
	if bq, ok := cfg.Queue.(dialects.LeaseBatchQueue); ok && cfg.Form == dialects.FormLease && !cfg.Transactional {
		// FIFO groups and partition keys start a row once an earlier one settled: a
		// leader waiting for more settlements would delay each of them.
		linger := !cfg.FIFO && cfg.KeyOf == nil
		s.batcher = settler.NewBatcher(s.waits, bq, batchMax, cfg.settleTimeout, linger)
		s.batcher.SpawnLeadersWith(cfg.Dispatcher.Schedule)
	}
	s.severalWorkers.Store(cfg.Workers > 1)
	pid, err := sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &subscriptionActor{s: s, workers: cfg.Workers} },
		actor.WithDispatcher(cfg.Dispatcher), actor.WithMailbox(func() actor.Mailbox { return &s.mb })), name)
	if err != nil {
		s.stopStatements()
		s.stopHandlers()
		s.stopWaits()
		return nil, err
	}
	s.pid = pid
	return s, nil
}

// Wake makes the subscription claim now rather than at its next poll. Wakes that arrive
// while one is pending cost one atomic operation.
func (s *Subscription) Wake() {
	if s.wakePending.CompareAndSwap(false, true) {
		s.sys.Root.Send(s.pid, wakeMsg{})
	}
}

// SetWorkers changes how many deliveries may be in work. Deliveries in work are kept.
func (s *Subscription) SetWorkers(n int) { s.sys.Root.Send(s.pid, setWorkersMsg{n}) }

// Pause stops claiming; deliveries in work go on and settle, and claimed rows that had
// not started go back to the queue. It returns once the subscription stopped claiming
// (a claim already in flight still delivers its rows).
func (s *Subscription) Pause(ctx context.Context) error {
	return s.ask(ctx, func(ch chan struct{}) any { return pauseMsg{ch} })
}

// Resume claims again after Pause.
func (s *Subscription) Resume(ctx context.Context) error {
	return s.ask(ctx, func(ch chan struct{}) any { return resumeMsg{ch} })
}

func (s *Subscription) ask(ctx context.Context, msg func(chan struct{}) any) error {
	ch := make(chan struct{})
	s.sys.Root.Send(s.pid, msg(ch))
	select {
	case <-ch:
		return nil
	case <-s.done:
		return errors.New("rowactor: the subscription has stopped")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// InWork is the number of deliveries in work.
func (s *Subscription) InWork() int { return int(s.inWork.Load()) }

// Drain stops claiming: no handler starts from then on. It returns the drain in progress.
func (s *Subscription) Drain() Draining {
	ch := make(chan struct{})
	s.sys.Root.Send(s.pid, &drainMsg{done: ch})
	return Draining{done: ch, s: s}
}

// Draining is a subscription's drain in progress.
type Draining struct {
	// done closes when no delivery is in work and no claim is in flight.
	done <-chan struct{}
	s    *Subscription
}

// Wait waits until the drain is done, or ctx ends, and reports whether every delivery
// given to a handler settled. When ctx ends before done closes, it asks the subscription
// actor (which answers at once: handlers run elsewhere) whether a delivery is still in
// work: rows claimed but never handed to a handler (a claim in flight, rows given back as
// the drain began) are not, and Shutdown releases them either way.
func (d Draining) Wait(ctx context.Context) bool {
	select {
	case <-d.done:
		return true
	case <-ctx.Done():
	}
	reply := make(chan int, 1)
	d.s.sys.Root.Send(d.s.pid, handlingMsg{reply: reply}) // after the drainMsg: no handler starts any more
	select {
	case n := <-reply:
		return n == 0
	case <-d.s.done:
		return d.s.inWork.Load() == 0
	}
}

// Stop stops the subscription actor, releasing every row still in work (each release
// bounded by the settle timeout; a handler still running has its context ended and, in
// transactional mode, its transaction ended under it), waits for it until ctx ends, and
// then cancels the handlers' context: a handler that returns afterwards finds its row
// released and its settlement refused. Settlements waiting for rows other sessions hold
// end first, reported ErrClosed: the caller's drain is over (Shutdown's context ended),
// and such a wait may last as long as the other session (see waits). When ctx ends
// first, the statements still running are cancelled: a connection cut off mid-statement
// is closed, which ends its locks and keys, and a lease is left to run out (it is fenced
// by its token).
func (s *Subscription) Stop(ctx context.Context) error {
	s.stopWaits()
	// A claim in flight as the actor stops is left to finish (each is bounded by the
	// claimer's deadline): cancelling it could end a claim statement that committed
	// unseen (a lease claim), leaving its rows leased to nobody. Its rows are released
	// through the handoff instead.
	s.sys.Root.Stop(s.pid)
	defer s.stopStatements()
	defer s.stopHandlers()
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return errors.Join(errors.New("rowactor: subscription did not stop in time"), ctx.Err())
	}
}

// Released is how many rows were given back unsettled, and how many session connections
// were closed, over the subscription's life.
func (s *Subscription) Released() (rows, connections int) {
	return int(s.released.Load()), int(s.closed.Load())
}

func (s *Subscription) call(ctx context.Context, row dialects.Row, tx dialects.DeliveryTx) (settler.Outcome, any, any) {
	return callHandler(ctx, s.cfg.Handler, row, tx, s.cfg.Log, s.cfg.Table)
}

type (
	wakeMsg       struct{}
	tickMsg       struct{}
	budgetMsg     struct{}
	recheckMsg    struct{}
	setWorkersMsg struct{ n int }
	drainMsg      struct{ done chan struct{} }
	handlingMsg   struct{ reply chan<- int }
	pauseMsg      struct{ done chan struct{} }
	resumeMsg     struct{ done chan struct{} }
)

func (wakeMsg) IgnoreDeadLetterLogging()       {}
func (tickMsg) IgnoreDeadLetterLogging()       {}
func (budgetMsg) IgnoreDeadLetterLogging()     {}
func (recheckMsg) IgnoreDeadLetterLogging()    {}
func (setWorkersMsg) IgnoreDeadLetterLogging() {}
func (*drainMsg) IgnoreDeadLetterLogging()     {}
func (handlingMsg) IgnoreDeadLetterLogging()   {}
func (pauseMsg) IgnoreDeadLetterLogging()      {}
func (resumeMsg) IgnoreDeadLetterLogging()     {}

// subscriptionActor keeps up to workers deliveries in work. It keeps a claim in flight
// for each free worker (as far as the dialect's limits allow), each on a claimer actor of
// its own, and spawns a delivery actor per claimed row. After a claim that came back
// short it probes with one claim at a time until a claim fills again, and waits for the
// poll interval or a wake before claiming at all.
type subscriptionActor struct {
	s        *Subscription
	claimers []*actor.PID // every claimer spawned, busy or idle
	// chainer is a row lock delivery that freed its worker and waits to hear whether it
	// claims the worker's next row as it settles (chain.go), while its chainFreeMsg is
	// handled; nil otherwise.
	chainer *actor.PID
	// chainsInFlight is how many of the claims in flight settling deliveries make.
	chainsInFlight int
	idle           []*actor.PID
	renewer        *actor.PID
	backoff        *supervision.Backoff
	workers        int
	inFlight       int // claims in flight
	// busy counts deliveries that take a worker: spawned, and neither settled nor (lease
	// form, batched) past their handler. inWork counts rows held until settled.
	busy int
	// handling counts the deliveries (and batches) spawned to run their handler, until
	// settled: what a drain waits for.
	handling int
	// backlog holds claimed rows waiting for a worker (Prefetch) or, with KeyOf, for
	// their key's previous row; in claim order.
	backlog []waiting
	// toldBacklog is the backlog's length the batcher was last told (noteBacklog).
	toldBacklog int
	// keys counts the deliveries in work per partition key (KeyOf).
	keys     map[string]int
	paused   bool
	asked    int // rows asked for by the claims in flight
	due      bool
	probing  bool
	draining chan struct{}
	timer    *time.Timer
	// recheck, with IdlePoll, claims again a poll after a claim found the pool's budget
	// spent (recheckBudget).
	recheck *time.Timer
	stopped atomic.Bool
	// failed holds the claimers (by PID id) whose last claim failed: they wait for their
	// supervisor's restart. parked counts the pings in flight sent to them (answered once
	// restarted), which a drain does not wait for.
	failed map[string]bool
	parked int
	// wakes counts the wakes and polls received; a claim carries the count it was sent
	// at, so a short claim tells whether one came while it ran.
	wakes uint64
	// share is the subscription's part of its pool's connection budget.
	share   *dialects.BudgetShare
	failing int // claims failed in a row, for the log line when they succeed again
	// room sizes the rows that wait for a worker (AutoPrefetch).
	room roomSizer
	// strandTimer looks, strandAfter after it was set while rows waited in the measured
	// room, whether any worker freed meanwhile; stranded says rows were given back for
	// want of one, and keeps the room empty until a worker frees (strand.go). claimAt is
	// when the claim whose rows are being held came back.
	strandTimer *time.Timer
	stranded    bool
	claimAt     time.Time
	// freed counts the workers freed; strandFreed is its value when the strand timer
	// was set: a worker freed since means the workers are not stuck.
	freed, strandFreed uint64
	// kept holds the advisory candidates read and not tried, for the claimers' next
	// claims (nil: none are kept).
	kept *claimer.Kept
	// deliveryProps spawns every delivery actor; spawning is the delivery its producer
	// hands over (spawnDelivery).
	deliveryProps *actor.Props
	spawning      *delivery
}

// stopAtOnce is an actor that stops as it starts.
type stopAtOnce struct{}

func (stopAtOnce) Receive(c actor.Context) {
	if _, ok := c.Message().(*actor.Started); ok {
		c.Stop(c.Self())
	}
}

func (a *subscriptionActor) Receive(c actor.Context) {
	defer a.survive(c)
	a.receive(c)
	a.noteBacklog()
}

// noteBacklog tells the batcher how many rows wait for a worker when that changed: a
// batch leader waits for their settlements (settler.Batcher.SetBacklog).
func (a *subscriptionActor) noteBacklog() {
	if b := a.s.batcher; b != nil && len(a.backlog) != a.toldBacklog {
		a.toldBacklog = len(a.backlog)
		b.SetBacklog(a.toldBacklog)
	}
}

// receive hands each message to the step that handles its kind.
func (a *subscriptionActor) receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		a.onStarted(c)
	case tickMsg:
		a.onTick(c)
	case wakeMsg:
		a.onWake(c)
	case *claimer.Claimed:
		a.onClaimed(c, m)
	case workerFreeMsg:
		a.onWorkerFree(c, m.d, false)
	case chainFreeMsg:
		a.onWorkerFree(c, m.d, true)
	case *settledMsg:
		a.onSettled(c, *m)
	case setWorkersMsg:
		a.workers = max(m.n, 1) // the root package refuses fewer than one
		a.s.severalWorkers.Store(a.workers > 1)
		a.startBacklog(c)
		a.claim(c)
	case pauseMsg:
		a.onPause(c, m)
	case resumeMsg:
		a.onResume(c, m)
	case *drainMsg:
		a.draining = m.done
		a.releaseBacklog(c)
		a.checkDrained()
	case handlingMsg:
		m.reply <- a.handling
	case cancelWaitingMsg:
		m.found <- a.cancelWaiting(c, m.id, m.req)
	case budgetMsg:
		a.claim(c)
		a.share.Unused() // handed over while waiting, and not needed after all
	case strandMsg:
		a.onStrand(c)
	case recheckMsg:
		a.recheck = nil
		a.claim(c)
	case *actor.Stopping:
		a.onStopping()
	case *actor.Stopped:
		a.s.closeHandoff()
		a.share.Close()
		close(a.s.done)
	}
}

// onStarted sets the subscription up: its pool budget share, its claimers' supervision,
// the renewer of its leases (lease form) and its poll timer; then it claims.
func (a *subscriptionActor) onStarted(c actor.Context) {
	cfg := &a.s.cfg
	sys, self := c.ActorSystem(), c.Self()
	a.failed = map[string]bool{}
	a.share = newShare(cfg.Limits.Budget, func() { sys.Root.Send(self, budgetMsg{}) })
	a.backoff = &supervision.Backoff{Policy: cfg.Policy, Decide: a.decide, OnRestart: a.onRestart,
		PolicyFor: func(reason any) supervision.Policy { return cfg.Policy.ForFault(a.fault(reason)) }}
	if cfg.Form == dialects.FormLease {
		a.renewer = c.Spawn(leaserenewer.Props(leaserenewer.Config{
			Queue: cfg.Queue.(dialects.LeaseQueue), Book: cfg.book, Lease: cfg.Lease, Now: cfg.Now, Log: cfg.Log, Ctx: a.s.cfg.ctx, Waits: a.s.waits,
			Dispatcher: cfg.Dispatcher,
			OnRound:    func(extended, lost int, _ error) { cfg.Telemetry.Renewed(cfg.ctx, extended, lost) }}))
	}
	if cfg.Form == dialects.FormAdvisory && !cfg.FIFO && cfg.KeyOf == nil {
		a.kept = new(claimer.Kept) // claims that follow claim order to the row read afresh
	}
	a.s.claimCfg = claimer.Config{Queue: cfg.Queue, Form: cfg.Form, Lease: cfg.Lease, Now: cfg.Now, Ctx: a.s.cfg.ctx,
		Timeout: cfg.settleTimeout, Handoff: a.s.handoff,
		Dispatcher: cfg.Dispatcher, Transactional: cfg.Transactional, Poison: a.s.poison,
		Kept: a.kept}
	a.due, a.probing = true, true
	if cfg.IdlePoll == nil {
		a.arm(c)
	}
	a.claim(c)
}

// onTick is the poll: rows may be due, so the subscription claims, and arms the next
// poll unless the table's idle poll polls for it.
func (a *subscriptionActor) onTick(c actor.Context) {
	if a.stopped.Load() {
		return
	}
	a.wakes++
	a.due = true
	a.claim(c)
	if a.s.cfg.IdlePoll == nil {
		a.arm(c)
	}
}

// onWake claims at once: a row was published or freed.
func (a *subscriptionActor) onWake(c actor.Context) {
	a.s.wakePending.Store(false)
	a.wakes++
	a.due = true
	a.claim(c)
}

// onClaimed takes in a claimer's answer: its rows are held (or its batch started), and
// the claim's outcome decides whether the next claim is due.
func (a *subscriptionActor) onClaimed(c actor.Context, m *claimer.Claimed) {
	if a.stopped.Load() || !a.s.takeClaimed(m) {
		return // the stop releases it (handoff.go)
	}
	a.inFlight--
	if m.Parked {
		a.onUnparked(c)
		return
	}
	if m.Chained {
		// A settling delivery's claim (chain.go): no claimer to count failed or idle.
		a.chainsInFlight--
	} else if m.Err != nil {
		a.failed[c.Sender().Id] = true
	} else {
		delete(a.failed, c.Sender().Id)
	}
	a.share.Give(m.Conns - a.connsHeld(m))
	got := a.takeRows(c, m)
	a.s.claimsDone.Add(1) // held, in the backlog or the book: a Cancel finds them
	a.s.claiming.Store(int64(a.inFlight))
	a.afterClaim(c, m, got)
	if !m.Chained {
		a.idle = append(a.idle, c.Sender())
	}
	a.claim(c)
	a.checkDrained()
}

// onUnparked handles a failed claimer's answer to its ping: it was restarted, and claims
// go on.
func (a *subscriptionActor) onUnparked(c actor.Context) {
	a.s.claiming.Store(int64(a.inFlight))
	a.parked--
	delete(a.failed, c.Sender().Id)
	a.idle = append(a.idle, c.Sender())
	a.claim(c)
	a.checkDrained()
}

// takeRows takes in a claim's rows: a batch starts at once, single rows are held for a
// worker. It returns how many rows the claim took, those set aside included.
func (a *subscriptionActor) takeRows(c actor.Context, m *claimer.Claimed) int {
	cfg := &a.s.cfg
	got := len(m.Claims)
	if cfg.BatchHandler != nil {
		a.asked-- // a batch claim asks for one worker
		if m.Batch != nil {
			got = len(m.Batch.Rows())
			a.startBatch(c, m.Batch)
		}
	} else {
		a.asked -= m.Limit
	}
	got += a.setAside(m)
	cfg.Telemetry.Claimed(cfg.ctx, m.Took, got)
	if m.Err == nil && !m.Chained { // a chained claim's time is its settlement's too
		a.room.claimed(m.Took)
	}
	if len(m.Claims) > 0 && a.strandsRows() {
		a.claimAt = time.Now()
	}
	for _, cl := range m.Claims {
		a.hold(c, cl)
	}
	return got
}

// afterClaim decides from a claim's outcome, got rows of those it asked for, whether the
// next claim is due and whether the subscription probes (one claim at a time).
func (a *subscriptionActor) afterClaim(c actor.Context, m *claimer.Claimed, got int) {
	cfg := &a.s.cfg
	switch {
	case m.Err != nil:
		a.claimFailed(m.Err)
		// Requests to a failed claimer wait in its suspended mailbox until its restart:
		// probing keeps one of them in flight.
		a.due, a.probing = true, true
	case got < m.Limit:
		a.claimSucceeded()
		a.room.ranDry()
		// The queue ran short as this claim read it. A wake or a poll that came
		// while it ran may be for a row it could not see (published after it read
		// the table): then one more claim finds out, else the queue waits for the
		// next wake or poll.
		a.due, a.probing = a.wakes != m.Wakes, true
		if !a.due && cfg.IdlePoll != nil {
			cfg.IdlePoll.wait(a.s, c.Self(), cfg.QueueName)
		}
	default:
		a.claimSucceeded()
		a.probing = false
	}
}

// onWorkerFree takes back the worker of a delivery that is past its handler but not yet
// settled (lease form, batched settlement).
func (a *subscriptionActor) onWorkerFree(c actor.Context, d *delivery, chains bool) {
	a.room.freed(d.workTook, d.roomGen)
	a.busy--
	a.freed++
	a.stranded = false
	if chains {
		if a.probing || !a.share.Keeps() {
			// The queue ran short, or another subscription on the pool waits for a
			// connection: the delivery settles alone, and gives its connection back.
			c.Send(d.self, soloMsg{})
		} else {
			a.chainer = d.self // the first claim for a free worker goes to it (takeConns)
			// No claim for it, or a panic below: it settles alone. Either way it is
			// answered, or it would wait for ever with its row locked.
			defer a.answerChainer(c)
		}
	}
	a.startBacklog(c)
	a.claim(c)
}

// answerChainer tells the delivery offered to claim (onWorkerFree) that no claim came
// for it.
func (a *subscriptionActor) answerChainer(c actor.Context) {
	if a.chainer != nil {
		c.Send(a.chainer, soloMsg{})
		a.chainer = nil
	}
}

// onSettled counts a settled delivery out: its rows, its connection, its worker (unless
// freed before), its drain count and its partition key; then the backlog and the claims
// go on.
func (a *subscriptionActor) onSettled(c actor.Context, m settledMsg) {
	a.s.inWork.Add(-int64(max(m.rows, 1)))
	if (a.holdsConnections() || a.s.cfg.BatchHandler != nil) && !m.connPassed {
		a.share.Give(1) // the delivery's claim transaction, session or transaction
	}
	if !m.workerFreed {
		a.busy--
		a.freed++
		a.stranded = false
		if m.d != nil {
			a.room.freed(m.d.workTook, m.d.roomGen)
		}
	}
	if m.handled {
		a.handling--
	}
	if m.keyed {
		if a.keys[m.key]--; a.keys[m.key] <= 0 {
			delete(a.keys, m.key)
		}
	}
	a.startBacklog(c)
	if m.freed {
		// One claim to find out; like a wake, it also keeps a claim in flight that
		// comes back short from clearing it (that claim may have read the table
		// before the row was freed).
		a.wakes++
		a.due = true
	}
	a.claim(c)
	a.checkDrained()
}

// onPause stops claiming and gives back the rows that never started.
func (a *subscriptionActor) onPause(c actor.Context, m pauseMsg) {
	a.paused = true
	a.releaseBacklog(c) // rows that never started go back to the queue
	close(m.done)
}

// onResume claims again after a pause.
func (a *subscriptionActor) onResume(c actor.Context, m resumeMsg) {
	a.paused = false
	a.room.ranDry() // the rows after a pause are measured afresh
	a.due, a.probing = true, true
	a.claim(c)
	close(m.done)
}

// onStopping stops claiming and polling and releases the rows still waiting for a worker.
func (a *subscriptionActor) onStopping() {
	a.stopped.Store(true)
	if a.s.cfg.IdlePoll != nil {
		a.s.cfg.IdlePoll.leave(a.s)
	}
	a.releaseBacklogNow()
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.recheck != nil {
		a.recheck.Stop()
	}
	if a.strandTimer != nil {
		a.strandTimer.Stop()
	}
}

// claim starts claims while there may be due rows, a worker is free, and the limits
// allow another claim in flight and the connections it needs.
func (a *subscriptionActor) claim(c actor.Context) {
	cfg := &a.s.cfg
	for a.draining == nil && !a.paused && !a.stopped.Load() && a.due {
		free := a.workers + a.waitRoom() - a.busy - len(a.backlog) - a.asked
		maxInFlight := a.maxClaimsInFlight()
		// A settling delivery's claim (chain.go) is its worker's, and may wait as long as
		// its settlement: it holds no other claim back.
		if free <= 0 || a.inFlight-a.chainsInFlight >= maxInFlight {
			return
		}
		if batch := a.claimBatch(); free < batch && (a.inFlight > 0 || a.backlogCovers()) {
			// A claim is in flight: when it returns, its answer claims again for every
			// worker freed meanwhile, in one claim. Or the rows waiting keep the workers
			// busy for longer than a claim takes: the next delivery to end claims again,
			// for more rows. Waiting for anything else (more settlements, the poll) could
			// leave a free worker idle while rows are due.
			return
		}
		if cfg.BatchHandler != nil {
			// A batch holds one connection from its claim to its commit.
			if !a.takeConns(c, &claimer.Request{Limit: cfg.BatchSize, Batch: true}, 1) {
				return
			}
			continue
		}
		req, conns := a.rowRequest(free, maxInFlight)
		if !a.takeConns(c, req, conns) {
			return
		}
	}
}

// maxClaimsInFlight is how many claims may be in flight at once.
func (a *subscriptionActor) maxClaimsInFlight() int {
	cfg := &a.s.cfg
	maxInFlight := cfg.Limits.ClaimsInFlight
	if maxInFlight <= 0 {
		maxInFlight = a.workers
	}
	if a.probing || cfg.KeyOf != nil || cfg.FIFO {
		maxInFlight = 1 // with partition keys or FIFO groups, one claim at a time keeps claim order
	} else if cfg.AutoPrefetch && a.waitRoom() > 0 {
		// Rows wait ahead of the workers: two claims in flight keep them coming (one
		// runs while the other's rows are handed out), and more would only split the
		// same rows into smaller claims, each a statement and a commit.
		maxInFlight = min(maxInFlight, 2)
	}
	return maxInFlight
}

// rowRequest builds the claim of rows (not a batch) for free workers, and returns it
// with the connections it needs from the pool's budget.
func (a *subscriptionActor) rowRequest(free, maxInFlight int) (*claimer.Request, int) {
	cfg := &a.s.cfg
	limit := free
	if cfg.Form == dialects.FormRowLock || cfg.FIFO {
		limit = 1 // row lock: one transaction, one connection, one row; FIFO: the head
	}
	req := &claimer.Request{Limit: limit}
	if cfg.Form == dialects.FormAdvisory && maxInFlight > 1 {
		// An advisory claim takes its rows one session at a time: claims of one row
		// each, side by side, each reading every free worker's worth of candidates
		// and starting at its own place in them.
		req.Limit, req.Scan, req.Offset = 1, free, a.inFlight
	}
	conns := 1 // a claim holds a connection while it runs
	if a.holdsConnections() {
		conns = req.Limit // and each row after it until settled: rows cost connections
	}
	return req, conns
}

// takeConns takes the connections a request needs from the pool's budget and sends it;
// with fewer than it asked for, a request whose rows each hold a connection asks for
// fewer rows. False means the budget had none: the subscription waits in its queue and
// claims again when connections are handed to it (budgetMsg).
func (a *subscriptionActor) takeConns(c actor.Context, req *claimer.Request, conns int) bool {
	if a.chainer != nil && !req.Batch {
		// A row lock delivery that freed its worker claims for it as it settles, on its
		// connection (chain.go): the claim takes the settling row's connection, which
		// the settlement then does not give back (settledMsg.connPassed).
		pid := a.chainer
		a.chainer = nil
		a.chainsInFlight++
		a.send(c, pid, req, conns, conns)
		return true
	}
	pid := a.claimerFor(c)
	if a.failed[pid.Id] {
		// The claimer failed and waits for its restart (a backoff of up to 30 s). Only a
		// ping is sent, which it answers once restarted: the claim is made then. The ping
		// holds no connection of the pool's budget, and a drain does not wait for it.
		a.inFlight++
		a.s.claiming.Store(int64(a.inFlight))
		a.parked++
		c.Send(pid, &claimer.Request{Parked: true, Wakes: a.wakes})
		return false
	}
	got := a.share.Take(conns)
	if got == 0 {
		a.idle = append(a.idle, pid)
		a.recheckBudget(c)
		return false
	}
	a.send(c, pid, req, conns, got)
	return true
}

// send sends a claim request to pid with got of the conns connections it needed.
func (a *subscriptionActor) send(c actor.Context, pid *actor.PID, req *claimer.Request, conns, got int) {
	if got < conns && !req.Batch {
		req.Limit = got
	}
	req.Conns, req.Wakes = got, a.wakes
	a.inFlight++
	a.s.claiming.Store(int64(a.inFlight))
	if req.Batch {
		a.asked++ // a batch claim asks for one worker
	} else {
		a.asked += req.Limit
	}
	c.Send(pid, req)
}

// connsHeld is how many of a claim's connections its rows keep until settled.
func (a *subscriptionActor) connsHeld(m *claimer.Claimed) int {
	switch {
	case a.s.cfg.BatchHandler != nil:
		if m.Batch != nil {
			return 1
		}
		return 0
	case a.holdsConnections():
		return len(m.Claims)
	}
	return 0
}

// claimBatch is the fewest rows worth a claim of its own while another claim is in
// flight. A lease claim is one statement and one commit whatever its size, so while the
// queue is backed up (the last claim came back full) workers freed during a claim wait
// for it to return and are claimed for together: claims come in batches rather than one
// per settlement, and the database commits less per message. A free worker never waits
// longer than the claim in flight (invariant: a free worker gets a due row within a poll,
// at once after the settlement that freed it). When the queue ran short (probing), rows
// are claimed as soon as a worker is free. An advisory claim on a queue that takes its
// rows together (SQLite) is likewise one read and one take; other claims hold a
// connection per row and gain nothing from waiting.
func (a *subscriptionActor) claimBatch() int {
	cfg := &a.s.cfg
	_, together := cfg.Queue.(dialects.TakesTogether)
	oneStatement := cfg.Form == dialects.FormLease || (cfg.Form == dialects.FormAdvisory && together)
	if !oneStatement || cfg.Transactional || a.probing || cfg.FIFO {
		return 1
	}
	return max((a.workers+a.waitRoom()+1)/2, 1)
}

// backlogCovers reports whether the rows waiting for a worker in the measured room keep
// the workers busy for longer than a claim takes (roomSizer.covers). Never with
// WorkersByKey: its backlog also holds rows waiting for an earlier row of their own key,
// which keep one worker busy, not all of them, so a burst of one key would hold back
// the claims of other keys' rows while workers sit idle.
func (a *subscriptionActor) backlogCovers() bool {
	return a.s.cfg.AutoPrefetch && a.s.cfg.KeyOf == nil && a.room.covers(len(a.backlog), a.workers)
}

// holdsConnections says whether each delivery in work holds a pool connection: its claim
// transaction (row lock), its key's session (advisory), or its own transaction (any form,
// transactional).
func (a *subscriptionActor) holdsConnections() bool {
	cfg := &a.s.cfg
	return cfg.Transactional || cfg.Form == dialects.FormRowLock || cfg.Form == dialects.FormAdvisory
}

// claimerFor returns an idle claimer, spawning one when all are busy.
func (a *subscriptionActor) claimerFor(c actor.Context) *actor.PID {
	for i := len(a.idle) - 1; i >= 0; i-- {
		// A healthy claimer first; one that failed only when no other is idle (spawning a
		// new one instead would skip its backoff).
		if pid := a.idle[i]; !a.failed[pid.Id] || i == 0 {
			a.idle = append(a.idle[:i], a.idle[i+1:]...)
			return pid
		}
	}
	pid := c.Spawn(claimer.Props(a.s.claimCfg))
	a.claimers = append(a.claimers, pid)
	return pid
}

// hold takes a claimed row into the subscription: its lease goes into the book (renewed
// from now on), and it starts on a free worker or waits in the backlog for one.
func (a *subscriptionActor) hold(c actor.Context, cl claimer.Claim) {
	cfg := &a.s.cfg
	if cfg.Form == dialects.FormLease {
		switch left := cl.Row.Token.Sub(cfg.Now()); {
		case left <= 0:
			// The claim came back after the lease it wrote ran out (it waited for the
			// database longer than a lease): another claim may hold the row already, so
			// its handler must not start. The row is due again, its attempt spent, as
			// after a crash.
			cfg.Log.Warn("rowactor: a claim returned after its lease ran out; the row is left to the next claim",
				slog.String("table", cfg.Table), slog.String("queue", cfg.QueueName), slog.Int64("id", cl.Row.ID),
				slog.Time("lease_until", cl.Row.Token))
			if a.holdsConnections() {
				a.share.Give(1)
			}
			a.due = true
			return
		}
		cl.Lease = cfg.book.Add(cl.Row.ID, cl.Row.Token)
		if left := cl.Row.Token.Sub(cfg.Now()); left < cfg.Lease/2 && a.renewer != nil {
			// Less than half a lease left: the renewer's next round may come too late.
			c.Send(a.renewer, leaserenewer.RenewNow{})
		}
	}
	a.s.inWork.Add(1)
	if a.draining != nil || a.paused {
		a.start(c, cl, true) // claimed as a drain or a pause began: give it back
		return
	}
	w := waiting{claim: cl, gen: a.room.gen, since: a.claimAt}
	if cfg.KeyOf != nil {
		key, kp := a.s.keyOf(cl.Row)
		if kp != nil {
			// The row cannot be placed among the keys: it goes back unstarted, and its next
			// claim sets it aside (poison.go), as a row whose settlement failed on its data;
			// the other rows go on.
			a.s.poison.Suspect(cl.Row.ID, kp)
			a.spawnDelivery(c, &delivery{sub: a.s, claim: cl, releaseOnly: true, keyPanic: kp})
			return
		}
		w.key = key
	}
	a.backlog = append(a.backlog, w)
	a.startBacklog(c)
}

// startBacklog starts waiting rows, in claim order, while workers are free; with
// partition keys a row whose key has a delivery in work keeps waiting, and rows of other
// keys behind it go first.
func (a *subscriptionActor) startBacklog(c actor.Context) {
	if a.draining != nil || a.paused {
		return
	}
	keyed := a.s.cfg.KeyOf != nil
	kept := a.backlog[:0]
	for i, w := range a.backlog {
		if a.busy >= a.workers {
			kept = append(kept, a.backlog[i:]...)
			break
		}
		if keyed {
			if a.keys[w.key] > 0 {
				kept = append(kept, w)
				continue
			}
			if a.keys == nil {
				a.keys = map[string]int{}
			}
			a.keys[w.key]++
		}
		if a.expiredWhileWaiting(c, w) {
			if keyed {
				if a.keys[w.key]--; a.keys[w.key] <= 0 {
					delete(a.keys, w.key)
				}
			}
			continue
		}
		a.startKeyed(c, w)
	}
	clear(a.backlog[len(kept):])
	a.backlog = kept
	a.armStrand(c)
}

// expiredWhileWaiting drops a row that waited for a worker until its lease ran out (the
// renewer could not extend it: the database stalled longer than a lease): another claim
// may hold it already, so its handler must not start (invariant: a row is handled by one
// lease holder at a time). The row is due again, its attempt spent, as after a crash.
// A lease with less than half its length left is renewed now.
func (a *subscriptionActor) expiredWhileWaiting(c actor.Context, w waiting) bool {
	cfg := &a.s.cfg
	if w.claim.Lease == nil {
		return false
	}
	now := cfg.Now()
	if !w.claim.Lease.Expired(now) {
		if w.claim.Lease.Left(now) < cfg.Lease/2 && a.renewer != nil {
			c.Send(a.renewer, leaserenewer.RenewNow{})
		}
		return false
	}
	cfg.Log.Warn("rowactor: a claimed row's lease ran out while it waited for a worker; the row is left to the next claim",
		slog.String("table", cfg.Table), slog.String("queue", cfg.QueueName), slog.Int64("id", w.claim.Row.ID))
	w.claim.Lease.Done()
	a.s.inWork.Add(-1)
	a.due = true
	return true
}

// waiting is a held row not yet started, with its partition key (WorkersByKey), read once.
type waiting struct {
	claim claimer.Claim
	key   string
	gen   uint64 // the room's generation when claimed (room.go)
	// since is when its claim came back (strand.go; zero where rows never strand).
	since time.Time
}

// startKeyed starts a waiting row on a worker; with WorkersByKey the row counts against
// its key until settled.
func (a *subscriptionActor) startKeyed(c actor.Context, w waiting) {
	a.spawnDelivery(c, &delivery{sub: a.s, claim: w.claim, key: w.key, keyed: a.s.cfg.KeyOf != nil, roomGen: w.gen})
}

// start spawns the delivery actor of a held row; releaseOnly gives the row back at once
// without calling the handler.
func (a *subscriptionActor) start(c actor.Context, cl claimer.Claim, releaseOnly bool) {
	a.spawnDelivery(c, &delivery{sub: a.s, claim: cl, releaseOnly: releaseOnly})
}

func (a *subscriptionActor) spawnDelivery(c actor.Context, d *delivery) {
	cfg := &a.s.cfg
	if d.releaseOnly || d.cancelOnly != nil {
		d.worker.Store(workerFreed) // it never took a worker
	} else {
		// In the book from here: a Cancel finds the row in the backlog or here, never
		// between the two.
		a.s.book.add(d.claim.Row.ID, d)
		d.inBook = true
		if b := a.s.batcher; b != nil {
			b.Expect(&d.batchReq) // a batch leader may wait for this row's settlement
		}
		d.spawned = time.Now()
		a.busy++
		a.handling++
	}
	if a.deliveryProps == nil {
		// One Props for every delivery: Spawn calls the producer at once, on this actor's
		// goroutine, so it hands over the delivery set just before. A Props per delivery
		// cost four allocations a row. A delivery actor is never restarted (decide stops
		// a failed one); were one, it would get an actor that stops itself.
		a.deliveryProps = actor.PropsFromProducer(func() actor.Actor {
			if d := a.spawning; d != nil {
				return d
			}
			return stopAtOnce{}
		}, actor.WithDispatcher(cfg.Dispatcher), actor.WithMailbox(func() actor.Mailbox {
			// Called after the producer, in the same Spawn: the mailbox is the delivery's.
			d := a.spawning
			a.spawning = nil
			if d == nil {
				return actor.Unbounded()()
			}
			d.mb.owner = d
			return &d.mb
		}))
	}
	a.spawning = d
	if !d.releaseOnly && d.cancelOnly == nil {
		a.s.mb.deferStart(&d.mb)
	}
	c.Spawn(a.deliveryProps) // posts Started, which takes startOn
}

// waitRoom is how many claimed rows may wait beyond the workers: Prefetch's, and with
// partition keys as many again as there are workers, so that a key with several rows
// does not stop the claims that find other keys.
func (a *subscriptionActor) waitRoom() int {
	room := a.s.cfg.Prefetch
	if a.s.cfg.AutoPrefetch && !a.stranded {
		room = a.room.size(a.workers)
	} else if a.s.cfg.AutoPrefetch {
		room = 0 // rows were given back: none is claimed ahead until a worker frees
	}
	if a.s.cfg.KeyOf != nil {
		room += a.workers
	}
	return room
}

// releaseBacklog gives the rows waiting for a worker back when a drain begins (Shutdown
// lets deliveries in work settle, and these never started) or the subscription pauses.
func (a *subscriptionActor) releaseBacklog(c actor.Context) {
	for _, w := range a.backlog {
		a.start(c, w.claim, true)
	}
	a.backlog = nil
}

// releaseBacklogNow releases the backlog as the subscription stops without a drain: no
// child can be spawned any more, so the releases run here, each bounded by the settle
// timeout.
func (a *subscriptionActor) releaseBacklogNow() {
	for _, w := range a.backlog {
		d := &delivery{sub: a.s, claim: w.claim}
		r := d.giveBack(a.s.cfg.ctx)
		if r.Released {
			a.s.released.Add(1)
		}
		a.s.report(r)
		a.s.inWork.Add(-1)
	}
	a.backlog = nil
}

func (a *subscriptionActor) checkDrained() {
	if a.draining != nil && a.inFlight == a.parked && a.s.inWork.Load() == 0 {
		select {
		case <-a.draining:
		default:
			close(a.draining)
		}
	}
}

// recheckBudget makes a subscription polled by its table's IdlePoll try the budget again
// a poll later, as its own poll did: a claim that found the pool's budget spent waits in
// the budget's queue for a Give, and a pool that grows (MySQL's is read at each Take) gives
// nothing, so only another Take would notice it.
func (a *subscriptionActor) recheckBudget(c actor.Context) {
	if a.s.cfg.IdlePoll == nil || a.recheck != nil {
		return
	}
	sys, self := c.ActorSystem(), c.Self()
	a.recheck = time.AfterFunc(a.s.cfg.Poll, func() {
		if !a.stopped.Load() {
			sys.Root.Send(self, recheckMsg{})
		}
	})
}

// arm schedules the next poll. A plain AfterFunc is used rather than Proto.Actor's
// scheduler, whose cancel races under -race.
func (a *subscriptionActor) arm(c actor.Context) {
	sys, self := c.ActorSystem(), c.Self()
	a.timer = time.AfterFunc(a.s.cfg.Poll, func() {
		if !a.stopped.Load() {
			sys.Root.Send(self, tickMsg{})
		}
	})
}

// HandleFailure makes the subscription actor its children's supervisor: claimers and the
// renewer restart after a backoff; a delivery actor that fails is stopped, which releases
// its row.
func (a *subscriptionActor) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason, msg any) {
	a.backoff.HandleFailure(sys, sup, child, rs, reason, msg)
}

func (a *subscriptionActor) decide(child *actor.PID, _ any) supervision.Decision {
	if child.Equal(a.renewer) {
		return supervision.Restart
	}
	for _, pid := range a.claimers {
		if child.Equal(pid) {
			return supervision.Restart
		}
	}
	return supervision.Stop
}

func (a *subscriptionActor) onRestart(child *actor.PID, reason any, failures int, delay time.Duration) {
	a.s.cfg.Telemetry.Restarted(a.s.cfg.ctx, a.fault(reason).String())
	a.s.cfg.Log.Debug("rowactor: restarting after a failure", slog.String("actor", child.Id),
		slog.Int("failures", failures), slog.Duration("delay", delay), slog.Any("reason", reason))
}

// fault names the fault behind a child's failure (its panic value is the claim's error).
func (a *subscriptionActor) fault(reason any) dialects.Fault {
	err, ok := reason.(error)
	if !ok || a.s.cfg.Classify == nil {
		return dialects.FaultUnknown
	}
	return a.s.cfg.Classify(err)
}

// claimFailed logs a failed claim by its fault: an operator must fix a schema fault, so
// it is an error that says where to look; the others clear by themselves.
func (a *subscriptionActor) claimFailed(err error) {
	cfg := &a.s.cfg
	a.failing++
	f := a.fault(err)
	attrs := []any{slog.String("table", cfg.Table), slog.String("queue", cfg.QueueName),
		slog.String("fault", f.String()), slog.Int("failures", a.failing), slog.Any("error", err)}
	switch f {
	case dialects.FaultSchema:
		cfg.Log.Error("rowactor: claim failed: the table, a column or a privilege is missing; "+
			"compare the table with rowactor.Schema and the role's grants. The claimer retries slowly", attrs...)
	case dialects.FaultConnection:
		cfg.Log.Warn("rowactor: claim failed: the database connection is lost; the claimer reconnects after a backoff", attrs...)
	case dialects.FaultData:
		cfg.Log.Error("rowactor: claim failed on a row's data (a value the claim's statement cannot take, or an id that "+
			"cannot be read); correct or delete the row. The claimer restarts after a backoff", attrs...)
	default:
		cfg.Log.Warn("rowactor: claim failed; the claimer restarts after a backoff", attrs...)
	}
}

func (a *subscriptionActor) claimSucceeded() {
	if a.failing == 0 {
		return
	}
	a.s.cfg.Log.Info("rowactor: claims succeed again", slog.String("table", a.s.cfg.Table),
		slog.String("queue", a.s.cfg.QueueName), slog.Int("failures", a.failing))
	a.failing = 0
}
