package dialects

import "testing"

// TestBudgetHandsConnectionsToTheQueueFirst: a subscription that found the budget spent
// gets the next connection given back, not the subscription that gave it back and claims
// again at once; so every subscription on a pool makes progress.
func TestBudgetHandsConnectionsToTheQueueFirst(t *testing.T) {
	b := NewBudget(3)
	woken := 0
	a := b.Share(func() {})
	other := b.Share(func() { woken++ })
	if got := a.Take(5); got != 3 {
		t.Fatalf("first share took %d of a budget of 3", got)
	}
	if got := other.Take(1); got != 0 {
		t.Fatalf("second share took %d from a spent budget", got)
	}
	a.Give(1)
	if woken != 1 {
		t.Fatalf("the waiting share was woken %d times, want 1", woken)
	}
	if got := a.Take(1); got != 0 {
		t.Fatal("the share that gave a connection back took it again before the waiting share")
	}
	if got := other.Take(2); got != 1 {
		t.Fatalf("the waiting share took %d, want the 1 handed to it", got)
	}
	// The first share waits now; the second gives back what it does not need.
	other.Give(1)
	if got := a.Take(1); got != 1 {
		t.Fatalf("first share got %d after the second gave back", got)
	}
	a.Close()
	other.Close()
	if b.used != 0 || len(b.queue) != 0 {
		t.Fatalf("after both shares closed: used %d, queue %d", b.used, len(b.queue))
	}
}

// TestBudgetUnusedPassesAHandedConnectionOn: a share woken with a connection it no longer
// needs gives it to the next in the queue.
func TestBudgetUnusedPassesAHandedConnectionOn(t *testing.T) {
	b := NewBudget(1)
	var order []string
	a := b.Share(func() { order = append(order, "a") })
	x := b.Share(func() { order = append(order, "x") })
	y := b.Share(func() { order = append(order, "y") })
	if a.Take(1) != 1 || x.Take(1) != 0 || y.Take(1) != 0 {
		t.Fatal("setup")
	}
	a.Give(1)
	x.Unused()
	if len(order) != 2 || order[0] != "x" || order[1] != "y" {
		t.Fatalf("woken %v, want [x y]", order)
	}
	if y.Take(1) != 1 {
		t.Fatal("y did not get the connection x passed on")
	}
	if got := BudgetFor(b, 5); got != BudgetFor(b, 5) || got.limit != 5 {
		t.Fatal("BudgetFor does not return one budget per pool")
	}
	ForgetBudget(b)
}
