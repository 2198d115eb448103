package rowactor_test

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// One row another session keeps locked (an operator's forgotten transaction, a report)
// should cost the renewer that row's retries, not more. Since 3fe98c6 each busy round
// asks for a whole round an eighth of a lease later: every lease in work is moved again
// (one row write each) every Lease/8 instead of every Lease/2, for as long as the lock
// lasts: four times the renewer's writes for the whole subscription, because of one row.
func TestOneBusyRowDoesNotMultiplyTheRenewersWrites(t *testing.T) {
	for _, drv := range serverDrivers() {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			b := h.broker()
			ids := h.publish(b, 2)
			locked, free := ids[0], ids[1]
			release := make(chan struct{})
			started := make(chan int64, 2)
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				started <- d.ID()
				<-release
				return rowactor.Ack()
			}, rowactor.Workers(2), rowactor.Lease(8*time.Second))
			defer close(release)
			for range ids {
				<-started
			}
			unlock := holdRow(t, h, locked)
			defer unlock()
			// Watch the free row's lease for three half leases: a round every 4 s moves it
			// three or four times.
			var moves int
			last := h.row(free).lockedUntil
			for end := time.Now().Add(12 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				lu := h.row(free).lockedUntil
				if lu != nil && last != nil && !lu.Equal(*last) {
					moves++
				}
				last = lu
			}
			if moves > 4 {
				t.Fatalf("the free row's lease moved %d times in 12 s (lease 8 s: a round every 4 s) while one other row "+
					"was locked: every busy retry moves every lease in work", moves)
			}
			// The busy row's own retries go on: once the lock ends, its lease moves within
			// a retry or two (an eighth of a lease each), not only at the next round.
			before := h.row(locked).lockedUntil
			unlock()
			waitFor(t, func() bool {
				lu := h.row(locked).lockedUntil
				return lu != nil && before != nil && lu.After(*before)
			})
		})
	}
}
