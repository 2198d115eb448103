package rowactor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
// table the dialect cannot serve or cannot read, or whose requests could reach the wrong
// row (dialects.CancelRequestChecker).
func (b *Broker) checkCancelRequests(ctx context.Context, t Table) (*dialects.CancelRequests, error) {
	reqs, err := dialects.CancelRequestsOf(b.d, t)
	if err != nil {
		return nil, err
	}
	if c, ok := b.d.(dialects.CancelRequestChecker); ok {
		if err := c.CheckCancelRequests(ctx, t); err != nil {
			return nil, err
		}
	}
	if _, err := reqs.Pending(ctx); err != nil {
		return nil, &ConfigError{Table: t.Name, Option: "Table.CancelRequests", Reason: "the cancel-request table cannot be read", Err: err,
			Fix: "create it with Broker.ApplySchema (or the CREATE TABLE that Schema renders)"}
	}
	return reqs, nil
}

// cancelElsewhere records a cancel of row id, which another process or broker holds, and
// waits until the holder answers, or the row leaves work, or ctx ends or the broker shuts
// down. It withdraws its request when it returns, answered or not.
//
// The row's state, read each round, tells what became of it when no answer comes:
//   - ended cancelled (by this request's holder, or another asker's): nil;
//   - processed, dead (DeadAt, or moved out of its group), or gone after the answer's
//     wait: its delivery settled it first, ErrFinished;
//   - due or delayed in its group: it left work unsettled (given back, its lease ran
//     out, retried), so it is cancelled where it queues.
func (b *Broker) cancelElsewhere(ctx context.Context, t Table, id int64, reason string, jc dialects.JobController) error {
	reqs, err := dialects.CancelRequestsOf(b.d, t)
	if err != nil {
		return err
	}
	in, ok := b.d.(dialects.Inspector)
	if !ok {
		return fmt.Errorf("rowactor: cancel row %d of %s in another process: the %s dialect cannot inspect rows (dialects.Inspector): %w", id, t.Name, b.d.Name(), ErrInWork)
	}
	asked, err := in.Inspect(ctx, t, id, b.now())
	if err != nil {
		return err
	}
	asker := rand.Int64()
	if err := reqs.Request(ctx, id, asker, reason); err != nil {
		return err
	}
	defer func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = reqs.Forget(fctx, id, asker)
	}()
	ask := &cancelAsk{b: b, t: t, id: id, reason: reason, asker: asker, asked: asked, reqs: reqs, in: in, jc: jc}
	for {
		if done, err := ask.round(ctx); done {
			return err
		}
		select {
		case <-time.After(cancelAskEvery):
		case <-b.stopping:
			// Shutdown waits for calls in flight: this one must not hold it.
			return fmt.Errorf("rowactor: cancel row %d of %s: the broker shuts down before the process holding the row answered; the request is withdrawn: %w",
				id, t.Name, ErrClosed)
		case <-ctx.Done():
			return fmt.Errorf("rowactor: cancel row %d of %s: it is in work in another process, which has not answered yet; "+
				"the request is withdrawn (ask again): %w (%w)", id, t.Name, ErrInWork, ctx.Err())
		}
	}
}

// cancelAsk is a Cancel waiting on another process: its request and what it read of the
// row when it asked.
type cancelAsk struct {
	b      *Broker
	t      Table
	id     int64
	reason string
	asker  int64
	asked  Job
	reqs   *dialects.CancelRequests
	in     dialects.Inspector
	jc     dialects.JobController
	gone   time.Time // when the row was first found gone
}

// round reads the answer, then the row, and tells whether the Cancel is over and how.
func (a *cancelAsk) round(ctx context.Context) (done bool, err error) {
	answer, err := a.reqs.Read(ctx, a.id, a.asker)
	if err != nil && ctx.Err() == nil {
		return true, err
	}
	switch answer {
	case dialects.CancelAnswerCancelled:
		return true, nil
	case dialects.CancelAnswerFinished:
		return true, a.finished()
	}
	if ctx.Err() != nil {
		return false, nil
	}
	j, err := a.in.Inspect(ctx, a.t, a.id, a.b.now())
	switch {
	case errors.Is(err, ErrNotFound):
		// Deleted: acked, moved to a dead-letter table, or cancelled by the holder, whose
		// answer follows its settlement.
		if a.gone.IsZero() {
			a.gone = time.Now()
		} else if time.Since(a.gone) > cancelAnswerWait {
			return true, a.finished()
		}
		return false, nil
	case err != nil:
		return ctx.Err() == nil, err
	case j.State == JobCancelled:
		return true, nil
	case j.State == JobProcessed || j.State == JobDead || j.Group != a.asked.Group || j.NullGroup != a.asked.NullGroup:
		return true, a.finished()
	case j.State == JobDue || j.State == JobDelayed:
		// Out of work in its queue, or held under a row lock, which reads as due: the
		// queued row's cancel refuses a row in work.
		err := cancelQueued(ctx, a.jc, a.t, a.id, a.b.now(), a.reason, a.asked)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, ErrInWork) && !errors.Is(err, ErrFinished) && !errors.Is(err, ErrNotFound) && ctx.Err() == nil {
			return true, err
		}
	}
	return false, nil
}

func (a *cancelAsk) finished() error {
	return fmt.Errorf("rowactor: cancel row %d of %s: its delivery in another process settled it first: %w", a.id, a.t.Name, ErrFinished)
}

// cancelQueued cancels row id where it queues, fenced by the group it was asked in and
// by not being dead where the dialect can (dialects.FencedCanceller): a delivery that
// moved the row to its dead letter between the look and the cancel keeps it there.
func cancelQueued(ctx context.Context, jc dialects.JobController, t Table, id int64, now time.Time, reason string, asked Job) error {
	if fc, ok := jc.(dialects.FencedCanceller); ok {
		return fc.CancelInGroup(ctx, t, id, now, reason, asked.Group, asked.NullGroup)
	}
	return jc.Cancel(ctx, t, id, now, reason)
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
