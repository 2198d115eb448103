package rowactor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// RetainOption tunes a retention (Broker.Retain).
type RetainOption func(*retainConfig)

type retainConfig struct {
	every time.Duration
	batch int
}

// RetainEvery is how often a retention looks for rows to delete, and how often a broker
// that does not lead tries to (default: a tenth of the keep, between a second and a
// minute).
func RetainEvery(d time.Duration) RetainOption { return func(c *retainConfig) { c.every = d } }

// RetainBatch is how many rows one statement deletes (default 1,000): short statements
// hold short locks.
func RetainBatch(n int) RetainOption { return func(c *retainConfig) { c.batch = n } }

// DefaultRetainBatch is RetainBatch's default.
const DefaultRetainBatch = 1000

// Retention deletes one table's old finished rows while its broker runs (Broker.Retain).
type Retention struct {
	table   string
	leading atomic.Bool
	deleted atomic.Int64
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
}

// Leading reports whether this broker leads the table's retention now: one broker at a
// time does, across every process on the database (on SQLite, within the process).
func (r *Retention) Leading() bool { return r.leading.Load() }

// Deleted is how many rows this broker's retention deleted so far.
func (r *Retention) Deleted() int64 { return r.deleted.Load() }

// Stop ends the retention and gives its leadership up, so that another broker leads;
// Shutdown stops it too.
func (r *Retention) Stop() { r.stop() }

func (r *Retention) stop() {
	r.once.Do(r.cancel)
	<-r.done
}

// Retain deletes t's finished rows (processed_at set) older than keep, in batches, for
// as long as the broker runs. One broker at a time does it, across every process on the
// database: the brokers elect a leader through a session lock (PostgreSQL's advisory
// locks, MySQL's GET_LOCK), handed over when its holder stops or dies. On SQLite the
// leader is elected within the process; processes sharing a file each delete, which
// their batches tolerate. Each statement deletes at most RetainBatch rows and waits for
// no lock. The rowactor.retention.deleted counter counts what it deleted.
//
// The table must have a processed_at column (a table without one deletes its rows at
// their ack). For a large table, index processed_at for the finished rows (see
// docs/operations.md).
func (b *Broker) Retain(ctx context.Context, t Table, keep time.Duration, opts ...RetainOption) (*Retention, error) {
	cfg := retainConfig{every: min(max(keep/10, time.Second), time.Minute), batch: DefaultRetainBatch}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case t.ProcessedAt == "":
		return nil, &ConfigError{Table: t.Name, Option: "Table.ProcessedAt",
			Reason: "retention deletes finished rows, and a table without processed_at deletes its rows at their ack",
			Fix:    "name the processed_at column (rowactor.Schema renders it), or drop Retain"}
	case keep <= 0:
		return nil, &ConfigError{Table: t.Name, Option: "Retain", Reason: fmt.Sprintf("keep %v is not positive", keep),
			Fix: "keep finished rows for a positive duration"}
	case cfg.every <= 0:
		return nil, &ConfigError{Table: t.Name, Option: "RetainEvery", Reason: fmt.Sprintf("interval %v is not positive", cfg.every),
			Fix: "give RetainEvery a positive interval, or leave it out"}
	case cfg.batch <= 0:
		return nil, &ConfigError{Table: t.Name, Option: "RetainBatch", Reason: fmt.Sprintf("batch %d is not positive", cfg.batch),
			Fix: "give RetainBatch a positive number of rows, or leave it out"}
	}
	el, ok1 := b.d.(dialects.Elector)
	rt, ok2 := b.d.(dialects.Retainer)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("rowactor: the %s dialect cannot retain rows (dialects.Elector, dialects.Retainer)", b.d.Name())
	}
	if _, err := rt.DeleteProcessed(ctx, t, time.Now(), 0); err != nil { // the description, checked
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	r := &Retention{table: t.Name, cancel: cancel, done: make(chan struct{})}
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		cancel()
		return nil, fmt.Errorf("rowactor: retain table %s: %w", t.Name, ErrClosed)
	}
	b.retentions = append(b.retentions, r)
	b.mu.Unlock()
	go b.retain(rctx, r, el, rt, t, keep, cfg)
	return r, nil
}

// retain is a retention's loop: lead, or try to; while leading, delete a batch at a time
// until a batch comes back short, then wait for the next round.
func (b *Broker) retain(ctx context.Context, r *Retention, el dialects.Elector, rt dialects.Retainer, t Table, keep time.Duration, cfg retainConfig) {
	defer close(r.done)
	var lead dialects.Leadership
	resign := func() {
		if lead == nil {
			return
		}
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := lead.Resign(rctx); err != nil {
			b.log.Warn("rowactor: retention could not resign its leadership; its session was closed",
				"table", t.Name, "error", err)
		}
		cancel()
		lead = nil
		r.leading.Store(false)
	}
	defer resign()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if lead != nil {
			if err := lead.Alive(ctx); err != nil {
				b.log.Warn("rowactor: retention lost its leadership", "table", t.Name, "error", err)
				resign()
			}
		}
		if lead == nil {
			l, ok, err := el.Lead(ctx, "retain:"+t.Name)
			if err != nil && ctx.Err() == nil {
				b.log.Warn("rowactor: retention could not run for leadership", "table", t.Name, "error", err)
			}
			if ok {
				lead = l
				r.leading.Store(true)
			}
		}
		for first := true; lead != nil && ctx.Err() == nil; first = false {
			// The deletes run on other connections than the leadership's: check it before
			// each batch, or a leader whose session ended would go on deleting beside the
			// next one for as many batches as it has left.
			if !first {
				if err := lead.Alive(ctx); err != nil {
					if ctx.Err() == nil {
						b.log.Warn("rowactor: retention lost its leadership", "table", t.Name, "error", err)
					}
					resign()
					break
				}
			}
			n, err := rt.DeleteProcessed(ctx, t, time.Now().Add(-keep), cfg.batch)
			if n > 0 {
				r.deleted.Add(n)
				b.tel.RetentionDeleted(ctx, t.Name, n)
			}
			if err != nil {
				if ctx.Err() == nil {
					b.log.Warn("rowactor: retention could not delete finished rows", "table", t.Name, "error", err)
				}
				break
			}
			if n < int64(cfg.batch) {
				break
			}
		}
		timer.Reset(cfg.every)
	}
}
