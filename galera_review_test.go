//go:build galera

package rowactor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
)

// galeraSetup opens a broker per node (each with hook as its OnSettled), creates a lease
// table through node 1 plus any extra DDL, and drops them after the test.
func galeraSetup(t *testing.T, t0 rowactor.Table, hook func(node int, s rowactor.Settlement), extra ...string) ([]*rowactor.Broker, []*sql.DB) {
	t.Helper()
	ctx := context.Background()
	var brokers []*rowactor.Broker
	var dbs []*sql.DB
	for i, dsn := range galeraDSNs(t) {
		node := i + 1
		b, err := rowactor.Open(ctx, "mysql://"+dsn, rowactor.WithOnSettled(func(s rowactor.Settlement) { hook(node, s) }))
		if err != nil {
			t.Fatalf("node %d (%s): %v; start the cluster with bash scripts/galera.sh start", node, dsn, err)
		}
		t.Cleanup(func() { _, _ = b.Shutdown(context.Background()) })
		brokers = append(brokers, b)
		dbs = append(dbs, b.Dialect().(interface{ DB() *sql.DB }).DB())
	}
	ddl, err := rowactor.Schema(brokers[0].Dialect(), t0)
	if err != nil {
		t.Fatal(err)
	}
	stmts := append(strings.Split(ddl, ";\n"), extra...)
	for _, stmt := range stmts {
		if strings.TrimSpace(stmt) != "" {
			if _, err := dbs[0].ExecContext(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
	}
	galeraWaitTable(t, dbs, t0.Name)
	return brokers, dbs
}

// galeraWaitTable waits until every node has table name: a DDL statement returns once
// the node it ran on applied it, and the other nodes apply it a moment later (in the same
// total order), so a statement sent to another node at once may not find the table yet.
func galeraWaitTable(t *testing.T, dbs []*sql.DB, name string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i, db := range dbs {
		for {
			var n int
			err := db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", name).Scan(&n)
			if err == nil && n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d never saw table %s (%d, %v)", i+1, name, n, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// A transactional lease delivery on node 1 writes a side row; node 2 commits a write of
// the same row, and its write set, applied on node 1, aborts the delivery's transaction
// (a Galera brute-force abort: the cluster ended it, not the handler). The handler goes on
// through its Tx (ignoring the errors) and returns Ack. Nothing of that delivery may
// commit (no autocommit after the server ended the transaction), its settlement must be an
// error (never counted as done), and the row comes back and its second delivery's Ack
// commits.
func TestGaleraBruteForceAbortOfALentTransaction(t *testing.T) {
	for _, idle := range []bool{false, true} {
		t.Run(fmt.Sprintf("idle=%v", idle), func(t *testing.T) { galeraBFAbort(t, idle) })
	}
}

func galeraBFAbort(t *testing.T, idle bool) {
	ctx := context.Background()
	name := fmt.Sprintf("galera_bf_%d", time.Now().UnixNano())
	side, log := name+"_side", name+"_log"
	tbl := rowactor.Table{Name: name, ID: "id", Payload: "payload", Attempt: "attempt", LockedUntil: "locked_until"}
	var mu sync.Mutex
	var settled []rowactor.Settlement
	brokers, dbs := galeraSetup(t, tbl, func(node int, s rowactor.Settlement) {
		mu.Lock()
		defer mu.Unlock()
		settled = append(settled, s)
	},
		"CREATE TABLE "+side+" (id BIGINT PRIMARY KEY, v VARCHAR(20) NOT NULL) ENGINE=InnoDB",
		"INSERT INTO "+side+" VALUES (1, 'before')",
		"CREATE TABLE "+log+" (id BIGINT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(40) NOT NULL) ENGINE=InnoDB")
	t.Cleanup(func() {
		for _, n := range []string{name, side, log} {
			_, _ = dbs[0].ExecContext(context.Background(), "DROP TABLE IF EXISTS "+n)
		}
	})
	// Node 2 must see the side table before the handler runs.
	waitRows(t, dbs[1], "SELECT count(*) FROM "+side, 1)
	if _, err := brokers[0].Publish(ctx, tbl, "", []byte("x")); err != nil {
		t.Fatal(err)
	}
	handlerErrs := make(chan string, 16)
	done := make(chan struct{}, 4)
	_, err := brokers[0].Subscribe(ctx, tbl, "", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		defer func() { done <- struct{}{} }()
		tx := d.Tx().(*sql.Tx)
		if d.Attempt() > 1 {
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+log+" (v) VALUES ('second')"); err != nil {
				handlerErrs <- "second: " + err.Error()
			}
			return rowactor.Ack()
		}
		if _, err := tx.ExecContext(ctx, "UPDATE "+side+" SET v = 'first' WHERE id = 1"); err != nil {
			handlerErrs <- "first update: " + err.Error()
			return rowactor.Ack()
		}
		// Node 2 commits a write of the same row: certified first, then applied on node 1,
		// where it aborts this transaction, which holds the row's lock.
		if _, err := dbs[1].ExecContext(ctx, "UPDATE "+side+" SET v = 'node2' WHERE id = 1"); err != nil {
			handlerErrs <- "node 2: " + err.Error()
		}
		waitValue(t, dbs[0], "SELECT v FROM "+side+" WHERE id = 1", "node2")
		if !idle {
			for i := range 3 {
				if _, err := tx.ExecContext(ctx, "INSERT INTO "+log+" (v) VALUES (?)", fmt.Sprintf("first-%d", i)); err != nil {
					handlerErrs <- fmt.Sprintf("first insert %d: %v", i, err)
				}
			}
		}
		return rowactor.Ack()
	}, rowactor.Transactional(), rowactor.Lease(2*time.Second), rowactor.PollInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			mu.Lock()
			t.Fatalf("no second delivery after 30 s; settlements %+v", settled)
			mu.Unlock()
		}
	}
	waitRows(t, dbs[0], "SELECT count(*) FROM "+name, 0)
	close(handlerErrs)
	for e := range handlerErrs {
		t.Logf("handler saw: %s", e)
	}
	rows, err := dbs[0].QueryContext(ctx, "SELECT v FROM "+log+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var v string
		_ = rows.Scan(&v)
		got = append(got, v)
	}
	rows.Close()
	mu.Lock()
	defer mu.Unlock()
	for _, s := range settled {
		t.Logf("settled: attempt %d step %s err %v", s.Attempt, s.Step, s.Err)
	}
	if len(got) != 1 || got[0] != "second" {
		t.Fatalf("log holds %q, want only the second delivery's write: the aborted transaction's writes committed", got)
	}
	var v string
	_ = dbs[0].QueryRowContext(ctx, "SELECT v FROM "+side+" WHERE id = 1").Scan(&v)
	if v != "node2" {
		t.Fatalf("side row holds %q, want node 2's write", v)
	}
	if len(settled) < 2 || settled[0].Err == nil || settled[len(settled)-1].Err != nil {
		t.Fatalf("settlements %+v: want the first delivery's Ack to fail and the last one's to succeed", settled)
	}
	if !errors.Is(settled[0].Err, dialects.ErrTxEnded) {
		t.Errorf("the first settlement's error %v does not wrap ErrTxEnded", settled[0].Err)
	}
}

func waitRows(t *testing.T, db *sql.DB, q string, want int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var n int
		err := db.QueryRow(q).Scan(&n)
		if err == nil && n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d (%v), want %d", q, n, err, want)
		}
	}
}

func waitValue(t *testing.T, db *sql.DB, q, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var v string
		if err := db.QueryRow(q).Scan(&v); err == nil && v == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s never read %q", q, want)
			return
		}
	}
}

// Every way into the row lock and advisory forms is refused on a cluster node before
// anything is claimed: batches, transactional, FIFO, dead-letter tables and groups, and a
// broker made with New on a pool of the caller's.
func TestGaleraRefusesNodeLocalFormsEveryWay(t *testing.T) {
	ctx := context.Background()
	name := fmt.Sprintf("galera_ways_%d", time.Now().UnixNano())
	lease := rowactor.Table{Name: name, ID: "id", Group: "grp", Payload: "payload", Attempt: "attempt", LockedUntil: "locked_until"}
	brokers, dbs := galeraSetup(t, lease, func(int, rowactor.Settlement) {})
	t.Cleanup(func() { _, _ = dbs[0].ExecContext(context.Background(), "DROP TABLE IF EXISTS "+name) })
	if _, err := brokers[0].Publish(ctx, lease, "q", []byte("x")); err != nil {
		t.Fatal(err)
	}
	rowLock := lease
	rowLock.LockedUntil = ""
	advisory := rowLock
	advisory.AdvisoryKey = "galera:{id}"
	fifo := rowLock
	fifo.FIFO = true
	fifoLease := lease
	fifoLease.FIFO = true
	h := func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }
	bh := func(_ context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
		return make([]rowactor.Outcome, len(ds))
	}
	for i, b := range brokers {
		for _, c := range []struct {
			what string
			run  func() error
		}{
			{"batch row lock", func() error { _, err := b.SubscribeBatch(ctx, rowLock, "q", 4, bh); return err }},
			{"batch advisory", func() error { _, err := b.SubscribeBatch(ctx, advisory, "q", 4, bh); return err }},
			{"transactional row lock", func() error { _, err := b.Subscribe(ctx, rowLock, "q", h, rowactor.Transactional()); return err }},
			{"transactional advisory", func() error { _, err := b.Subscribe(ctx, advisory, "q", h, rowactor.Transactional()); return err }},
			{"fifo row lock", func() error { _, err := b.Subscribe(ctx, fifo, "q", h); return err }},
			// review/galera_fifo_write_skew.go.txt: two nodes each took a row of one group.
			{"fifo lease", func() error { _, err := b.Subscribe(ctx, fifoLease, "q", h); return err }},
			{"row lock with dead-letter group", func() error {
				_, err := b.Subscribe(ctx, rowLock, "q", h, rowactor.MaxAttempts(2), rowactor.DeadLetterGroup("dead"))
				return err
			}},
		} {
			err := c.run()
			var ce *rowactor.ConfigError
			switch {
			case c.what == "batch advisory":
				// Refused as a batch of the advisory form, whatever the server.
				if !errors.As(err, &ce) {
					t.Errorf("node %d, %s: subscribed with %v, want a *ConfigError", i+1, c.what, err)
				}
			case !errors.As(err, &ce) || !strings.Contains(ce.Reason, "Galera"):
				t.Errorf("node %d, %s: subscribed with %v, want a *ConfigError naming Galera", i+1, c.what, err)
			case strings.HasPrefix(c.what, "batch") && !strings.Contains(ce.Fix, "SubscribeBatch"):
				// The lease form the fix names is refused to SubscribeBatch: the fix must
				// say so, or it sends the user from one refusal to the next.
				t.Errorf("node %d, %s: the fix %q sends a batch to the lease form, which SubscribeBatch refuses", i+1, c.what, ce.Fix)
			}
		}
	}
	// A broker made with New on the caller's own pool.
	own, err := sql.Open("mysql", galeraDSNs(t)[1]+"?parseTime=true")
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	b, err := rowactor.New(mysql.New(own))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown(ctx) //nolint:errcheck
	// Its first check runs with a publish, not a subscription.
	if _, err := b.Publish(ctx, lease, "q", []byte("y")); err != nil {
		t.Fatal(err)
	}
	_, err = b.Subscribe(ctx, advisory, "q", h)
	var ce *rowactor.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("New on a node's pool: the advisory form subscribed with %v, want a *ConfigError", err)
	}
	var left int
	if err := dbs[0].QueryRowContext(ctx, "SELECT count(*) FROM "+name+" WHERE attempt > 1").Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d rows claimed (%v), want none", left, err)
	}
}

// A transactional Ack whose COMMIT fails certification: node 1's delivery updates a side
// row on a view that lacks node 3's committed update of the same row (node 1, with one
// applier thread, is still applying a big write set W ahead of it), so nothing aborts it
// before its COMMIT, which certification then refuses (1213). The settlement must be an
// error, nothing of the delivery commits, and the row's second delivery acks.
func TestGaleraTransactionalCommitCertificationFailure(t *testing.T) {
	ctx := context.Background()
	name := fmt.Sprintf("galera_cc_%d", time.Now().UnixNano())
	fill, side, log := name+"_fill", name+"_side", name+"_log"
	tbl := rowactor.Table{Name: name, ID: "id", Payload: "payload", Attempt: "attempt", LockedUntil: "locked_until"}
	var mu sync.Mutex
	var settled []rowactor.Settlement
	brokers, dbs := galeraSetup(t, tbl, func(node int, s rowactor.Settlement) {
		mu.Lock()
		defer mu.Unlock()
		settled = append(settled, s)
	},
		"CREATE TABLE "+fill+" (k INT NOT NULL, v INT NOT NULL) ENGINE=InnoDB", // no key: slow to apply elsewhere
		"INSERT INTO "+fill+" SELECT seq, 0 FROM seq_1_to_20000",
		"CREATE TABLE "+side+" (id BIGINT PRIMARY KEY, v VARCHAR(20) NOT NULL) ENGINE=InnoDB",
		"INSERT INTO "+side+" VALUES (1, 'before')",
		"CREATE TABLE "+log+" (id BIGINT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(40) NOT NULL) ENGINE=InnoDB")
	t.Cleanup(func() {
		for _, n := range []string{name, fill, side, log} {
			_, _ = dbs[0].ExecContext(context.Background(), "DROP TABLE IF EXISTS "+n)
		}
	})
	oneApplier(t, dbs[0])
	waitRows(t, dbs[2], "SELECT count(*) FROM "+fill, 20000)
	waitRows(t, dbs[2], "SELECT count(*) FROM "+side, 1)
	if _, err := brokers[0].Publish(ctx, tbl, "", []byte("x")); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 4)
	stale := true
	if _, err := brokers[0].Subscribe(ctx, tbl, "", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		defer func() { done <- struct{}{} }()
		tx := d.Tx().(*sql.Tx)
		if d.Attempt() > 1 {
			_, _ = tx.ExecContext(ctx, "INSERT INTO "+log+" (v) VALUES ('second')")
			return rowactor.Ack()
		}
		// W, then node 3's update of the side row, both through node 3.
		_, err := dbs[2].ExecContext(ctx, wText(fill))
		if err == nil {
			_, err = dbs[2].ExecContext(ctx, "UPDATE "+side+" SET v = 'node3' WHERE id = 1")
		}
		if err != nil {
			t.Errorf("node 3: %v", err)
		}
		var v string
		_ = tx.QueryRowContext(ctx, "SELECT v FROM "+side+" WHERE id = 1").Scan(&v)
		stale = v == "before"
		if _, err := tx.ExecContext(ctx, "UPDATE "+side+" SET v = 'node1' WHERE id = 1"); err != nil {
			t.Logf("node 1's update: %v", err)
		}
		_, _ = tx.ExecContext(ctx, "INSERT INTO "+log+" (v) VALUES ('first')")
		return rowactor.Ack()
	}, rowactor.Transactional(), rowactor.Lease(time.Second), rowactor.PollInterval(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			mu.Lock()
			t.Fatalf("no second delivery after 30 s; settlements %+v", settled)
			mu.Unlock()
		}
	}
	if !stale {
		t.Skip("node 1 had applied node 3's update already: the interleaving did not arise")
	}
	waitRows(t, dbs[0], "SELECT count(*) FROM "+name, 0)
	var logged []string
	rows, err := dbs[0].QueryContext(ctx, "SELECT v FROM "+log+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var v string
		_ = rows.Scan(&v)
		logged = append(logged, v)
	}
	rows.Close()
	var v string
	_ = dbs[0].QueryRowContext(ctx, "SELECT v FROM "+side+" WHERE id = 1").Scan(&v)
	mu.Lock()
	defer mu.Unlock()
	for _, s := range settled {
		t.Logf("settled: attempt %d step %s err %v", s.Attempt, s.Step, s.Err)
	}
	if len(settled) < 2 || settled[0].Err == nil || settled[len(settled)-1].Err != nil {
		t.Fatalf("settlements %+v: want the first Ack to fail and the last to succeed", settled)
	}
	if fmt.Sprint(logged) != "[second]" || v != "node3" {
		t.Fatalf("log %q, side row %q: want only the second delivery's write and node 3's update", logged, v)
	}
}
