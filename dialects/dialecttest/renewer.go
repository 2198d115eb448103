package dialecttest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/leaserenewer"
)

// lateAnswer is a lease queue whose next extension runs on the server but whose answer
// comes too late for the renewer: the statement commits, and the caller sees its context
// end, as when this process stalls past the round's timeout with the answer on its way.
type lateAnswer struct {
	dialects.LeaseQueue
	cut atomic.Bool
}

func (q *lateAnswer) ExtendLeases(ctx context.Context, until time.Time, held []dialects.Lease) ([]int64, error) {
	moved, err := q.LeaseQueue.ExtendLeases(ctx, until, held)
	if err == nil && q.cut.CompareAndSwap(true, false) {
		return nil, fmt.Errorf("extend: the answer came after the round's timeout: %w", context.DeadlineExceeded)
	}
	return moved, err
}

// A renewal round whose statement ran but whose answer never reached the renewer must not
// leave the book with the token the row held before: the delivery would settle with it and
// find its own lease lost. The renewer reads the round back while the old token still runs.
func testRenewerReadsBackARoundItDidNotHear(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_readback", leaseTable)
	id := e.publish(tbl, dialects.Message{Payload: []byte("p")})
	q := &lateAnswer{LeaseQueue: e.openLease(dialects.QueueSpec{Table: tbl})}
	// The claim's lease is shorter than the renewer's, so the round writes a later token.
	now := time.Now()
	token := leaserenewer.Expiry(now, 3*time.Second)
	if rows, err := q.ClaimLeases(ctx, now, token, 1); err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", ids(rows), err)
	}
	book := leaserenewer.NewBook()
	lease := book.Add(id, token)

	rounds := make(chan error, 4)
	c, stop := context.WithCancel(ctx)
	defer stop()
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	pid := sys.Root.Spawn(leaserenewer.Props(leaserenewer.Config{
		Queue: q, Book: book, Lease: 10 * time.Second, Now: time.Now, Ctx: c,
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnRound: func(_, _ int, err error) { rounds <- err },
	}))
	defer sys.Root.Stop(pid)
	q.cut.Store(true)
	sys.Root.Send(pid, leaserenewer.RenewNow{})
	select {
	case err := <-rounds:
		if err == nil {
			t.Fatal("the round whose answer was cut reported no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal round")
	}

	held, lost, ok := lease.Pin()
	if lost || !ok {
		t.Fatalf("lease after the round: lost %v, pinned already %v", lost, !ok)
	}
	s, _ := e.state(tbl, id)
	if s.LockedUntil == nil || !s.LockedUntil.After(token) {
		t.Fatalf("the round did not run on the server: locked_until %v, claimed with %v", s.LockedUntil, token)
	}
	sameTime(t, "the book's token", &held.Token, *s.LockedUntil)
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: now}, held); !ok || err != nil {
		t.Fatalf("the delivery's ack with the book's token: %v %v", ok, err)
	}
	lease.Done()
}
