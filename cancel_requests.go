package rowactor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// A cancel of a row in work in another process goes through the table's cancel-request
// table (Table.CancelRequests; dialects.CancelRequests says who writes what). Here are
// both ends: cancelElsewhere records a request and waits for its answer, and a
// cancelWatch per table reads the requests while this broker holds rows of the table.

// cancelWatchEvery is how often a broker holding rows of a table reads its requests: a
// request is seen within this, and the handler's context cancelled at once.
const cancelWatchEvery = 500 * time.Millisecond

// cancelAskEvery is how often a waiting Cancel looks for its answer, and for the row
// having left work.
const cancelAskEvery = 50 * time.Millisecond

// cancelAnswerWait is how long a Cancel that saw the row end waits for the holder's
// answer, which follows its settlement, before it reports the row as ended.
const cancelAnswerWait = 2 * time.Second

// checkCancelRequests refuses, before anything is claimed, a table whose cancel-request
// table the dialect cannot serve or cannot read.
func (b *Broker) checkCancelRequests(ctx context.Context, t Table) (*dialects.CancelRequests, error) {
	reqs, err := dialects.CancelRequestsOf(b.d, t)
	if err != nil {
		return nil, err
	}
	if _, err := reqs.Pending(ctx); err != nil {
		return nil, &ConfigError{Table: t.Name, Option: "Table.CancelRequests", Reason: "the cancel-request table cannot be read", Err: err,
			Fix: "create it with Broker.ApplySchema (or the CREATE TABLE that Schema renders)"}
	}
	return reqs, nil
}

// cancelElsewhere records a cancel of row id, which another process or broker holds, and
// waits until the holder answers, or the row leaves work and is cancelled in its queue,
// or ctx ends. The request stays recorded when ctx ends first.
func (b *Broker) cancelElsewhere(ctx context.Context, t Table, id int64, reason string, jc dialects.JobController) error {
	reqs, err := dialects.CancelRequestsOf(b.d, t)
	if err != nil {
		return err
	}
	if err := reqs.Request(ctx, id, reason); err != nil {
		return err
	}
	forget := func() { _ = reqs.Forget(context.WithoutCancel(ctx), id) }
	var ended time.Time // when the row was first seen finished or gone
	for {
		answer, err := reqs.Read(ctx, id)
		if err != nil && ctx.Err() == nil {
			return err
		}
		switch answer {
		case dialects.CancelAnswerCancelled:
			forget()
			return nil
		case dialects.CancelAnswerFinished:
			forget()
			return fmt.Errorf("rowactor: cancel row %d of %s: its delivery in another process settled it first: %w", id, t.Name, ErrFinished)
		}
		if ctx.Err() == nil {
			err = jc.Cancel(ctx, t, id, b.now(), reason)
			switch {
			case err == nil: // it left work, and was cancelled where it queued
				forget()
				return nil
			case errors.Is(err, ErrInWork):
			case errors.Is(err, ErrFinished) || errors.Is(err, ErrNotFound):
				// Ended by the holder's cancel, whose answer follows its settlement, or by
				// its own settlement before the holder saw the request.
				if ended.IsZero() {
					ended = time.Now()
				} else if time.Since(ended) > cancelAnswerWait {
					forget()
					return err
				}
			default:
				if ctx.Err() == nil {
					return err
				}
			}
		}
		select {
		case <-time.After(cancelAskEvery):
		case <-b.stopping:
			// Shutdown waits for calls in flight: this one must not hold it.
			return fmt.Errorf("rowactor: cancel row %d of %s: the broker shuts down; the request stays in %s and the row ends cancelled once its holder reads it: %w",
				id, t.Name, t.CancelRequests, ErrClosed)
		case <-ctx.Done():
			return fmt.Errorf("rowactor: cancel row %d of %s: it is in work in another process, which has not answered yet; "+
				"the request stays in %s and the row ends cancelled once its holder reads it: %w (%w)", id, t.Name, t.CancelRequests, ErrInWork, ctx.Err())
		}
	}
}

// cancelWatch reads a table's cancel requests every cancelWatchEvery while this broker
// holds rows of the table, and cancels the deliveries it holds.
type cancelWatch struct {
	b    *Broker
	t    Table
	reqs *dialects.CancelRequests
	stop context.CancelFunc
	done chan struct{}

	serving sync.WaitGroup
	mu      sync.Mutex
	busy    map[int64]bool // requests being served
	warned  bool           // a failed read was logged
}

// watchCancels starts t's watch unless it runs. Called under b.mu.
func (b *Broker) watchCancels(t Table, reqs *dialects.CancelRequests) {
	if b.cancelWatches[t.Name] != nil {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	w := &cancelWatch{b: b, t: t, reqs: reqs, stop: stop, done: make(chan struct{}), busy: map[int64]bool{}}
	if b.cancelWatches == nil {
		b.cancelWatches = map[string]*cancelWatch{}
	}
	b.cancelWatches[t.Name] = w
	go w.run(ctx)
}

// end stops the watch and waits for the cancels it serves: their waits end with it.
func (w *cancelWatch) end() {
	w.stop()
	<-w.done
}

func (w *cancelWatch) run(ctx context.Context) {
	defer close(w.done)
	defer w.serving.Wait()
	tick := time.NewTicker(cancelWatchEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !w.b.holdsRowsOf(w.t.Name) {
			continue
		}
		pending, err := w.reqs.Pending(ctx)
		if err != nil {
			if ctx.Err() == nil && !w.warned {
				w.warned = true
				w.b.log.Warn("rowactor: reading the cancel requests failed; rows in work here are not cancelled from other processes until a read succeeds",
					"table", w.t.Name, "cancel_requests", w.t.CancelRequests, "error", err)
			}
			continue
		}
		w.warned = false
		for _, r := range pending {
			w.serve(ctx, r)
		}
	}
}

// serve cancels the delivery of this broker holding the request's row, if one does, and
// answers once it settled. A row that no delivery here holds is left to its holder, or
// to the Cancel waiting for it to leave work.
func (w *cancelWatch) serve(ctx context.Context, r dialects.CancelRequest) {
	w.mu.Lock()
	if w.busy[r.ID] {
		w.mu.Unlock()
		return
	}
	w.busy[r.ID] = true
	w.mu.Unlock()
	w.serving.Add(1)
	go func() {
		defer w.serving.Done()
		defer func() {
			w.mu.Lock()
			delete(w.busy, r.ID)
			w.mu.Unlock()
		}()
		held, _, err := w.b.cancelInWork(ctx, w.t, r.ID, r.Reason)
		var answer string
		switch {
		case !held:
			return
		case err == nil:
			answer = dialects.CancelAnswerCancelled
		case errors.Is(err, ErrFinished):
			answer = dialects.CancelAnswerFinished
		default:
			return // the watch ended before the settlement, or Shutdown released the row
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := w.reqs.Answer(actx, r.ID, answer); err != nil {
			w.b.log.Warn("rowactor: answering a cancel request failed; the asker finds the row ended by itself",
				"table", w.t.Name, "id", r.ID, "error", err)
		}
	}()
}

// holdsRowsOf reports whether a subscription of this broker holds rows of table.
func (b *Broker) holdsRowsOf(table string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.subs {
		if s.table.Name == table && s.run.InWork() > 0 {
			return true
		}
	}
	return false
}
