package actors

import (
	"context"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// NewSystem returns an actor system whose own logging goes through log, with its INFO
// chatter (start-up, recoveries, dead letters) demoted to DEBUG.
func NewSystem(log *slog.Logger) *actor.ActorSystem {
	return actor.NewActorSystem(
		actor.WithLoggerFactory(func(s *actor.ActorSystem) *slog.Logger {
			return slog.New(demote{log.Handler()}).With("component", "protoactor")
		}),
		// A dead letter starts a goroutine that sleeps for the throttle interval; keep it short.
		actor.WithDeadLetterThrottleInterval(10*time.Millisecond),
		actor.WithDeadLetterRequestLogging(false),
	)
}

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
