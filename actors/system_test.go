package actors

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// A system given back is the next borrower's, and Proto.Actor's own records go to that
// borrower's logger, not to the one before.
func TestASystemGivenBackIsLentAgainWithTheNewBorrowersLog(t *testing.T) {
	var first, second bytes.Buffer
	a := TakeSystem(slog.New(slog.NewTextHandler(&first, &slog.HandlerOptions{Level: slog.LevelDebug})))
	pid, err := a.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "lent-system-test")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	a.Give()

	b := TakeSystem(slog.New(slog.NewTextHandler(&second, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer b.Give()
	if b.ActorSystem != a.ActorSystem {
		t.Fatal("TakeSystem made a new system while one was idle")
	}
	// The name the first borrower used is free again.
	if _, err := b.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "lent-system-test"); err != nil {
		t.Fatalf("the first borrower's stopped actor still holds its name: %v", err)
	}
	before := first.Len()
	b.Logger().Info("from the second borrower")
	if first.Len() != before {
		t.Errorf("the first borrower's log got a record after it gave the system back: %q", first.String()[before:])
	}
	if !strings.Contains(second.String(), "from the second borrower") || !strings.Contains(second.String(), "component=protoactor") {
		t.Errorf("the second borrower's log = %q, want the record with component=protoactor", second.String())
	}
	if !strings.Contains(second.String(), "level=DEBUG") {
		t.Errorf("Proto.Actor's INFO record was not demoted to DEBUG: %q", second.String())
	}
}

// A dropped system is never lent again: an actor of its borrower may still run on it.
func TestADroppedSystemIsNotLentAgain(t *testing.T) {
	a := TakeSystem(slog.Default())
	a.Drop()
	b := TakeSystem(slog.Default())
	defer b.Give()
	if b.ActorSystem == a.ActorSystem {
		t.Fatal("TakeSystem lent a dropped system")
	}
	if !a.IsStopped() {
		t.Error("Drop left the system running")
	}
}

// registered lists the ids in a process registry.
func registered(r *actor.ProcessRegistryValue) map[string]bool {
	ids := map[string]bool{}
	for _, bucket := range r.LocalPIDs.LocalPIDs {
		for id := range bucket.Items() {
			ids[id] = true
		}
	}
	return ids
}

// A system's process registry is small (the GC scans it in every cycle, and a spawn
// touched a map of its own), and it still holds every actor Proto.Actor registered as the
// system was made, finds the actors spawned on it, and keeps a name unique until its
// actor stops.
func TestASystemsRegistryIsSmallAndHoldsEveryActor(t *testing.T) {
	plain := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(discard{}) }))
	defer plain.Shutdown()
	s := newSystem(slog.Default().Handler())
	defer s.Drop()
	if n := len(s.ProcessRegistry.LocalPIDs.LocalPIDs); n != registryBuckets {
		t.Fatalf("the registry has %d buckets, want %d", n, registryBuckets)
	}
	want, got := registered(plain.ProcessRegistry), registered(s.ProcessRegistry)
	if len(want) == 0 {
		t.Fatal("a new system registers no actor: this test proves nothing of the move")
	}
	for id := range want {
		if !got[id] {
			t.Errorf("Proto.Actor's %q was lost with the big registry", id)
		}
	}
	if len(got) != len(want) {
		t.Errorf("the small registry holds %d actors, a new system %d", len(got), len(want))
	}

	echo := actor.PropsFromFunc(func(c actor.Context) {
		if s, ok := c.Message().(string); ok {
			c.Respond(s)
		}
	})
	var pids []*actor.PID
	for i := range 200 {
		pid, err := s.Root.SpawnNamed(echo, fmt.Sprintf("registry-test-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if _, err := s.Root.SpawnNamed(echo, "registry-test-7"); !errors.Is(err, actor.ErrNameExists) {
		t.Fatalf("a second actor named registry-test-7 spawned: %v", err)
	}
	for i, pid := range pids {
		r, err := s.Root.RequestFuture(pid, fmt.Sprint(i), 5*time.Second).Result()
		if err != nil || r != fmt.Sprint(i) {
			t.Fatalf("actor %d answered %v, %v", i, r, err)
		}
	}
	for _, pid := range pids {
		if err := s.Root.StopFuture(pid).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(registered(s.ProcessRegistry)); n != len(want) {
		t.Errorf("%d actors registered after every spawned one stopped, want %d", n, len(want))
	}
	if _, err := s.Root.SpawnNamed(echo, "registry-test-7"); err != nil {
		t.Fatalf("a stopped actor's name is still taken: %v", err)
	}
	// The move costs next to nothing beside Proto.Actor's 66,700 allocations for a
	// system. Iterating the big registry through cmap's Items started a goroutine and a
	// channel for each of its 32,768 shards: 236,800 allocations, and 26 ms, not 3.
	if n := testing.AllocsPerRun(2, func() { newSystem(discard{}).Shutdown() }); n > 70_000 {
		t.Errorf("making a system took %.0f allocations, want Proto.Actor's 66,700 or so", n)
	}
}
