package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync"
	"time"

	"maragu.dev/goqite"
)

// goqiteSchema is goqite v0.4.0's schema_sqlite.sql, which the module ships but does not
// export. goqite's statements name the table goqite, so it cannot be renamed: it lives in
// a database file of its own in the run's temporary directory.
const goqiteSchema = `
create table goqite (
  id text primary key default ('m_' || lower(hex(randomblob(16)))),
  created text not null default (strftime('%Y-%m-%dT%H:%M:%fZ')),
  updated text not null default (strftime('%Y-%m-%dT%H:%M:%fZ')),
  queue text not null,
  body blob not null,
  timeout text not null default (strftime('%Y-%m-%dT%H:%M:%fZ')),
  received integer not null default 0,
  priority integer not null default 0
) strict;

create trigger goqite_updated_timestamp after update on goqite begin
  update goqite set updated = strftime('%Y-%m-%dT%H:%M:%fZ') where id = old.id;
end;

create index goqite_queue_priority_created_idx on goqite (queue, priority desc, created);
`

// goqiteQueue is goqite on its own SQLite pool, opened with rowactor's pragmas.
type goqiteQueue struct {
	db   *sql.DB
	name string        // the queue's name, after this process
	poll time.Duration // ReceiveAndWait's interval
}

func newGoqite(db *sql.DB, poll time.Duration) *goqiteQueue {
	return &goqiteQueue{db: db, name: fmt.Sprintf("peers_%d", os.Getpid()), poll: poll}
}

func (g *goqiteQueue) contender() contender {
	return contender{system: "goqite", fill: g.fill, drain: g.drain, check: g.check, clean: g.drop}
}

func (g *goqiteQueue) queue() *goqite.Queue {
	// The same redelivery timeout as rowactor's lease; goqite's default is 5 s.
	return goqite.New(goqite.NewOpts{DB: g.db, Name: g.name, Timeout: leaseLength})
}

// fill recreates goqite's table and sends the messages with goqite's SendTx, all in one
// transaction.
func (g *goqiteQueue) fill(ctx context.Context, rows int) error {
	g.drop(ctx)
	if _, err := g.db.ExecContext(ctx, goqiteSchema); err != nil {
		return err
	}
	tx, err := g.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op after Commit
	q := g.queue()
	for i := range rows {
		if err := q.SendTx(ctx, tx, goqite.Message{Body: payloadFor(i)}); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	if n, err := g.count(ctx); err != nil || n != rows {
		return fmt.Errorf("sent %d messages of %d: %v", n, rows, err)
	}
	return checkpointSQLite(g.db)(ctx, "")
}

func (g *goqiteQueue) drop(ctx context.Context) {
	if _, err := g.db.ExecContext(ctx, "DROP TABLE IF EXISTS goqite"); err != nil {
		fmt.Fprintf(os.Stderr, "peers: drop goqite: %v\n", err)
	}
}

func (g *goqiteQueue) count(ctx context.Context) (n int, err error) {
	err = g.db.QueryRowContext(ctx, "SELECT count(*) FROM goqite WHERE queue = ?", g.name).Scan(&n)
	return n, err
}

// check: Delete removes the message, so a drained queue is empty.
func (g *goqiteQueue) check(ctx context.Context, _ int) error {
	left, err := g.count(ctx)
	if err == nil && left != 0 {
		err = fmt.Errorf("%d messages left in goqite after the drain", left)
	}
	return err
}

// drain runs workers goroutines, each looping on ReceiveAndWait, the handler, Delete:
// goqite's queue API used directly. Its jobs.Runner would be slower here: it receives on
// one goroutine, and at its job limit it sleeps a poll interval before receiving again.
// goqite.Receive takes one message per call; there is no batch receive.
func (g *goqiteQueue) drain(ctx context.Context, workers, rows int) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	l := newLatch(rows)
	tl := newTally(rows, l)
	q := g.queue()
	// wctx ends the workers once the latch has closed; their Deletes use ctx, so none is
	// cut off mid-way.
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	m := startMeter(nil)
	for range workers {
		wg.Go(func() {
			for {
				msg, err := q.ReceiveAndWait(wctx, g.poll)
				if err != nil {
					if wctx.Err() == nil {
						l.fail(fmt.Errorf("receive: %w", err))
					}
					return
				}
				l.begin()
				tl.handle(seqOf(msg.Body))
				if err := q.Delete(ctx, msg.ID); err != nil {
					l.fail(fmt.Errorf("delete %s: %w", msg.ID, err))
					return
				}
				l.settled()
			}
		})
	}
	took, err := l.wait(ctx)
	r := m.stop(rows, took, tl.handledIn())
	stop()
	wg.Wait()
	if err != nil {
		return result{}, err
	}
	return r, tl.check()
}
