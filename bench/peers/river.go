package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// noopArgs is the job: the message's sequence number and padding, so that its JSON is
// about payloadSize bytes like the other systems' payloads.
type noopArgs struct {
	Seq int    `json:"seq"`
	Pad string `json:"pad"`
}

func (noopArgs) Kind() string { return "peers_noop" }

// riverPad makes {"seq":N,"pad":"…"} payloadSize bytes long for an N of seqDigits digits
// (a few bytes shorter for smaller N).
var riverPad = strings.Repeat("x", payloadSize-len(`{"seq":,"pad":""}`)-seqDigits)

// noopWorker counts the job and succeeds; River then marks it completed.
type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	l  *latch
	tl *tally
}

func (w *noopWorker) Work(_ context.Context, job *river.Job[noopArgs]) error {
	w.l.begin()
	w.tl.handle(job.Args.Seq)
	return nil
}

// riverQueue is River on a schema of its own (made by rivermigrate, dropped at the end),
// so its tables, and its LISTEN topics, which River prefixes with the schema, clash with
// nothing else in the database.
type riverQueue struct {
	pool     *pgxpool.Pool
	schema   string
	stmts    func() int64
	log      *slog.Logger
	cooldown time.Duration // Config.FetchCooldown
	poll     time.Duration // Config.FetchPollInterval
	// inserter is a client without queues: it inserts, and never works.
	inserter *river.Client[pgx.Tx]
}

func newRiver(ctx context.Context, pool *pgxpool.Pool, stmts func() int64, cooldown, poll time.Duration) (*riverQueue, error) {
	q := &riverQueue{
		pool: pool, schema: fmt.Sprintf("river_bench_%d", os.Getpid()), stmts: stmts,
		// River logs warnings to stdout by default; stdout carries the JSON lines.
		log:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		cooldown: cooldown, poll: poll,
	}
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+q.schema+" CASCADE"); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+q.schema); err != nil {
		return nil, err
	}
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: q.schema, Logger: q.log})
	if err != nil {
		return nil, err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("rivermigrate: %w", err)
	}
	q.inserter, err = river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: q.schema, Logger: q.log})
	if err != nil {
		return nil, err
	}
	return q, nil
}

func (q *riverQueue) contender() contender {
	return contender{system: "river", fill: q.fill, drain: q.drain, check: q.check, clean: func(context.Context) {}}
}

func (q *riverQueue) table() string { return q.schema + ".river_job" }

// fill empties river_job and inserts the jobs with InsertManyFast (COPY FROM), into the
// default queue.
func (q *riverQueue) fill(ctx context.Context, rows int) error {
	if _, err := q.pool.Exec(ctx, "TRUNCATE "+q.table()+" RESTART IDENTITY"); err != nil {
		return err
	}
	params := make([]river.InsertManyParams, rows)
	for i := range params {
		params[i] = river.InsertManyParams{Args: noopArgs{Seq: i, Pad: riverPad}}
	}
	n, err := q.inserter.InsertManyFast(ctx, params)
	if err != nil {
		return err
	}
	if n != rows {
		return fmt.Errorf("inserted %d jobs of %d", n, rows)
	}
	return settlePostgres(ctx, q.pool, q.table())
}

// drain starts a fresh client (as rowactor gets a fresh broker) with MaxWorkers = workers
// on the default queue, and the fetch cooldown and poll interval of the flags. A job is
// settled when River's completer has marked it completed in the database: the
// JobCompleted event, which the client sends after the completer's batch commits.
func (q *riverQueue) drain(ctx context.Context, workers, rows int) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	l := newLatch(rows)
	tl := newTally(rows, l)
	ws := river.NewWorkers()
	river.AddWorker(ws, &noopWorker{l: l, tl: tl})
	client, err := river.NewClient(riverpgxv5.New(q.pool), &river.Config{
		Schema:            q.schema,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:           ws,
		FetchCooldown:     q.cooldown,
		FetchPollInterval: q.poll,
		Logger:            q.log,
	})
	if err != nil {
		return result{}, err
	}
	// A channel as large as the drain: River drops events when a subscriber's
	// channel is full.
	events, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		Kinds: []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed,
			river.EventKindJobSnoozed, river.EventKindJobCancelled},
		ChanSize: rows + 100,
	})
	defer unsubscribe()
	go func() {
		for ev := range events {
			if ev.Kind != river.EventKindJobCompleted {
				l.fail(fmt.Errorf("job %d: %s", ev.Job.ID, ev.Kind))
				continue
			}
			l.settled()
		}
	}()
	m := startMeter(q.stmts)
	err = client.Start(ctx)
	var r result
	if err == nil {
		var took time.Duration
		took, err = l.wait(ctx)
		r = m.stop(rows, took, tl.handledIn())
	}
	if serr := client.Stop(ctx); serr != nil && err == nil {
		err = fmt.Errorf("stop: %w", serr)
	}
	if err != nil {
		return result{}, err
	}
	return r, tl.check()
}

// check: every job of the round is in river_job, completed.
func (q *riverQueue) check(ctx context.Context, rows int) error {
	var total, completed int
	err := q.pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE state = 'completed') FROM "+q.table()).Scan(&total, &completed)
	if err == nil && (total != rows || completed != rows) {
		err = fmt.Errorf("river_job holds %d jobs, %d completed; want %d completed", total, completed, rows)
	}
	return err
}

func (q *riverQueue) close(ctx context.Context) {
	if _, err := q.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+q.schema+" CASCADE"); err != nil {
		fmt.Fprintf(os.Stderr, "peers: drop schema %s: %v\n", q.schema, err)
	}
}
