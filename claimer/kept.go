package claimer

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// Kept holds the advisory candidates a claim read and did not try, for the next claims
// of the subscription's claimers: with fast handlers, claims of one row each would
// otherwise each pay a read of their own, which on SQLite costs about as much as the
// take, and on a server a round trip. One Kept serves all of a subscription's
// claimers, so that claims side by side take different candidates.
//
// What it must not break:
//   - Claim order, as far as a read gives it: candidates are taken in the order read;
//     a key found held elsewhere has its later rows dropped, so they cannot go ahead
//     of the row passed over once the key is free; and a subscription whose claims
//     must follow claim order to the row (FIFO groups, partition keys) keeps none.
//   - A free worker gets a due row within a poll: candidates serve for keptFor at most,
//     so a row that became due after the read (published, or behind a key that was
//     unlocked) waits that long at most; and a claim the kept candidates did not fill
//     reads afresh, so a claim still comes back short only when the table ran short as
//     it was read.
//   - Every take is checked: a kept candidate is locked and taken as a read one is,
//     and the take finds a row settled or taken meanwhile no longer claimable.
//
// A nil *Kept keeps nothing.
type Kept struct {
	// For is how long candidates serve once read (0: keptFor).
	For time.Duration

	mu    sync.Mutex
	cands []dialects.Candidate
	until time.Time
}

const (
	// keptRead is how many candidates a claim reads at least when it keeps them.
	keptRead = 16
	// keptFor is how long kept candidates serve. Handlers slower than this never meet
	// one.
	keptFor = 20 * time.Millisecond
)

// read is how many candidates a claim that wanted scan reads.
func (k *Kept) read(scan int) int {
	if k == nil {
		return scan
	}
	return max(scan, keptRead)
}

// take takes the next kept candidate not set aside, if any is still fresh.
func (k *Kept) take(p *Poison) (dialects.Candidate, bool) {
	if k == nil {
		return dialects.Candidate{}, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if time.Now().After(k.until) {
		k.cands = nil
	}
	for len(k.cands) > 0 {
		c := k.cands[0]
		k.cands = k.cands[1:]
		if !p.isSkipped(c.ID) {
			return c, true
		}
	}
	return dialects.Candidate{}, false
}

// keep replaces the kept candidates with cands, read at read, but for the keys the claim
// took or found held elsewhere: a key's rows are tried in the order read, so none of its
// later rows goes ahead of the one passed over.
func (k *Kept) keep(cands []dialects.Candidate, taken, passed map[string]struct{}, read time.Time) {
	if k == nil {
		return
	}
	cands = slices.DeleteFunc(slices.Clone(cands), func(c dialects.Candidate) bool {
		_, dup := taken[c.Key]
		_, held := passed[c.Key]
		return dup || held
	})
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cands, k.until = cands, read.Add(cmp.Or(k.For, keptFor))
}

// drop drops the kept candidates of key, found held elsewhere: its later rows wait for a
// read that finds its first one again.
func (k *Kept) drop(key string) {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cands = slices.DeleteFunc(k.cands, func(c dialects.Candidate) bool { return c.Key == key })
}
