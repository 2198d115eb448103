package actors

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

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
