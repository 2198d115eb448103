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

// Schedule says when a periodic job runs (Broker.Periodic): Next(t) is its first run
// after t, on a whole second, the same in every process. Every and Cron make one.
type Schedule interface {
	Next(t time.Time) time.Time
	String() string
}

// Every runs a periodic job every d, at the multiples of d counted from Go's zero time
// (so every process agrees on the times; for a d that divides a day, at the same times
// each day, in UTC). d must be a whole number of seconds.
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

// cronParser reads five fields (minute hour day-of-month month day-of-week), six with
// seconds first, or a descriptor (@hourly, @daily, @every 1h…).
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Cron parses a cron expression: five fields (minute hour day-of-month month
// day-of-week), six with seconds first, or a descriptor (@yearly, @monthly, @weekly,
// @daily, @hourly, or @every d, which is Every(d)). Times are in the local time zone
// unless the expression starts with CRON_TZ=Zone (CRON_TZ=UTC 0 3 * * *). Parsed by
// github.com/robfig/cron/v3.
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
// the zone of the time it is given, and the times rowactor gives are often UTC (a run's
// time read back from its key).
func (c cronSchedule) Next(t time.Time) time.Time { return c.s.Next(t.In(c.loc)) }
func (c cronSchedule) String() string             { return c.expr }

// PeriodicOption tunes a periodic job (Broker.Periodic).
type PeriodicOption func(*periodicConfig)

type periodicConfig struct {
	name       string
	skipMissed bool
	publish    []PublishOption
}

// PeriodicName names a periodic job's runs: each is published with the unique key
// name@time (time in UTC, 2006-01-02T15:04:05Z), which is how every process finds the
// latest run and how a run is fenced against a second publish. Default: the queue and the
// schedule ("reports every 1h0m0s"). Name the job when its schedule may change, so that a
// new schedule goes on from the old one's runs.
func PeriodicName(name string) PeriodicOption { return func(c *periodicConfig) { c.name = name } }

// SkipMissed drops the runs whose time passed while no process ran the job (a deploy, an
// outage). Without it, the latest of them is published once, when a process starts the
// job again.
func SkipMissed() PeriodicOption { return func(c *periodicConfig) { c.skipMissed = true } }

// PeriodicPublish publishes each run with opts (Priority, WithHeaders, After); the run's
// own unique key replaces any Unique among them.
func PeriodicPublish(opts ...PublishOption) PeriodicOption {
	return func(c *periodicConfig) { c.publish = append(c.publish, opts...) }
}

// PeriodicJob publishes one periodic job's runs while its broker runs (Broker.Periodic).
type PeriodicJob struct {
	table, name string
	leading     atomic.Bool
	published   atomic.Int64
	inPayload   atomic.Int32 // payload functions running
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
// ends; Shutdown stops it too. Other processes running it go on. Called while a payload
// function runs (from it, say), Stop does not wait: the round publishes nothing more.
func (p *PeriodicJob) Stop() { p.stop(context.Background()) }

// stop is Stop, waiting at most until ctx ends; it reports whether the round ended.
func (p *PeriodicJob) stop(ctx context.Context) bool {
	p.once.Do(p.cancel)
	if p.inPayload.Load() > 0 {
		return false
	}
	select {
	case <-p.done:
		return true
	case <-ctx.Done():
		return false
	}
}

// PeriodicPayload makes the payload of a periodic job's run at its time at. ctx ends when
// the job stops; an error (or a panic, logged with its stack) fails the round, which
// publishes nothing and is tried again after 1 s, 2 s, 4 s ... up to 30 s (never later
// than the next run): up to a minute late the run is published as itself, later as a
// missed run (once, unless SkipMissed).
type PeriodicPayload func(ctx context.Context, at time.Time) ([]byte, error)

// periodicKeyTime is how a run's time is written in its unique key: fixed width, so that
// the keys' byte order is the runs' order.
const periodicKeyTime = "2006-01-02T15:04:05Z"

// Periodic publishes a row to queue of t at each run of schedule, its payload from
// payload(run time), for as long as the broker runs. Start it in every process that
// should keep the job going: each run is published once in all. At each run every
// broker running the job wakes and takes a turn under a session lock (PostgreSQL's
// advisory lock, MySQL's GET_LOCK; see Retain), waiting up to half the time to the next
// run: the first publishes the run, with the unique key name@time, and the others find
// it published. A broker that dies holding the lock lets it go with its session, so the
// next one in line publishes the run. The unique key is the second fence: a run whose key
// a row holds is never published again. On SQLite the brokers of one process take turns,
// and processes sharing a file are kept apart by the unique key alone.
//
// The runs' rows are the job's memory, so the table needs a unique key column
// (Table.UniqueKey) and a processed_at column (Table.ProcessedAt) that keeps a finished
// run's row, with its key (not ClearUniqueKeyAtAck); a retention must keep finished rows
// longer than the time between two runs. Where no run's row is left, a broker takes the
// time it started the job as the latest run.
//
// A round publishes every run since the latest published one that is at most a minute
// old (a round that came late, a holder that died mid-round). Older ones were missed
// while no broker ran the job: the latest of them is published once (SkipMissed drops
// them).
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

// forgetPeriodic drops p from the broker's periodic jobs (Shutdown took them all already).
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

// maxPeriodicName keeps name@time within the key column's index on every database
// (MySQL's VARBINARY(767), PostgreSQL's btree entry).
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
	// seen is the latest run this broker knows was published: a run's row moved away
	// (a dead-letter table) must not make it due again.
	seen time.Time
}

// loop takes a round at once (missed runs) and then at each run's time.
func (r *periodicRun) loop(ctx context.Context) {
	defer close(r.p.done)
	defer r.b.forgetPeriodic(r.p)
	defer r.p.leading.Store(false)
	timer := time.NewTimer(0)
	defer timer.Stop()
	retry := time.Duration(0) // after a failed round: the wait before the next try
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-r.b.advanced(): // the broker's clock jumped (WithClock)
			timer.Stop() // Go 1.23 timers: Reset below needs no drain
		}
		now := r.b.now()
		next := r.sched.Next(now)
		if next.IsZero() {
			r.b.log.Warn("rowactor: a periodic job's schedule has no more runs", "table", r.t.Name, "job", r.p.name)
			return
		}
		failed := r.round(ctx, now, next)
		now = r.b.now()
		wait := r.sched.Next(now).Sub(now)
		if !failed {
			retry = 0
		} else {
			// The failed run is due still: waiting for the next run would publish it an
			// interval late, past runGrace for an hourly job, as a missed run or not at all.
			retry = min(max(2*retry, periodicRetryFirst), periodicRetryMax)
			wait = min(wait, retry)
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

// round publishes the latest run due at now, unless a row holds its key, under the job's
// lock. It waits for the lock up to half the time to the next run. It reports whether the
// round failed (not whether it led: a round another broker leads has not failed).
func (r *periodicRun) round(ctx context.Context, now, next time.Time) (failed bool) {
	wait := min(next.Sub(now)/2, 10*time.Second)
	var (
		published int64
		seen      time.Time
	)
	led, err := r.el.Elect(ctx, "periodic:"+r.t.Name+":"+r.p.name, wait, func(ctx context.Context, tx any) (err error) {
		published, seen, err = r.publishDue(ctx, tx)
		return err
	})
	r.p.leading.Store(led)
	r.b.log.Debug("rowactor: a periodic job's round", "broker", r.b.name, "since", r.since, "table", r.t.Name, "job", r.p.name, "led", led, "published", published, "error", err)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, ErrClosed) {
			return false
		}
		r.b.log.Warn("rowactor: a periodic job's round failed", "table", r.t.Name, "job", r.p.name, "error", err)
		return true
	}
	if seen.After(r.seen) {
		r.seen = seen
	}
	if published > 0 {
		r.p.published.Add(published)
		r.b.wake(r.t, r.queue) // committed with the round's lock
	}
	return false
}

// runGrace is how late a run may still be published as itself: later, it was missed.
const runGrace = time.Minute

// The keys of a job's runs are name@ and a time, which starts with a digit: the range
// [name@0, name@:) holds them and no other key the name starts (":" follows "9").
const (
	runKeyLow  = "@0"
	runKeyHigh = "@:"
)

// publishDue runs under the job's lock, in its transaction tx (nil on SQLite): the
// table's newest key of the job tells the latest run published; the runs due since then
// are published now (dueRuns), and commit with the round.
func (r *periodicRun) publishDue(ctx context.Context, tx any) (n int64, seen time.Time, err error) {
	prefix := r.p.name + "@"
	newest, found, err := r.kr.NewestUniqueKey(ctx, tx, r.t, r.p.name+runKeyLow, r.p.name+runKeyHigh)
	if err != nil {
		return 0, seen, err
	}
	after := r.since
	if found {
		if after, err = time.Parse(periodicKeyTime, strings.TrimPrefix(newest, prefix)); err != nil {
			return 0, seen, fmt.Errorf("rowactor: periodic job %q: the newest key of its runs, %q, is not name@%s", r.p.name, newest, periodicKeyTime)
		}
		seen = after
	}
	if r.seen.After(after) {
		after = r.seen
	}
	for _, run := range dueRuns(r.sched, after, r.since, r.b.now(), r.cfg.skipMissed) {
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
		if err != nil {
			return n, seen, err
		}
		n, seen = n+1, run
	}
	return n, seen, nil
}

// makePayload calls the job's payload function; a panic is its error, logged with the
// stack, as a handler's is.
func (r *periodicRun) makePayload(ctx context.Context, run time.Time) (payload []byte, err error) {
	r.p.inPayload.Add(1)
	defer r.p.inPayload.Add(-1)
	defer func() {
		if v := recover(); v != nil {
			r.b.log.Error("rowactor: a periodic job's payload function panicked", "table", r.t.Name, "job", r.p.name,
				"run", run, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			err = fmt.Errorf("rowactor: periodic job %q: the payload function panicked at the run of %s: %v", r.p.name, run.UTC().Format(periodicKeyTime), v)
		}
	}()
	payload, err = r.payload(ctx, run)
	if err != nil {
		return nil, fmt.Errorf("rowactor: periodic job %q: the payload of the run of %s: %w", r.p.name, run.UTC().Format(periodicKeyTime), err)
	}
	return payload, nil
}

// dueRuns are the runs of s after the run after, up to now, to publish: each run since
// this broker started the job (since) and at most runGrace old (a round that came late,
// a holder that died mid-round and was followed by the next in line), and, unless
// skipMissed, the latest run before those (missed while no broker ran the job, or for
// longer than runGrace), once.
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

// latestRun is s's latest run in (after, now].
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
