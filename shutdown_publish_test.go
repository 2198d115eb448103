package rowactor_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// A publish that loses the race with Shutdown returns ErrClosed, never the driver's word
// about a statement or pool closed under it; one that wins it is written. The broker owns
// its pool (rowactor.Open), so Shutdown closes it.
func TestPublishRacingShutdownReturnsErrClosed(t *testing.T) {
	t.Parallel()
	const (
		rounds     = 25
		publishers = 12
	)
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			url := drv.url(t, h.d)
			ctx := context.Background()
			var published, refused int
			for round := range rounds {
				b, err := rowactor.Open(ctx, url)
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				if round%2 == 1 {
					// Half the rounds also have a subscription whose statements Shutdown
					// closes.
					if _, err := b.Subscribe(ctx, h.table, "other", func(context.Context, *rowactor.Delivery) rowactor.Outcome {
						return rowactor.Ack()
					}); err != nil {
						t.Fatalf("Subscribe: %v", err)
					}
				}
				var (
					wg    sync.WaitGroup
					mu    sync.Mutex
					bad   []error
					start = make(chan struct{})
					ok    int
					nope  int
				)
				for range publishers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						for {
							_, err := b.Publish(ctx, h.table, h.queue, []byte("p"))
							mu.Lock()
							switch {
							case err == nil:
								ok++
							case errors.Is(err, rowactor.ErrClosed):
								nope++
							default:
								bad = append(bad, err)
							}
							mu.Unlock()
							if err != nil {
								return
							}
						}
					}()
				}
				close(start)
				time.Sleep(time.Duration(5+round%7) * time.Millisecond)
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				if round%3 == 2 {
					// A Shutdown whose context is spent does not wait for publishes under
					// way: they see their statements and pool closed.
					cancel()
				}
				if _, err := b.Shutdown(sctx); err != nil {
					t.Errorf("Shutdown: %v", err)
				}
				cancel()
				wg.Wait()
				if len(bad) > 0 {
					t.Fatalf("round %d: %d publishes racing Shutdown failed without ErrClosed, e.g. %v", round, len(bad), bad[0])
				}
				published += ok
				refused += nope
			}
			if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name+" WHERE grp = ?", h.queue); n != published {
				t.Fatalf("%d rows in the table, but %d publishes succeeded", n, published)
			}
			t.Logf("%d published, %d refused with ErrClosed", published, refused)
		})
	}
}
