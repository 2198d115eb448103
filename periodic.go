package rowactor

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/robfig/cron/v3"

	"github.com/rowactor/rowactor/dialects"
)

// Schedule says when a periodic job runs. Next(t) is its first run after t, on a whole
// second, the same in every process. Every and Cron make one.
type Schedule interface {
	Next(t time.Time) time.Time
	String() string
}

// Every runs a periodic job every d, at the multiples of d counted from Go's zero time,
// so that every process agrees on the times. A d that divides a day runs at the same
// times each day, in UTC. d must be a whole number of seconds.
func Every(d time.Duration) Schedule { return every(d) }

type every time.Duration

func (e every) Next(t time.Time) time.Time {
	d := time.Duration(e)
	return t.Truncate(d).Add(d)
}

func (e every) String() string { return "every " + time.Duration(e).String() }

// latest is the latest run at or before now; every schedule answers it without walking
// the runs in between.
func (e every) latest(now time.Time) time.Time { return now.Truncate(time.Duration(e)) }

// cronParser reads five fields, six with seconds first, or a descriptor such as @hourly,
// @daily or @every 1h.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Cron parses a cron expression, with github.com/robfig/cron/v3. It takes five fields,
// minute hour day-of-month month day-of-week; six, with seconds first; or a descriptor:
// @yearly, @monthly, @weekly, @daily, @hourly, or @every d, which is Every.
//
// Times are in the local time zone unless the expression starts with CRON_TZ=Zone, as in
// "CRON_TZ=UTC 0 3 * * *". On the days a zone changes its clocks, a local time in the
// repeated hour runs twice and one in the skipped hour does not run. Schedule such jobs
// in UTC, or outside 01:00-03:00 local time. See docs/periodic.md.
func Cron(expr string) (Schedule, error) {
	s, err := cronParser.Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("rowactor: cron expression %q: %w", expr, err)
	}
	if c, ok := s.(cron.ConstantDelaySchedule); ok {
		// robfig's @every counts from the moment it is asked; processes must agree.
		return every(c.Delay), nil
	}
	loc := time.Local
	if spec, ok := s.(*cron.SpecSchedule); ok && spec.Location != nil {
		loc = spec.Location
	}
	return cronSchedule{s: s, loc: loc, expr: expr}, nil
}

type cronSchedule struct {
	s    cron.Schedule
	loc  *time.Location // the expression's zone: CRON_TZ's, or the process's
	expr string
}

// Next reads t in the expression's zone: robfig reads an expression without CRON_TZ in
// the zone of the time it is given, and the times rowactor gives are often UTC, such as
// a run's time read back from its key.
func (c cronSchedule) Next(t time.Time) time.Time { return c.s.Next(t.In(c.loc)) }
func (c cronSchedule) String() string             { return c.expr }

// PeriodicOption tunes a periodic job started by Broker.Periodic.
type PeriodicOption func(*periodicConfig)

type periodicConfig struct {
	name       string
	skipMissed bool
	publish    []PublishOption
}

// PeriodicName names a periodic job's runs. Each run is published with the unique key
// name@time, its time in UTC as 2006-01-02T15:04:05Z. The key is how every process finds
// the latest run, and how a run is fenced against a second publish.
//
// The default name is the queue and the schedule, such as "reports every 1h0m0s". Name
// the job when its schedule may change, so that a new schedule goes on from the old
// one's runs.
func PeriodicName(name string) PeriodicOption { return func(c *periodicConfig) { c.name = name } }

// SkipMissed drops the runs whose time passed while no process ran the job, as in a
// deploy or an outage. Without it, the latest of them is published once, when a process
// starts the job again.
func SkipMissed() PeriodicOption { return func(c *periodicConfig) { c.skipMissed = true } }

// PeriodicPublish publishes each run with opts, such as Priority, WithHeaders or After.
// The run's own unique key replaces any Unique among them.
func PeriodicPublish(opts ...PublishOption) PeriodicOption {
	return func(c *periodicConfig) { c.publish = append(c.publish, opts...) }
}

// PeriodicJob publishes one periodic job's runs while its broker runs. Broker.Periodic
// returns it.
type PeriodicJob struct {
	table, name string
	leading     atomic.Bool
	published   atomic.Int64
	cancel      context.CancelFunc
	done        chan struct{}
	once        sync.Once
}

// Name is the job's name, the prefix of its runs' unique keys.
func (p *PeriodicJob) Name() string { return p.name }

// Leading reports whether this broker led the job's latest round.
func (p *PeriodicJob) Leading() bool { return p.leading.Load() }

// Published is how many runs this broker published.
func (p *PeriodicJob) Published() int64 { return p.published.Load() }

// Stop ends the job in this broker and waits for its round in progress, whose context
// ends. Shutdown stops it too; other processes running it go on. Stop may be called from
// a payload function.
//
// A payload function that ignores its context is not waited for: the round gives it up,
// lets its lock go, and drops what it returns.
func (p *PeriodicJob) Stop() { p.stop(context.Background()) }

// stop is Stop, waiting at most until ctx ends; it reports whether the round ended.
func (p *PeriodicJob) stop(ctx context.Context) bool {
	p.once.Do(p.cancel)
	select {
	case <-p.done:
		return true
	case <-ctx.Done():
		return false
	}
}

// PeriodicPayload makes the payload of a periodic job's run at time at. ctx ends when the
// job stops, and the round does not wait for a function that ignores it.
//
// An error or a panic fails the round, which publishes nothing; a panic is logged with its
// stack. The round is tried again after 1 s, 2 s, 4 s and so on, up to 30 s, and never
// later than the next run. Up to a minute late the run is published as itself, later as a
// missed run: once, unless SkipMissed.
type PeriodicPayload func(ctx context.Context, at time.Time) ([]byte, error)

// periodicKeyTime is how a run's time is written in its unique key: fixed width, so that
// the keys' byte order is the runs' order.
const periodicKeyTime = "2006-01-02T15:04:05Z"

// Periodic publishes a row to queue of t at each run of schedule, its payload from
// payload, for as long as the broker runs. It returns the job, which Stop ends.
//
// Start it in every process that should keep the job going: each run is published once
// in all. At each run the brokers take turns under a session lock; the first publishes
// the run with the unique key name@time, and the others find it published. The unique
// key also fences a run against a second publish.
//
// The table needs a unique key column, Table.UniqueKey, and a Table.ProcessedAt column
// that keeps a finished run's row with its key; ClearUniqueKeyAtAck is refused. A
// retention must keep finished rows longer than the time between two runs.
//
// A run up to a minute late is published as itself. Runs missed while no broker ran the
// job are published once, as the latest of them, unless SkipMissed. A payload function
// that ignores its context does not hold the job's lock when the job stops.
//
// See docs/periodic.md for the turns across processes, SQLite, and late and missed runs.
func (b *Broker) Periodic(ctx context.Context, t Table, queue string, schedule Schedule, payload PeriodicPayload, opts ...PeriodicOption) (*PeriodicJob, error) {
	var cfg periodicConfig
	for _, o := range opts {
		o(&cfg)
	}
	if schedule == nil {
		return nil, &ConfigError{Table: t.Name, Option: "Periodic", Reason: "the schedule is nil", Fix: "pass rowactor.Every(d) or a schedule from rowactor.Cron"}
	}
	if cfg.name == "" {
		cfg.name = queue + " " + schedule.String()
	}
	if err := checkPeriodic(t, schedule, payload, cfg, b.now()); err != nil {
		return nil, err
	}
	el, ok1 := b.d.(dialects.Elector)
	kr, ok2 := b.d.(dialects.UniqueKeyReader)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("rowactor: the %s dialect cannot run periodic jobs (dialects.Elector and dialects.UniqueKeyReader)", b.d.Name())
	}
	if !b.enterPublish() {
		return nil, fmt.Errorf("rowactor: periodic job %q on %s: %w", cfg.name, t.Name, ErrClosed)
	}
	// The description is checked against the live table before anything runs, and the
	// publisher made, so that a round needs no connection but its lock's.
	_, _, err := kr.NewestUniqueKey(ctx, nil, t, cfg.name+runKeyLow, cfg.name+runKeyHigh)
	if err == nil {
		_, err = b.publisher(ctx, t)
	}
	b.leavePublish()
	if err != nil {
		return nil, fmt.Errorf("rowactor: periodic job %q on %s: %w", cfg.name, t.Name, err)
	}
	pctx, cancel := context.WithCancel(context.Background())
	p := &PeriodicJob{table: t.Name, name: cfg.name, cancel: cancel, done: make(chan struct{})}
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		cancel()
		return nil, fmt.Errorf("rowactor: periodic job %q on %s: %w", cfg.name, t.Name, ErrClosed)
	}
	for _, other := range b.periodics {
		if other.table == t.Name && other.name == cfg.name {
			b.mu.Unlock()
			cancel()
			return nil, &ConfigError{Table: t.Name, Option: "PeriodicName", Reason: fmt.Sprintf("the broker runs a periodic job named %q on the table already", cfg.name),
				Fix: "start each job once per broker, or give the second its own PeriodicName"}
		}
	}
	b.periodics = append(b.periodics, p)
	b.mu.Unlock()
	r := &periodicRun{b: b, p: p, el: el, kr: kr, t: t, queue: queue, sched: schedule, payload: payload, cfg: cfg, since: b.now()}
	go r.loop(pctx)
	return p, nil
}

// checkPeriodic refuses what would not keep a periodic job's runs apart.
func checkPeriodic(t Table, schedule Schedule, payload PeriodicPayload, cfg periodicConfig, now time.Time) error {
	bad := func(option, reason, fix string) error {
		return &ConfigError{Table: t.Name, Option: option, Reason: reason, Fix: fix}
	}
	if e, ok := schedule.(every); ok && (time.Duration(e) < time.Second || time.Duration(e)%time.Second != 0) {
		return bad("Every", fmt.Sprintf("runs every %v: a run's time is a whole second", time.Duration(e)), "run every whole number of seconds, at least one")
	}
	if schedule.Next(now).IsZero() {
		return bad("Periodic", fmt.Sprintf("the schedule %s has no run after %s", schedule, now.Format(time.RFC3339)), "give a schedule that runs (Cron(\"0 0 30 2 *\") never does)")
	}
	if payload == nil {
		return bad("Periodic", "the payload function is nil", "pass a function that returns each run's payload")
	}
	if t.UniqueKey == "" {
		return bad("Table.UniqueKey", "a periodic job publishes each run under a unique key, and the table has no unique key column",
			"set Table.UniqueKey (rowactor.Schema renders it and its unique index)")
	}
	if t.ProcessedAt == "" {
		return bad("Table.ProcessedAt", "a periodic job finds its latest run in the table, and a table without processed_at deletes its rows at their ack",
			"set Table.ProcessedAt, so that finished runs stay (Retain deletes them later)")
	}
	if t.ClearUniqueKeyAtAck {
		return bad("Table.ClearUniqueKeyAtAck", "a periodic job finds its latest run by its unique key, which ClearUniqueKeyAtAck clears at the ack",
			"drop ClearUniqueKeyAtAck, or run the job on a table that keeps its keys")
	}
	if !utf8.ValidString(cfg.name) || strings.ContainsFunc(cfg.name, unicode.IsControl) || strings.Contains(cfg.name, "@") {
		return bad("PeriodicName", fmt.Sprintf("the name %q is not printable text without @", cfg.name),
			"name the job in printable UTF-8 without @ (name@time is its runs' key)")
	}
	if len(cfg.name) > maxPeriodicName {
		return bad("PeriodicName", fmt.Sprintf("the name is %d bytes long; with the run's time its keys would not fit the key column's index", len(cfg.name)),
			fmt.Sprintf("name the job in at most %d bytes", maxPeriodicName))
	}
	return nil
}

// forgetPeriodic drops p from the broker's periodic jobs, unless Shutdown took them all
// already.
func (b *Broker) forgetPeriodic(p *PeriodicJob) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, other := range b.periodics {
		if other == p {
			b.periodics = append(b.periodics[:i:i], b.periodics[i+1:]...)
			return
		}
	}
}

// maxPeriodicName keeps name@time within the key column's index on every database: MySQL's
// VARBINARY(767) and PostgreSQL's btree entry.
const maxPeriodicName = 200

// periodicRun is one broker's part in a periodic job.
type periodicRun struct {
	b       *Broker
	p       *PeriodicJob
	el      dialects.Elector
	kr      dialects.UniqueKeyReader
	t       Table
	queue   string
	sched   Schedule
	payload PeriodicPayload
	cfg     periodicConfig
	since   time.Time // when this broker started the job
	// inLine says this broker found another holding the job's lock: the job was running
	// then. With a run published shortly before this broker started, the runs after it
	// were not missed while no broker ran the job, whenever this broker started. It may be
	// taking over from a holder that died; see takeoverSince.
	inLine bool
	// seen is the latest run this broker knows was published. A run's row moved away, to
	// a dead-letter table, must not make it due again.
	seen time.Time
}

// loop takes a round at once, for missed runs, and then at each run's time.
func (r *periodicRun) loop(ctx context.Context) {
	defer close(r.p.done)
	defer r.b.forgetPeriodic(r.p)
	defer r.p.leading.Store(false)
	timer := time.NewTimer(0)
	defer timer.Stop()
	retry := time.Duration(0) // after a failed round: the wait before the next try
	// jumped is closed at the broker's clock's first jump after the round read its now: taken before that read, so that a jump made while the round runs
	// wakes the wait after it, which was measured from the time before the jump.
	jumped := r.b.advanced()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-jumped:
			timer.Stop() // Go 1.23 timers: Reset below needs no drain
		}
		jumped = r.b.advanced()
		now := r.b.now()
		next := r.sched.Next(now)
		if next.IsZero() {
			r.b.log.Warn("rowactor: a periodic job's schedule has no more runs", "table", r.t.Name, "job", r.p.name)
			return
		}
		out := r.round(ctx, now, next)
		now = r.b.now()
		wait := r.sched.Next(now).Sub(now)
		switch out {
		case roundFailed:
			// The failed run is due still: waiting for the next run would publish it an
			// interval late, past runGrace for an hourly job, as a missed run or not at all.
			retry = min(max(2*retry, periodicRetryFirst), periodicRetryMax)
			wait = min(wait, retry)
		case roundHeld:
			retry = 0
			// Another broker held the lock for the whole wait in line. It may hang there and
			// die before it publishes the run; its session's end lets the lock go. While the
			// run may still be published as itself, wait in line again soon. Otherwise the
			// run would be due again only at the next run, as a missed one, or never with
			// SkipMissed. A round that leads reads the table, so a run the holder did publish is not
			// published twice. Each try waits in line first, so the tries per run are few.
			if due, ok := latestRun(r.sched, now.Add(-runGrace), now); ok && due.After(r.seen) {
				wait = min(wait, periodicInLineAgain, max(due.Add(runGrace).Sub(now), 0))
			}
		default:
			retry = 0
		}
		timer.Reset(wait)
	}
}

// A failed round is tried again after periodicRetryFirst, doubling up to periodicRetryMax,
// and never later than the job's next run.
const (
	periodicRetryFirst = time.Second
	periodicRetryMax   = 30 * time.Second
)

// periodicInLineAgain is the pause before a broker waits in line again, when its wait ran
// out behind a holder that has not published the run. It does so while the run is at most
// runGrace old.
const periodicInLineAgain = time.Second

// roundOutcome is how a round ended.
type roundOutcome int

const (
	roundDone   roundOutcome = iota // this broker led the round, or the job stopped
	roundFailed                     // an error of the payload function or the database: try again soon
	roundHeld                       // another broker held the job's lock for the whole wait in line
)

// round publishes the latest run due at now, unless a row holds its key, under the job's
// lock. It waits for the lock up to half the time to the next run, at most 10 s.
func (r *periodicRun) round(ctx context.Context, now, next time.Time) roundOutcome {
	wait := min(next.Sub(now)/2, 10*time.Second)
	var (
		published int64
		seen      time.Time
	)
	lock := "periodic:" + r.t.Name + ":" + r.p.name
	publish := func(ctx context.Context, tx any) (err error) {
		published, seen, err = r.publishDue(ctx, tx)
		return err
	}
	// A try first tells whether another broker holds the lock, for inLine; then the wait.
	led, err := r.el.Elect(ctx, lock, 0, publish)
	if err == nil && !led && wait > 0 {
		r.inLine = true
		led, err = r.el.Elect(ctx, lock, wait, publish)
	}
	r.p.leading.Store(led)
	r.b.log.Debug("rowactor: a periodic job's round", "broker", r.b.name, "since", r.since, "table", r.t.Name, "job", r.p.name, "led", led, "published", published, "error", err)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, ErrClosed) {
			return roundDone
		}
		r.b.log.Warn("rowactor: a periodic job's round failed", "table", r.t.Name, "job", r.p.name, "error", err)
		return roundFailed
	}
	if !led {
		return roundHeld
	}
	if seen.After(r.seen) {
		r.seen = seen
	}
	if published > 0 {
		r.p.published.Add(published)
		r.b.wake(r.t, r.queue) // committed with the round's lock
	}
	return roundDone
}

// runGrace is how late a run may still be published as itself: later, it was missed.
const runGrace = time.Minute

// The keys of a job's runs are name@ and a time, which starts with a digit. So the range
// from name@0 up to name@: holds them and no other key the name starts, since ":" follows
// "9".
const (
	runKeyLow  = "@0"
	runKeyHigh = "@:"
)

// publishDue runs under the job's lock, in its transaction tx, which is nil on SQLite.
// The table's newest key of the job tells the latest run published. The runs dueRuns
// finds due since then are published now, and commit with the round.
func (r *periodicRun) publishDue(ctx context.Context, tx any) (n int64, seen time.Time, err error) {
	prefix := r.p.name + "@"
	newest, found, err := r.kr.NewestUniqueKey(ctx, tx, r.t, r.p.name+runKeyLow, r.p.name+runKeyHigh)
	if err != nil {
		return 0, seen, err
	}
	after := r.since
	var ran time.Time // the latest run known published: the table's newest, or one this broker saw
	if found {
		if ran, err = time.Parse(periodicKeyTime, strings.TrimPrefix(newest, prefix)); err != nil {
			return 0, seen, fmt.Errorf("rowactor: periodic job %q: the newest key of its runs, %q, is not name@%s", r.p.name, newest, periodicKeyTime)
		}
		seen, after = ran, ran
	}
	if r.seen.After(ran) {
		ran = r.seen
	}
	if r.seen.After(after) {
		after = r.seen
	}
	since := takeoverSince(r.sched, ran, r.inLine, r.since)
	for _, run := range dueRuns(r.sched, after, since, r.b.now(), r.cfg.skipMissed) {
		payload, err := r.makePayload(ctx, run)
		if err != nil {
			return n, seen, err
		}
		opts := append(append(make([]PublishOption, 0, len(r.cfg.publish)+1), r.cfg.publish...), Unique(prefix+run.UTC().Format(periodicKeyTime)))
		if tx != nil {
			_, err = r.b.PublishTx(ctx, tx, r.t, r.queue, payload, opts...)
		} else {
			_, err = r.b.Publish(ctx, r.t, r.queue, payload, opts...)
		}
		if errors.Is(err, ErrDuplicate) {
			err = nil // another broker published this run: it is published once
		}
		if err != nil {
			return n, seen, err
		}
		n, seen = n+1, run
	}
	return n, seen, nil
}

// makePayload calls the job's payload function. A panic is its error, logged with the
// stack, as a handler's is.
//
// The function runs in a goroutine of its own, and the round gives it up when ctx ends,
// when the job stops or at Shutdown. A payload that ignores its context must not keep the
// round's lock and transaction waiting, nor with them the pool an Open broker closes, nor
// a Stop called from the payload itself. The abandoned function's result is dropped when
// it returns.
func (r *periodicRun) makePayload(ctx context.Context, run time.Time) ([]byte, error) {
	type result struct {
		payload []byte
		err     error
	}
	out := make(chan result, 1)
	go func() {
		var res result
		defer func() { out <- res }()
		defer func() {
			if v := recover(); v != nil {
				r.b.log.Error("rowactor: a periodic job's payload function panicked", "table", r.t.Name, "job", r.p.name,
					"run", run, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				res.err = fmt.Errorf("rowactor: periodic job %q: the payload function panicked at the run of %s: %v", r.p.name, run.UTC().Format(periodicKeyTime), v)
			}
		}()
		res.payload, res.err = r.payload(ctx, run)
		if res.err != nil {
			res.payload, res.err = nil, fmt.Errorf("rowactor: periodic job %q: the payload of the run of %s: %w", r.p.name, run.UTC().Format(periodicKeyTime), res.err)
		}
	}()
	select {
	case res := <-out:
		return res.payload, res.err
	case <-ctx.Done():
		r.b.log.Warn("rowactor: a periodic job stopped while its payload function ran: the round is given up, its lock let go, and the function's result will be dropped",
			"table", r.t.Name, "job", r.p.name, "run", run)
		return nil, fmt.Errorf("rowactor: periodic job %q: stopped while the payload of the run of %s was made: %w", r.p.name, run.UTC().Format(periodicKeyTime), ctx.Err())
	}
}

// takeoverSince is the since a round passes to dueRuns. newest is the latest run known
// published, the table's or one this broker saw; the zero time when none is.
//
// It is the zero time, meaning no run after the newest was missed, when both hold:
//   - this broker found another holding the job's lock, so inLine is set;
//   - the table shows the job ran shortly before this broker started: the run after the
//     newest one published came at most runGrace before it.
//
// Then the holder was running the job when those runs came. That is a rolling deploy's
// takeover: the new broker, started after run T, waits behind an old one that hangs in T
// and dies. Otherwise it is since, the time this broker started the job: the runs before
// it came while no broker ran the job, and were missed.
//
// Being in line alone proves nothing about the runs before this broker started. After an
// outage, the broker ahead in line may have started just before this one, and the runs
// of the outage were missed; newest is then the last run before the outage, long before
// since.
func takeoverSince(s Schedule, newest time.Time, inLine bool, since time.Time) time.Time {
	if !inLine || newest.IsZero() {
		return since
	}
	if next := s.Next(newest); !next.IsZero() && !next.Add(runGrace).Before(since) {
		return time.Time{}
	}
	return since
}

// dueRuns are the runs of s after the run after, up to now, to publish:
//   - each run after since and at most runGrace old. Such a run is late: a round came
//     late, or a holder died mid-round and the next in line followed it.
//   - unless skipMissed, the latest run before those, once. It was missed: no broker ran
//     the job when it came, or it is more than runGrace old.
//
// since is when this broker started the job, or the zero time when nothing after the
// newest run was missed, as takeoverSince finds for a broker in line that took over a
// job that was running.
func dueRuns(s Schedule, after, since, now time.Time, skipMissed bool) []time.Time {
	var runs []time.Time
	cut := latest(now.Add(-runGrace), since.Add(-time.Nanosecond)) // runs after cut are late, not missed
	if missed, ok := latestRun(s, after, cut); ok && !skipMissed {
		runs = append(runs, missed)
	}
	for run := s.Next(latest(after, cut)); !run.IsZero() && !run.After(now); run = s.Next(run) {
		runs = append(runs, run)
	}
	return runs
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// latestRun is s's latest run after after and at most now.
func latestRun(s Schedule, after, now time.Time) (time.Time, bool) {
	if e, ok := s.(every); ok {
		run := e.latest(now)
		return run, run.After(after)
	}
	run := s.Next(after)
	if run.IsZero() || run.After(now) {
		return time.Time{}, false
	}
	for {
		n := s.Next(run)
		if n.IsZero() || n.After(now) {
			return run, true
		}
		run = n
	}
}
