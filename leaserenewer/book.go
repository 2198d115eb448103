// Package leaserenewer keeps the leases of a lease-form subscription alive.
//
// The Book records each lease in work and its current token. A renewer actor extends every
// lease in the book each half lease, in one statement, and moves each token forward; a
// delivery checks its lease out of the book to settle, waiting for an extension of its own
// row that is in flight, so a settlement never races the renewer with a stale token.
package leaserenewer

import (
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// Expiry is the lease expiry (the token) for a claim or extension made at now: now + lease
// rounded up to a whole second, so every temporal column type stores the token exactly.
func Expiry(now time.Time, lease time.Duration) time.Time {
	t := now.Add(lease)
	if r := t.Truncate(time.Second); !r.Equal(t) {
		return r.Add(time.Second)
	}
	return t
}

// Book is the set of leases a subscription holds, with their current tokens.
type Book struct {
	mu     sync.Mutex
	moved  sync.Cond // signalled when an extension round ends
	leases map[int64]*entry
}

type entry struct {
	token     time.Time
	extending bool // an extension round holds this lease's token in flight
	lost      bool // the renewer found another token on the row
}

// NewBook returns an empty book.
func NewBook() *Book {
	b := &Book{leases: make(map[int64]*entry)}
	b.moved.L = &b.mu
	return b
}

// Add records a claimed lease.
func (b *Book) Add(id int64, token time.Time) {
	b.mu.Lock()
	b.leases[id] = &entry{token: token}
	b.mu.Unlock()
}

// Checkout removes a lease from the book and returns its current token, waiting for an
// extension of it that is in flight. lost reports that the renewer already found the row
// under another lease. ok is false when the book does not hold the lease.
func (b *Book) Checkout(id int64) (token time.Time, lost, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		e, found := b.leases[id]
		if !found {
			return time.Time{}, false, false
		}
		if !e.extending {
			delete(b.leases, id)
			return e.token, e.lost, true
		}
		b.moved.Wait()
	}
}

// Len is the number of leases in work.
func (b *Book) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.leases)
}

// begin marks every live lease as being extended and returns them.
func (b *Book) begin() []dialects.Lease {
	b.mu.Lock()
	defer b.mu.Unlock()
	held := make([]dialects.Lease, 0, len(b.leases))
	for id, e := range b.leases {
		if e.lost {
			continue
		}
		e.extending = true
		held = append(held, dialects.Lease{ID: id, Token: e.token})
	}
	return held
}

// end records a round's result: moved leases take the new token; the others lost theirs,
// unless the round failed, in which case every lease keeps its token until the next round.
func (b *Book) end(held []dialects.Lease, until time.Time, moved []int64, failed bool) (lost []int64) {
	set := make(map[int64]struct{}, len(moved))
	for _, id := range moved {
		set[id] = struct{}{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range held {
		e, ok := b.leases[h.ID]
		if !ok {
			continue
		}
		e.extending = false
		if failed {
			continue
		}
		if _, ok := set[h.ID]; ok {
			e.token = until
		} else {
			e.lost = true
			lost = append(lost, h.ID)
		}
	}
	b.moved.Broadcast()
	return lost
}
