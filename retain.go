package rowactor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// RetainOption tunes a retention started by Broker.Retain or Broker.RetainDeadLetters.
type RetainOption func(*retainConfig)

type retainConfig struct {
	every time.Duration
	batch int
}

// RetainEvery is how often a retention looks for rows to delete, and how often a broker
// that does not lead tries to. It defaults to a tenth of the keep, between a second and a
// minute.
func RetainEvery(d time.Duration) RetainOption { return func(c *retainConfig) { c.every = d } }

// RetainBatch is how many rows one statement deletes. It defaults to
// DefaultRetainBatch, 1,000: short statements hold short locks.
func RetainBatch(n int) RetainOption { return func(c *retainConfig) { c.batch = n } }

// DefaultRetainBatch is RetainBatch's default.
const DefaultRetainBatch = 1000

// Retention deletes one table's old finished rows, or one dead-letter group's old dead
// letters, while its broker runs. Broker.Retain and Broker.RetainDeadLetters start one.
type Retention struct {
	table   string
	group   string // the dead-letter group; "" for finished rows
	leading atomic.Bool
	deleted atomic.Int64
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
}

// Leading reports whether this broker led the latest round of the retention. One broker
// at a time does, across every process on the database; on SQLite, within the process.
func (r *Retention) Leading() bool { return r.leading.Load() }

// Deleted is how many rows this broker's retention deleted so far. It is counted when
// each round ends, so a round's rows are gone from the table a moment before they are
// counted.
func (r *Retention) Deleted() int64 { return r.deleted.Load() }

// Stop ends the retention; a round in progress ends with its current statement.
// Shutdown stops it too.
func (r *Retention) Stop() { r.stop() }

func (r *Retention) stop() {
	r.once.Do(r.cancel)
	<-r.done
}

// Retain deletes t's finished rows, those with processed_at set, older than keep, for as
// long as the broker runs. The table must have a processed_at column; a table without one
// deletes its rows at their ack. Every group of the table is retained.
//
// Every RetainEvery each broker retaining the table tries a round, and one at a time,
// across every process on the database, gets it. The round holds a session lock, taken
// without waiting, on the one pool connection its statements run on. So a round needs a
// connection only while it runs, and a session that dies takes its round with it. On
// SQLite the rounds take turns within the process; processes sharing a file each delete,
// which the batches tolerate.
//
// Each statement deletes at most RetainBatch rows and waits for no row lock. The
// rowactor.retention.deleted counter counts what was deleted. For a large table, index
// processed_at for the finished rows: see docs/operations.md.
func (b *Broker) Retain(ctx context.Context, t Table, keep time.Duration, opts ...RetainOption) (*Retention, error) {
	if err := dialects.CheckRetain(t); err != nil {
		return nil, err
	}
	rt, ok := b.d.(dialects.Retainer)
	if !ok {
		return nil, fmt.Errorf("rowactor: the %s dialect cannot retain rows (dialects.Retainer)", b.d.Name())
	}
	round := func(ctx context.Context, before time.Time, limit int) (int64, bool, error) {
		return rt.RetainRound(ctx, t, "retain:"+t.Name, before, limit)
	}
	return b.startRetention(ctx, t, "", keep, round, opts)
}

// RetainDeadLetters deletes the rows of t's dead-letter group that died longer than keep
// ago, for as long as the broker runs. These are the rows a subscription's DeadLetterGroup
// moved there, dated by the time the move wrote into t's DeadAt column. The table must
// describe DeadAt and Group; Schema renders the column and the index the deletes read.
//
// It runs as Retain does, with the same options and one round at a time across processes,
// under a lock of its own, so it never waits for the table's Retain. It deletes the oldest
// deaths first. It leaves rows whose DeadAt is NULL, moved before the column was
// described, and rows a subscription of the group holds. A requeue clears DeadAt, so a row
// moved back and dead again is kept keep from its second death.
//
// The rowactor.retention.deleted counter counts its rows with the group as
// rowactor.queue. See docs/operations.md.
func (b *Broker) RetainDeadLetters(ctx context.Context, t Table, group string, keep time.Duration, opts ...RetainOption) (*Retention, error) {
	if err := dialects.CheckRetainDeadLetters(t, group); err != nil {
		return nil, err
	}
	rt, ok := b.d.(dialects.DeadLetterRetainer)
	if !ok {
		return nil, fmt.Errorf("rowactor: the %s dialect cannot retain dead letters (dialects.DeadLetterRetainer)", b.d.Name())
	}
	round := func(ctx context.Context, before time.Time, limit int) (int64, bool, error) {
		return rt.RetainDeadLetters(ctx, t, group, "retain-dead:"+t.Name+":"+group, before, limit)
	}
	return b.startRetention(ctx, t, group, keep, round, opts)
}

// retainRound is one round of a retention: it deletes rows older than before, limit a
// statement; a limit of 0 checks the description against the live table.
type retainRound func(ctx context.Context, before time.Time, limit int) (deleted int64, led bool, err error)

// startRetention checks a retention of t and starts its loop. The retention is of t's
// dead-letter group group, or of its finished rows when group is "".
func (b *Broker) startRetention(ctx context.Context, t Table, group string, keep time.Duration, round retainRound, opts []RetainOption) (*Retention, error) {
	cfg := retainConfig{every: min(max(keep/10, time.Second), time.Minute), batch: DefaultRetainBatch}
	for _, o := range opts {
		o(&cfg)
	}
	option, what, again := "Retain", "finished rows", "call Retain once per table and broker (Stop the first to change its keep)"
	if group != "" {
		option, what = "RetainDeadLetters", "dead letters"
		again = "call RetainDeadLetters once per table, group and broker (Stop the first to change its keep)"
	}
	switch {
	case keep <= 0:
		return nil, &ConfigError{Table: t.Name, Option: option, Reason: fmt.Sprintf("keep %v is not positive", keep),
			Fix: "keep " + what + " for a positive duration"}
	case cfg.every <= 0:
		return nil, &ConfigError{Table: t.Name, Option: "RetainEvery", Reason: fmt.Sprintf("interval %v is not positive", cfg.every),
			Fix: "give RetainEvery a positive interval, or leave it out"}
	case cfg.batch <= 0:
		return nil, &ConfigError{Table: t.Name, Option: "RetainBatch", Reason: fmt.Sprintf("batch %d is not positive", cfg.batch),
			Fix: "give RetainBatch a positive number of rows, or leave it out"}
	}
	if _, _, err := round(ctx, b.now(), 0); err != nil { // the description, checked
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	r := &Retention{table: t.Name, group: group, cancel: cancel, done: make(chan struct{})}
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		cancel()
		return nil, fmt.Errorf("rowactor: retain %s of table %s: %w", what, t.Name, ErrClosed)
	}
	for _, other := range b.retentions {
		if other.table == t.Name && other.group == group {
			b.mu.Unlock()
			cancel()
			reason := "the broker retains the table already"
			if group != "" {
				reason = fmt.Sprintf("the broker retains dead-letter group %q of the table already", group)
			}
			return nil, &ConfigError{Table: t.Name, Option: option, Reason: reason, Fix: again}
		}
	}
	b.retentions = append(b.retentions, r)
	b.mu.Unlock()
	go b.retain(rctx, r, round, keep, cfg)
	return r, nil
}

// retain is a retention's loop: a round every cfg.every.
func (b *Broker) retain(ctx context.Context, r *Retention, round retainRound, keep time.Duration, cfg retainConfig) {
	defer close(r.done)
	defer b.forgetRetention(r) // a stopped retention's table can be retained again
	defer r.leading.Store(false)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		n, led, err := round(ctx, b.now().Add(-keep), cfg.batch)
		r.leading.Store(led)
		if n > 0 {
			r.deleted.Add(n)
			b.tel.RetentionDeleted(ctx, r.table, r.group, n)
		}
		if err != nil && ctx.Err() == nil {
			if r.group != "" {
				b.log.Warn("rowactor: retention could not delete dead letters", "table", r.table, "group", r.group, "error", err)
			} else {
				b.log.Warn("rowactor: retention could not delete finished rows", "table", r.table, "error", err)
			}
		}
		timer.Reset(cfg.every)
	}
}

// forgetRetention drops r from the broker's retentions, unless Shutdown took them all
// already.
func (b *Broker) forgetRetention(r *Retention) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, other := range b.retentions {
		if other == r {
			b.retentions = append(b.retentions[:i:i], b.retentions[i+1:]...)
			return
		}
	}
}
