package actors

import (
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/rowactor/rowactor/dialects"
)

// The service's own code never breaks the runtime. The runtime calls functions of the
// service's on its actors: the WorkersByKey key function (on the subscription actor, as a
// claimed row is taken in), the WithOnSettled hook (as each delivery ends), the retry
// policy (the root package wraps it: safePolicy). A panic in one stays with its one row,
// as a handler's does (callHandler): it is recovered where the call is made and logged
// with its stack, the row is released or set aside, and every other row goes on. A panic
// left to Proto.Actor would restart the subscription actor with fresh state while the
// deliveries it owns are in work: rows handled twice at once, rows leased to nobody, in-work
// counts lost. As a last guard, a panic of rowactor's own code in the subscription actor
// stops it, releasing every row it holds, instead (survive).

// logPanic logs a panic of the service's code (or of rowactor's) with its stack.
func logPanic(log *slog.Logger, msg string, v any, attrs ...any) {
	attrs = append(attrs, slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
	log.Error(msg, attrs...)
}

// report tells the OnSettled hook what became of a delivery. A hook that panics is
// logged with its stack, and the delivery ends as if it had returned: its worker and its
// in-work count are given back (a hook that panicked once used to leave the drain waiting
// for a delivery that had ended).
func (s *Subscription) report(r Result) {
	if s.cfg.OnSettled == nil {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			logPanic(s.cfg.Log, "rowactor: the WithOnSettled hook panicked; the delivery ended all the same", v,
				slog.String("table", s.cfg.Table), slog.String("queue", s.cfg.QueueName), slog.Int64("id", r.Row.ID),
				slog.String("step", r.Step.String()))
		}
	}()
	s.cfg.OnSettled(r)
}

// keyPanic is a WorkersByKey key function's panic on one row.
type keyPanic struct {
	id    int64
	value any
}

func (k *keyPanic) Error() string {
	return fmt.Sprintf("rowactor: the WorkersByKey key function panicked on row %d: %v; the row was released, "+
		"and is set aside at its next claim", k.id, k.value)
}

// keyOf reads a claimed row's partition key (WorkersByKey). A key function that panics on
// the row returns the panic (logged with its stack): the row cannot be placed among the
// keys, so it is not started.
func (s *Subscription) keyOf(row dialects.Row) (key string, kp *keyPanic) {
	defer func() {
		if v := recover(); v != nil {
			logPanic(s.cfg.Log, "rowactor: the WorkersByKey key function panicked; the row is released and set aside at its next claim", v,
				slog.String("table", s.cfg.Table), slog.String("queue", s.cfg.QueueName), slog.Int64("id", row.ID))
			kp = &keyPanic{id: row.ID, value: v}
		}
	}()
	return s.cfg.KeyOf(row), nil
}

// survive is the subscription actor's last guard: a panic of rowactor's own code in it
// must not reach Proto.Actor, whose supervision would restart the actor with its state
// lost while the deliveries it owns are in work. The panic is logged with its stack and
// the actor stops instead, releasing every row it holds as Shutdown does: the subscription
// ends, visibly, rather than forgetting its rows.
func (a *subscriptionActor) survive(c actor.Context) {
	v := recover()
	if v == nil {
		return
	}
	cfg := &a.s.cfg
	logPanic(cfg.Log, "rowactor: the subscription actor panicked; it stops, releasing the rows it holds, and claims no more", v,
		slog.String("table", cfg.Table), slog.String("queue", cfg.QueueName), slog.String("message", fmt.Sprintf("%T", c.Message())))
	switch c.Message().(type) {
	case *actor.Stopping, *actor.Stopped:
		return // stopping already
	}
	c.Stop(c.Self())
}
