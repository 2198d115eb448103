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
	mu    sync.Mutex
	moved sync.Cond // signalled when an extension round ends
	// rows holds the newest lease of each row in work: the only one the renewer extends.
	rows map[int64]*Held
}

// Held is one claim's lease: its row, and the token its claim wrote or its extensions
// moved. A delivery holds it from the claim to the settlement.
type Held struct {
	book  *Book
	id    int64
	token time.Time
	// extending: an extension round holds this lease's token in flight.
	extending bool
	// lost: the row is under another token (the renewer found it so, or a later claim of
	// the row replaced this lease); it never comes back.
	lost bool
	// pinned: a settlement runs with the token; the renewer no longer moves it.
	pinned bool
	// done: the settlement ran; the lease is out of the book.
	done bool
}

// NewBook returns an empty book.
func NewBook() *Book {
	b := &Book{rows: make(map[int64]*Held)}
	b.moved.L = &b.mu
	return b
}

// Add records a claimed lease and returns it. A lease of the same row still in the book
// belongs to an earlier claim, whose lease ran out before this claim could take the row:
// it is lost.
func (b *Book) Add(id int64, token time.Time) *Held {
	h := &Held{book: b, id: id, token: token}
	b.mu.Lock()
	if old := b.rows[id]; old != nil {
		old.lost = true
	}
	b.rows[id] = h
	b.mu.Unlock()
	return h
}

// ID is the lease's row.
func (h *Held) ID() int64 { return h.id }

// Pin stops the lease's renewal for its settlement and returns the lease with its current
// token, waiting for an extension of it that is in flight. lost reports that the lease is
// gone for good (the settlement would change nothing). ok is false when the lease was
// pinned already: it has been (or is being) settled by its delivery.
func (h *Held) Pin() (held dialects.Lease, lost, ok bool) {
	b := h.book
	b.mu.Lock()
	defer b.mu.Unlock()
	for h.extending {
		b.moved.Wait()
	}
	if h.pinned || h.done {
		return dialects.Lease{}, false, false
	}
	h.pinned = true
	return dialects.Lease{ID: h.id, Token: h.token}, h.lost, true
}

// Expired reports whether the lease can no longer be counted on at now: lost to another
// claim, or its token run out (the renewer could not extend it in time, and another claim
// may hold the row already). A row waiting for a worker is not started then.
func (h *Held) Expired(now time.Time) bool {
	b := h.book
	b.mu.Lock()
	defer b.mu.Unlock()
	return h.lost || h.done || !h.token.After(now)
}

// Left is how long the lease has before its token runs out at now.
func (h *Held) Left(now time.Time) time.Duration {
	b := h.book
	b.mu.Lock()
	defer b.mu.Unlock()
	return h.token.Sub(now)
}

// Unpin gives a pinned lease back to the renewer, which extends it again: its settlement
// waits (its row is held by another session) and will Pin it again to run. A lease that
// is lost or done stays as it is.
func (h *Held) Unpin() {
	b := h.book
	b.mu.Lock()
	if !h.done {
		h.pinned = false
	}
	b.mu.Unlock()
}

// Done takes the lease out of the book once its settlement ran (whatever its result).
func (h *Held) Done() {
	b := h.book
	b.mu.Lock()
	h.pinned, h.done = true, true
	if b.rows[h.id] == h {
		delete(b.rows, h.id)
	}
	b.mu.Unlock()
}

// len is the number of rows in work under a lease.
func (b *Book) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.rows)
}

// begin marks every live lease (the newest of its row, neither lost nor pinned) as being
// extended and returns them: at most one per row, so a round's result names each by its
// row alone.
func (b *Book) begin() []*Held { return b.beginOf(nil) }

// beginOf is begin for the live leases of the rows in only (every row when only is nil).
func (b *Book) beginOf(only map[int64]struct{}) []*Held {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.rows)
	if only != nil {
		n = min(n, len(only))
	}
	held := make([]*Held, 0, n)
	for id, h := range b.rows {
		if h.lost || h.pinned {
			continue
		}
		if _, want := only[id]; only != nil && !want {
			continue
		}
		h.extending = true
		held = append(held, h)
	}
	return held
}

// leases returns the (row, token) pairs of a round's leases.
func leases(held []*Held) []dialects.Lease {
	out := make([]dialects.Lease, len(held))
	for i, h := range held {
		out[i] = dialects.Lease{ID: h.id, Token: h.token}
	}
	return out
}

// end records a round's result: moved leases take the new token; the others lost theirs,
// unless the round failed, in which case the leases it did not report moved keep their
// tokens until the next round (a lease the failed round moved unseen is found lost then,
// which is safe: its settlement changes nothing and the row returns when the lease ends).
//
// busy names leases the round left alone because another session held their rows' locks
// (dialects.RowsBusyError): they keep their tokens, like those of a failed round.
func (b *Book) end(held []*Held, until time.Time, moved []int64, failed bool, busy []int64) (lost []int64) {
	set := make(map[int64]struct{}, len(moved))
	for _, id := range moved {
		set[id] = struct{}{}
	}
	kept := make(map[int64]struct{}, len(busy))
	for _, id := range busy {
		kept[id] = struct{}{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range held {
		h.extending = false
		if _, ok := set[h.id]; ok {
			if !h.lost {
				h.token = until
			}
			continue
		}
		if _, wait := kept[h.id]; !failed && !wait && !h.lost {
			h.lost = true
			lost = append(lost, h.id)
		}
	}
	b.moved.Broadcast()
	return lost
}
