package actors

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	cmap "github.com/orcaman/concurrent-map"
)

// A System is an actor system lent to one broker or relay at a time.
//
// Making an actor system costs about 66,700 allocations and 2.9 MB: Proto.Actor's process
// registry is 1,024 maps of 32 shards each (smallRegistry then moves its few entries into
// 64 shards, and the rest is garbage). Every rowactor.New paid it, 12 ms of CPU here
// (20 ms under the race detector), and a test suite or a short-lived command makes
// hundreds of brokers. So a borrower that stopped every actor it spawned gives its system
// back, and the next TakeSystem in the process reuses it with its own logger. A system
// has no goroutine of its own, so an idle one costs only its memory.
type System struct {
	*actor.ActorSystem
	log *lentLog
}

// keepSystems is how many idle systems the process keeps: about 3 MB each.
const keepSystems = 8

var idleSystems struct {
	sync.Mutex
	free []*System
}

// TakeSystem returns an idle system, or a new one, whose own logging goes through log
// with its INFO chatter (start-up, recoveries, dead letters) demoted to DEBUG.
func TakeSystem(log *slog.Logger) *System {
	idleSystems.Lock()
	var s *System
	if n := len(idleSystems.free); n > 0 {
		s = idleSystems.free[n-1]
		idleSystems.free[n-1] = nil
		idleSystems.free = idleSystems.free[:n-1]
	}
	idleSystems.Unlock()
	if s == nil {
		return newSystem(log.Handler())
	}
	s.log.set(log.Handler())
	return s
}

// Give hands the system back for the next TakeSystem. Call it only when every actor
// spawned on it has stopped, so that the next borrower finds none of its names taken;
// otherwise call Drop.
func (s *System) Give() {
	s.log.set(discard{})
	idleSystems.Lock()
	defer idleSystems.Unlock()
	if len(idleSystems.free) < keepSystems {
		idleSystems.free = append(idleSystems.free, s)
	}
}

// Drop ends the system's use without giving it back: an actor of the borrower may still
// run on it.
func (s *System) Drop() { s.Shutdown() }

func newSystem(h slog.Handler) *System {
	l := &lentLog{}
	l.set(h) // the system logs as it is made
	sys := actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
			return slog.New(demote{lentHandler{l: l}}).With("component", "protoactor")
		}),
		// A dead letter starts a goroutine that sleeps for the throttle interval; keep it short.
		actor.WithDeadLetterThrottleInterval(10*time.Millisecond),
		actor.WithDeadLetterRequestLogging(false),
	)
	smallRegistry(sys.ProcessRegistry)
	return &System{ActorSystem: sys, log: l}
}

// registryBuckets is how many concurrent maps of 32 shards each the process registry
// keeps, where Proto.Actor makes 1,024.
const registryBuckets = 2

// smallRegistry moves the registry's entries (the system's own actors, registered as it
// was made) into registryBuckets buckets, before any goroutine can look one up.
//
// Every delivery actor is added to the registry when spawned and removed when stopped,
// so at most a few thousand are there at once. Spread over 32,768 Go maps, each Add and
// Remove touched a map of its own, out of the CPU's cache, and each grew that map's
// table once: 4.2 MB more after 20,000 rows, on top of the 2.8 MB the maps start with,
// all of it scanned by the garbage collector in every cycle. 64 shards hold the same
// entries in kilobytes, and with GOMAXPROCS goroutines running at once their locks
// seldom meet.
func smallRegistry(r *actor.ProcessRegistryValue) {
	small := &actor.SliceMap{LocalPIDs: make([]cmap.ConcurrentMap, registryBuckets)}
	for i := range small.LocalPIDs {
		small.LocalPIDs[i] = cmap.New()
	}
	for _, bucket := range r.LocalPIDs.LocalPIDs {
		// IterCb, not Items: Items starts a goroutine and a channel for each of the 32,768
		// shards, which took a new system from 3 ms to 26 ms.
		bucket.IterCb(func(id string, p any) { small.GetBucket(id).Set(id, p) })
	}
	r.LocalPIDs = small
}

// lentLog is the handler of the system's current borrower. Proto.Actor asks for its
// logger once, when the system is made.
type lentLog struct{ h atomic.Pointer[slog.Handler] }

func (l *lentLog) set(h slog.Handler) { l.h.Store(&h) }

// lentHandler sends each record to the current borrower's handler, with the attributes
// and groups added to this logger applied in order.
type lentHandler struct {
	l    *lentLog
	wrap []func(slog.Handler) slog.Handler
}

func (h lentHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return (*h.l.h.Load()).Enabled(ctx, l)
}

func (h lentHandler) Handle(ctx context.Context, r slog.Record) error {
	cur := *h.l.h.Load()
	for _, w := range h.wrap {
		cur = w(cur)
	}
	return cur.Handle(ctx, r)
}

func (h lentHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return h.with(func(x slog.Handler) slog.Handler { return x.WithAttrs(a) })
}

func (h lentHandler) WithGroup(n string) slog.Handler {
	return h.with(func(x slog.Handler) slog.Handler { return x.WithGroup(n) })
}

func (h lentHandler) with(w func(slog.Handler) slog.Handler) slog.Handler {
	wrap := append(append(make([]func(slog.Handler) slog.Handler, 0, len(h.wrap)+1), h.wrap...), w)
	return lentHandler{l: h.l, wrap: wrap}
}

// discard is an idle system's handler: a straggling goroutine of its last borrower logs
// nowhere.
type discard struct{}

func (discard) Enabled(context.Context, slog.Level) bool  { return false }
func (discard) Handle(context.Context, slog.Record) error { return nil }
func (d discard) WithAttrs([]slog.Attr) slog.Handler      { return d }
func (d discard) WithGroup(string) slog.Handler           { return d }

// demote turns Proto.Actor's INFO records into DEBUG ones and keeps its warnings.
type demote struct{ slog.Handler }

func (d demote) Enabled(ctx context.Context, l slog.Level) bool {
	if l >= slog.LevelWarn {
		return d.Handler.Enabled(ctx, l)
	}
	return d.Handler.Enabled(ctx, slog.LevelDebug)
}

func (d demote) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		r.Level = slog.LevelDebug
	}
	return d.Handler.Handle(ctx, r)
}

func (d demote) WithAttrs(a []slog.Attr) slog.Handler { return demote{d.Handler.WithAttrs(a)} }
func (d demote) WithGroup(n string) slog.Handler      { return demote{d.Handler.WithGroup(n)} }
