package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
)

// killablePool opens a dialect whose connections the test can tell apart on the server,
// and returns a function that kills them all.
func killablePool(t *testing.T, h *harness) (dialects.Dialect, func() int) {
	t.Helper()
	ctx := context.Background()
	switch h.drv.name {
	case "postgres":
		app := fmt.Sprintf("idlepoll_kill_%d", time.Now().UnixNano())
		d, err := postgres.Open(ctx, postgresURL()+"&application_name="+app)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d, func() int {
			n := h.drv.count(t, h.d, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = ?", app)
			return n
		}
	case "mysql":
		admin := h.d.(*mysql.Dialect).DB()
		user := fmt.Sprintf("rvk%d", time.Now().UnixNano()%1e9)
		for _, q := range []string{
			"CREATE USER '" + user + "'@'%'", "GRANT ALL ON test.* TO '" + user + "'@'%'",
			"CREATE USER '" + user + "'@'localhost'", "GRANT ALL ON test.* TO '" + user + "'@'localhost'",
		} {
			if _, err := admin.Exec(q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		t.Cleanup(func() {
			_, _ = admin.Exec("DROP USER '" + user + "'@'%'")
			_, _ = admin.Exec("DROP USER '" + user + "'@'localhost'")
		})
		dsn := strings.Replace(mysqlDSN(), "root@", user+"@", 1)
		d, err := mysql.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d, func() int {
			rows, err := admin.Query("SELECT id FROM information_schema.processlist WHERE user = ?", user)
			if err != nil {
				t.Error(err)
				return 0
			}
			var ids []int64
			for rows.Next() {
				var id int64
				_ = rows.Scan(&id)
				ids = append(ids, id)
			}
			rows.Close()
			for _, id := range ids {
				_, _ = admin.Exec(fmt.Sprintf("KILL %d", id))
			}
			return len(ids)
		}
	}
	t.Fatalf("no killable pool for %s", h.drv.name)
	return nil, nil
}

// TestIdlePollRecoversFromKilledConnections proves that once the server stops killing the
// subscribers' connections (probes and claims included), every row written by hand into an
// idle group is handled and Shutdown returns at once.
func TestIdlePollRecoversFromKilledConnections(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		if drv.name == "sqlite" {
			continue
		}
		for _, form := range drv.forms {
			t.Run(fmt.Sprintf("%s/%s", drv.name, form), func(t *testing.T) {
				h := newHarness(t, drv, form)
				d, kill := killablePool(t, h)
				b := h.brokerOn(d, rowactor.WithPollOnly())
				s := newSeen()
				groups := []string{h.queue, "idle-1", "idle-2", "idle-3"}
				for _, g := range groups {
					if _, err := b.Subscribe(context.Background(), h.table, g, s.handler, append(leaseOptions(form, 2*time.Second), rowactor.PollInterval(50*time.Millisecond))...); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(200 * time.Millisecond)

				want := map[int64]string{}
				var wg sync.WaitGroup
				stop := make(chan struct{})
				killed := 0
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						case <-time.After(37 * time.Millisecond):
							killed += kill()
						}
					}
				}()
				for i := 0; i < 24; i++ {
					g := groups[i%len(groups)]
					want[insertByHand(t, h, g)] = g
					time.Sleep(60 * time.Millisecond)
				}
				close(stop)
				wg.Wait()
				t.Logf("%d connections killed", killed)
				// Rows written after the killing stopped too.
				for _, g := range groups {
					want[insertByHand(t, h, g)] = g
				}
				start := time.Now()
				// A lease claim whose commit the kill hid leaves its row leased to nobody
				// until the lease (2 s here) runs out, as a crash does (SPEC 2).
				s.waitAll(t, h, want, 15*time.Second)
				t.Logf("every row handled %v after the killing stopped", time.Since(start))

				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				began := time.Now()
				_, _ = b.Shutdown(ctx)
				if d := time.Since(began); d > 2*time.Second {
					t.Errorf("Shutdown took %v", d)
				}
			})
		}
	}
}
