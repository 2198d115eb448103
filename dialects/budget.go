package dialects

import "sync"

// Budget is the connections a pool can spare for rowactor's claims and for deliveries
// that hold a connection: row lock claims, advisory sessions and transactional
// deliveries. Every subscription on the pool shares it.
//
// It exists because each subscription used to budget the pool's size less one for
// itself. Two subscriptions on one pool could then ask for twice what it has, and two
// advisory claims, each holding some sessions while waiting for more, deadlocked the
// pool.
//
// A subscription takes connections before it claims, and gives them back as its claims
// and deliveries end. It never waits: one that finds none queues, and connections given
// back go to the queue first, in order, so every subscription on the pool makes
// progress.
type Budget struct {
	mu    sync.Mutex
	limit int
	// size, when set, reads the limit again at each Take, so a pool resized while it
	// runs, by database/sql's SetMaxOpenConns, is followed at once.
	size  func() int
	used  int
	queue []*BudgetShare
}

// NewBudget returns a budget of limit connections, at least one.
func NewBudget(limit int) *Budget { return &Budget{limit: max(limit, 1)} }

var (
	budgetsMu sync.Mutex
	budgets   = map[any]*Budget{}
)

// BudgetFor returns the budget of pool, with its limit set to limit, so a pool resized
// since is followed. Every dialect made on the pool shares it; two brokers on one pool
// share it too.
func BudgetFor(pool any, limit int) *Budget {
	budgetsMu.Lock()
	b := budgets[pool]
	if b == nil {
		b = NewBudget(limit)
		budgets[pool] = b
	}
	budgetsMu.Unlock()
	b.mu.Lock()
	b.limit = max(limit, 1)
	woken := b.handOut()
	b.mu.Unlock()
	for _, w := range woken {
		w.wake()
	}
	return b
}

// BudgetSized is BudgetFor for a pool whose size can change while it runs: size is read
// at every Take.
func BudgetSized(pool any, size func() int) *Budget {
	b := BudgetFor(pool, size())
	b.mu.Lock()
	b.size = size
	b.mu.Unlock()
	return b
}

// ForgetBudget drops pool's budget, for a dialect that closes the pool it made.
func ForgetBudget(pool any) {
	budgetsMu.Lock()
	delete(budgets, pool)
	budgetsMu.Unlock()
}

// BudgetShare is one subscription's part of a budget.
type BudgetShare struct {
	b *Budget
	// wake is called when connections were handed to the share while it waited. It is
	// called on the releasing goroutine, never under the budget's lock.
	wake    func()
	granted int // handed over while queued, not yet taken
	queued  bool
	held    int // taken and not yet given back
}

// Share returns a new share of the budget; wake tells its subscription that connections
// were handed to it.
func (b *Budget) Share(wake func()) *BudgetShare { return &BudgetShare{b: b, wake: wake} }

// Take takes up to n connections without waiting and returns how many it got. A share
// that gets none joins the queue: wake is called when connections are handed to it.
func (s *BudgetShare) Take(n int) int {
	if n <= 0 {
		return 0
	}
	b := s.b
	b.mu.Lock()
	if b.size != nil {
		b.limit = max(b.size(), 1)
	}
	got := min(s.granted, n)
	s.granted -= got
	if got < n && len(b.queue) == 0 {
		k := min(b.limit-b.used, n-got)
		if k > 0 {
			b.used += k
			got += k
		}
	}
	s.held += got
	if got == 0 && !s.queued {
		s.queued = true
		b.queue = append(b.queue, s)
	}
	woken := b.handOut() // a pool grown since may leave room for the queue
	b.mu.Unlock()
	for _, w := range woken {
		w.wake()
	}
	return got
}

// Give gives n connections back; they go to the shares queued first.
func (s *BudgetShare) Give(n int) {
	if n <= 0 {
		return
	}
	b := s.b
	b.mu.Lock()
	n = min(n, s.held)
	s.held -= n
	b.used -= n
	woken := b.handOut()
	b.mu.Unlock()
	for _, w := range woken {
		w.wake()
	}
}

// Keeps reports whether a connection the share holds may pass from one of its rows to
// its next without going back to the budget: only while no share waits in the queue
// (given back, it would go to the first of them) and the budget is within its limit (a
// pool shrunk since takes it back).
func (s *BudgetShare) Keeps() bool {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.size != nil {
		b.limit = max(b.size(), 1)
	}
	return len(b.queue) == 0 && b.used <= b.limit
}

// Unused gives back what was handed to the share while it waited and was not taken,
// because its subscription found nothing to claim.
func (s *BudgetShare) Unused() {
	b := s.b
	b.mu.Lock()
	b.used -= s.granted
	s.granted = 0
	woken := b.handOut()
	b.mu.Unlock()
	for _, w := range woken {
		w.wake()
	}
}

// Close gives back everything the share holds and leaves the queue, when its
// subscription stopped. The connections of its claims and deliveries are then closed or
// back in the pool.
func (s *BudgetShare) Close() {
	b := s.b
	b.mu.Lock()
	b.used -= s.held + s.granted
	s.held, s.granted = 0, 0
	if s.queued {
		s.queued = false
		for i, q := range b.queue {
			if q == s {
				b.queue = append(b.queue[:i], b.queue[i+1:]...)
				break
			}
		}
	}
	woken := b.handOut()
	b.mu.Unlock()
	for _, w := range woken {
		w.wake()
	}
}

// handOut hands free connections to the queued shares, one each in turn; it returns the
// shares to wake. b.mu is held.
func (b *Budget) handOut() []*BudgetShare {
	var woken []*BudgetShare
	for b.used < b.limit && len(b.queue) > 0 {
		s := b.queue[0]
		b.queue = b.queue[1:]
		s.queued = false
		s.granted++
		b.used++
		woken = append(woken, s)
	}
	return woken
}
