package rowactor_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
)

// sizedDialect opens a dialect on the harness's database over a pool of size
// connections; false where no form holds a connection per row (SQLite).
func sizedDialect(t *testing.T, h *harness, size int) (dialects.Dialect, bool) {
	t.Helper()
	switch d := h.d.(type) {
	case *postgres.Dialect:
		cfg := d.Pool().Config()
		cfg.MaxConns = int32(size)
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatalf("pool of %d: %v", size, err)
		}
		t.Cleanup(func() {
			done := make(chan struct{})
			go func() { pool.Close(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Errorf("closing the pool of %d waited 15 s for a connection never released", size)
			}
		})
		return postgres.New(pool), true
	case *mysql.Dialect:
		md, err := mysql.Open(context.Background(), strings.TrimPrefix(h.drv.url(t, h.d), "mysql://"))
		if err != nil {
			t.Fatalf("mysql.Open: %v", err)
		}
		md.DB().SetMaxOpenConns(size)
		t.Cleanup(func() { _ = md.Close() })
		return md, true
	}
	return nil, false
}

func init() {
	scenarios = append(scenarios, scenario{
		name: "two subscriptions with all but one of a small pool's connections each make progress and leave nothing behind",
		run:  sharedPoolScenario,
	})
}

// sharedPoolScenario: two subscriptions of one table (groups a and b) on one pool of 4,
// each asking for Workers(3), the pool's size less one. Each budgets what the pool can
// spare, so together they ask for twice what it has: every row must still be handled,
// Shutdown must succeed, and no session, lock or transaction may survive it.
func sharedPoolScenario(t *testing.T, h *harness, form rowactor.Form) {
	const size, rows = 4, 40
	d, ok := sizedDialect(t, h, size)
	if !ok {
		t.Skip("SQLite holds no connection per row in any form")
	}
	log := &syncBuffer{}
	b, err := rowactor.New(d, rowactor.WithLogger(slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		if _, err := b.Publish(context.Background(), h.table, []string{"a", "b"}[i%2], []byte("x")); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	var handled atomic.Int64
	for _, g := range []string{"a", "b"} {
		_, err := b.Subscribe(context.Background(), h.table, g, func(context.Context, *rowactor.Delivery) rowactor.Outcome {
			time.Sleep(5 * time.Millisecond)
			handled.Add(1)
			return rowactor.Ack()
		}, rowactor.Workers(size-1), rowactor.PollInterval(50*time.Millisecond))
		if err != nil {
			t.Fatalf("Subscribe %s: %v", g, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for handled.Load() < rows && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, serr := b.Shutdown(ctx)
	if n := handled.Load(); n != rows {
		t.Fatalf("%d of %d rows handled in 30 s on a pool of %d\nlogs:\n%s", n, rows, size, log.String())
	}
	if serr != nil {
		t.Fatalf("Shutdown: %v", serr)
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s", h.table.Name)); n != 0 {
		t.Fatalf("%d rows left in the table", n)
	}
	if h.drv.keyLocked != nil && form == rowactor.FormAdvisory {
		for id := int64(1); id <= rows; id++ {
			if key := strings.ReplaceAll(h.table.AdvisoryKey, "{id}", fmt.Sprint(id)); h.drv.keyLocked(t, h.d, key) {
				t.Fatalf("key %s still locked after Shutdown", key)
			}
		}
	}
}
