package rowactor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
)

// TestReviewIdlePollLockedTable: another session locks the whole table (LOCK TABLE ... IN
// ACCESS EXCLUSIVE MODE; LOCK TABLES ... WRITE), so the probe of its idle subscriptions
// blocks. Shutdown must still return at once; and once the lock ends, a row written while
// it was held reaches its worker within a few polls.
func TestReviewIdlePollLockedTable(t *testing.T) {
	for _, drv := range drivers {
		if drv.name == "sqlite" {
			continue
		}
		for _, shutdown := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/shutdown=%v", drv.name, shutdown), func(t *testing.T) {
				h := newHarness(t, drv, rowactor.FormLease)
				b := h.second(rowactor.WithPollOnly())
				s := newSeen()
				const poll = 50 * time.Millisecond
				for _, g := range []string{h.queue, "idle-1"} {
					if _, err := b.Subscribe(context.Background(), h.table, g, s.handler, rowactor.PollInterval(poll)); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(4 * poll)
				id := insertByHand(t, h, "idle-1")
				s.waitAll(t, h, map[int64]string{id: "idle-1"}, 20*poll)
				h.waitSettled(1) // its ack is not left to wait for the lock
				time.Sleep(2 * poll)

				ctx := context.Background()
				var unlock func()
				switch d := h.d.(type) {
				case *postgres.Dialect:
					tx, err := d.Pool().Begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if err := tx.QueryRow(ctx, "INSERT INTO "+pgQuote(h.table.Name)+" (payload, grp) VALUES ($1, $2) RETURNING id", []byte("locked"), h.queue).Scan(&id); err != nil {
						t.Fatal(err)
					}
					if _, err := tx.Exec(ctx, "LOCK TABLE "+pgQuote(h.table.Name)+" IN ACCESS EXCLUSIVE MODE"); err != nil {
						t.Fatal(err)
					}
					unlock = func() {
						if err := tx.Commit(ctx); err != nil {
							t.Error(err)
						}
					}
				case *mysql.Dialect:
					c, err := d.DB().Conn(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := c.ExecContext(ctx, "LOCK TABLES `"+h.table.Name+"` WRITE"); err != nil {
						t.Fatal(err)
					}
					res, err := c.ExecContext(ctx, "INSERT INTO `"+h.table.Name+"` (payload, grp) VALUES (?, ?)", []byte("locked"), h.queue)
					if err != nil {
						t.Fatal(err)
					}
					id, _ = res.LastInsertId()
					unlock = func() {
						if _, err := c.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
							t.Error(err)
						}
						_ = c.Close()
					}
				}
				time.Sleep(5 * poll) // the probe waits for the lock
				if shutdown {
					sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					defer cancel()
					began := time.Now()
					_, err := b.Shutdown(sctx)
					took := time.Since(began)
					unlock()
					if err != nil {
						t.Fatalf("Shutdown: %v", err)
					}
					if took > 500*time.Millisecond {
						t.Fatalf("Shutdown took %v while the table was locked", took)
					}
					t.Logf("Shutdown took %v while the table was locked", took)
					return
				}
				time.Sleep(1500 * time.Millisecond) // past the probe's deadline (1 s)
				ev := time.Now()
				unlock()
				s.waitAll(t, h, map[int64]string{id: h.queue}, 5*time.Second)
				t.Logf("the row written under the lock was handled %v after it ended", time.Since(ev))
			})
		}
	}
}
