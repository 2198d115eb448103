//go:build galera

// The Galera tests need the three-node cluster of scripts/galera.sh (ports 3307-3309, or
// ROWACTOR_GALERA_DSNS), and kill one of its nodes: scripts/test.sh runs them alone, after
// the suite, with -tags galera, when it could start the cluster.

package rowactor_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
)

func galeraDSNs(t *testing.T) []string {
	t.Helper()
	list := os.Getenv("ROWACTOR_GALERA_DSNS")
	if list == "" {
		list = "root@tcp(127.0.0.1:3307)/test,root@tcp(127.0.0.1:3308)/test,root@tcp(127.0.0.1:3309)/test"
	}
	return strings.Split(list, ",")
}

// On a cluster node, the forms whose locks are the node's own are refused before anything
// is claimed; the lease form, plain and transactional, subscribes; a publish through any
// node is seen on every node.
func TestGaleraRefusesNodeLocalForms(t *testing.T) {
	ctx := context.Background()
	var brokers []*rowactor.Broker
	for i, dsn := range galeraDSNs(t) {
		b, err := rowactor.Open(ctx, "mysql://"+dsn)
		if err != nil {
			t.Fatalf("node %d (%s): %v; start the cluster with bash scripts/galera.sh start", i+1, dsn, err)
		}
		t.Cleanup(func() { _, _ = b.Shutdown(context.Background()) })
		brokers = append(brokers, b)
	}
	name := fmt.Sprintf("galera_forms_%d", time.Now().UnixNano())
	lease := rowactor.Table{Name: name, ID: "id", Group: "grp", Payload: "payload", Attempt: "attempt", LockedUntil: "locked_until"}
	ddl, err := rowactor.Schema(brokers[0].Dialect(), lease)
	if err != nil {
		t.Fatal(err)
	}
	db := brokers[0].Dialect().(interface{ DB() *sql.DB }).DB()
	for _, stmt := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(stmt) != "" {
			if _, err := db.ExecContext(ctx, stmt); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+name) })
	var dbs []*sql.DB
	for _, b := range brokers {
		dbs = append(dbs, b.Dialect().(interface{ DB() *sql.DB }).DB())
	}
	galeraWaitTable(t, dbs, name)

	rowLock := lease
	rowLock.LockedUntil = ""
	advisory := rowLock
	advisory.AdvisoryKey = "galera:{id}"
	h := func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }
	for _, c := range []struct {
		form string
		t    rowactor.Table
		want string
	}{{"row lock", rowLock, "Table (row lock form)"}, {"advisory", advisory, "Table.AdvisoryKey"}} {
		for i, b := range brokers {
			_, err := b.Subscribe(ctx, c.t, "q", h)
			var ce *rowactor.ConfigError
			if !errors.As(err, &ce) || ce.Option != c.want || !strings.Contains(ce.Reason, "Galera") || !strings.Contains(ce.Fix, "LockedUntil") {
				t.Fatalf("node %d: the %s form subscribed with %v, want a *ConfigError on %s that names Galera and the lease form", i+1, c.form, err, c.want)
			}
		}
	}
	for i, b := range brokers {
		if _, err := b.Publish(ctx, lease, "q", []byte(fmt.Sprintf("node %d", i+1))); err != nil {
			t.Fatalf("publish through node %d: %v", i+1, err)
		}
	}
	handled := make(chan string, 8)
	for i, b := range brokers {
		opts := []rowactor.SubscribeOption{}
		if i == 1 {
			opts = append(opts, rowactor.Transactional())
		}
		if _, err := b.Subscribe(ctx, lease, "q", func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			handled <- string(d.Payload())
			return rowactor.Ack()
		}, opts...); err != nil {
			t.Fatalf("node %d: the lease form (transactional %v) was refused: %v", i+1, i == 1, err)
		}
	}
	got := map[string]bool{}
	for len(got) < 3 {
		select {
		case p := <-handled:
			if got[p] {
				t.Fatalf("%q handled twice", p)
			}
			got[p] = true
		case <-time.After(30 * time.Second):
			t.Fatalf("handled %v after 30 s, want the three rows", got)
		}
	}
	// The acks commit after the handlers return, and node 1 applies the others' a moment
	// after they commit.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var left int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+name).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows left 10 s after they were handled, want none", left)
		}
	}
}

// TestGaleraNodeKill runs the chaos harness's nodekill scenario: three consumer processes,
// one per node, 4 workers each, drain 10,000 rows published through all three nodes;
// node 2 is SIGKILLed while its consumer's handlers run, stays down, and is started again
// (it rejoins by incremental state transfer). The harness's checks must all pass: every
// row settled exactly once, no successful settlement by a non-holder, nothing left held,
// no free worker idle outside the outage; and rows handled twice only for claims the dead
// node's consumer held, which other nodes' consumers took over, or for runs elsewhere
// whose settlement was reported failed during the outage (a lease that ran out while no
// node committed, a claim that waited in that stall and came back with its lease spent).
func TestGaleraNodeKill(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "chaos")
	if out, err := exec.Command("go", "build", "-o", bin, "./bench/chaos").CombinedOutput(); err != nil {
		t.Fatalf("build bench/chaos: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-db", "galera", "-form", "lease", "-fault", "nodekill",
		"-procs", "3", "-workers", "4", "-rows", "10000", "-publish-for", "20s", "-work", "20ms")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var res struct {
		OK           bool           `json:"ok"`
		Published    int            `json:"published"`
		Handled      int            `json:"handled"`
		Unrecorded   int            `json:"unrecorded"`
		Faults       map[string]int `json:"faults"`
		InWork       int            `json:"nodekill_in_work"`
		Twice        int            `json:"nodekill_twice"`
		TakenOver    int            `json:"nodekill_taken_over"`
		OutageFailed int            `json:"nodekill_outage_failed"`
		Error        string         `json:"error"`
	}
	found := false
	for sc := bufio.NewScanner(&stdout); sc.Scan(); {
		if line := sc.Bytes(); bytes.HasPrefix(line, []byte("{")) {
			if jerr := json.Unmarshal(line, &res); jerr != nil {
				t.Fatalf("chaos printed %q: %v", line, jerr)
			}
			found = true
		}
	}
	report := stderr.String()
	if i := strings.Index(report, "galera   lease"); i >= 0 {
		report = report[i:]
	}
	if !found || err != nil || !res.OK {
		t.Fatalf("chaos nodekill failed (%v, ok=%v, error %q):\n%s", err, res.OK, res.Error, report)
	}
	switch {
	case res.Published != 10000 || res.Handled+res.Unrecorded != 10000:
		t.Fatalf("published %d, handled %d + %d ended unrecorded, want 10,000", res.Published, res.Handled, res.Unrecorded)
	case res.Faults["node_kills"] != 1:
		t.Fatalf("faults %v, want one node kill", res.Faults)
	case res.InWork == 0 || res.TakenOver == 0:
		t.Fatalf("%d rows in work on the killed node, %d taken over by others: the kill met no delivery\n%s", res.InWork, res.TakenOver, report)
	case res.Twice > res.InWork+res.OutageFailed:
		t.Fatalf("%d rows handled twice, more than the %d in work on the killed node and the %d settlements reported failed during the outage", res.Twice, res.InWork, res.OutageFailed)
	}
	t.Logf("in work on the killed node %d, handled twice %d, taken over %d\n%s", res.InWork, res.Twice, res.TakenOver, report)
}

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
		tx := d.Tx()
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
			// Two nodes could each take a row of one group.
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
		tx := d.Tx()
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

type skewClock time.Duration

func (s skewClock) Now() time.Time { return time.Now().Add(time.Duration(s)) }

// TestGaleraEventFencedByAReadOnly: a lease-form event that writes no queue row (here: a
// note in a side table, the row left to its lease) does not settle as a success once
// another node has claimed the row, although a locking read of the row on its token, on
// the event's node, would still find it: on Galera that read is the node's view and its
// lock the node's own. Node 3's consumer claims the row while node 1, with MariaDB's
// default of one applier, still applies an earlier big write set W, so node 1's view is
// stale when its event settles. Node 3's broker runs a minute ahead only to make it claim
// a lease node 1 still counts on while node 1's renewer (30 s lease) has no extension in
// flight: with clocks in step the same interleaving follows a lapsed lease (a renewer that
// lagged or whose rounds failed). A renewer extension in flight would hide it: a
// settlement waits for it, and it waits for the apply.
func TestGaleraEventFencedByAReadOnly(t *testing.T) {
	ctx := context.Background()
	name := fmt.Sprintf("galera_evs_%d", time.Now().UnixNano())
	fill, side := name+"_fill", name+"_side"
	tbl := rowactor.Table{Name: name, ID: "id", Payload: "payload", Attempt: "attempt", LockedUntil: "locked_until"}
	var mu sync.Mutex
	var firstErr error
	firstDone := make(chan struct{})
	brokers, dbs := galeraSetup(t, tbl, func(node int, s rowactor.Settlement) {
		mu.Lock()
		defer mu.Unlock()
		if node == 1 && s.Step == "event" {
			firstErr = s.Err
			close(firstDone)
		}
	},
		"CREATE TABLE "+fill+" (k INT NOT NULL, v INT NOT NULL) ENGINE=InnoDB", // no key: slow to apply elsewhere
		"INSERT INTO "+fill+" SELECT seq, 0 FROM seq_1_to_20000",
		"CREATE TABLE "+side+" (row_id BIGINT NOT NULL, note VARCHAR(20) NOT NULL) ENGINE=InnoDB")
	t.Cleanup(func() {
		for _, n := range []string{name, fill, side} {
			_, _ = dbs[0].ExecContext(context.Background(), "DROP TABLE IF EXISTS "+n)
		}
	})
	oneApplier(t, dbs[0])
	ahead, err := rowactor.Open(ctx, "mysql://"+galeraDSNs(t)[2], rowactor.WithClock(skewClock(time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	defer ahead.Shutdown(ctx) //nolint:errcheck
	waitRows(t, dbs[2], "SELECT count(*) FROM "+fill, 20000)
	id, err := brokers[0].Publish(ctx, tbl, "", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	waitRows(t, dbs[2], fmt.Sprintf("SELECT count(*) FROM %s WHERE id = %d", name, id), 1)
	started := make(chan int, 4)
	goOn := make(chan struct{})
	if _, err := brokers[0].Subscribe(ctx, tbl, "", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- 1
		<-goOn
		return rowactor.Event("note")
	}, rowactor.Lease(30*time.Second), rowactor.Workers(1),
		rowactor.OnEvent("note", "INSERT INTO "+side+" (row_id, note) VALUES ({id}, 'node 1')")); err != nil {
		t.Fatal(err)
	}
	<-started
	if _, err := dbs[2].ExecContext(ctx, wText(fill)); err != nil {
		t.Fatal(err)
	}
	release3 := make(chan struct{})
	defer close(release3)
	if _, err := ahead.Subscribe(ctx, tbl, "", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		started <- 3
		<-release3
		return rowactor.Ack()
	}, rowactor.Lease(30*time.Second), rowactor.Workers(1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("node 3 never claimed the row")
	}
	var tok1, tok3 string
	_ = dbs[0].QueryRowContext(ctx, fmt.Sprintf("SELECT CAST(locked_until AS CHAR) FROM %s WHERE id = %d", name, id)).Scan(&tok1)
	_ = dbs[2].QueryRowContext(ctx, fmt.Sprintf("SELECT CAST(locked_until AS CHAR) FROM %s WHERE id = %d", name, id)).Scan(&tok3)
	if tok1 == tok3 {
		close(goOn)
		t.Skipf("node 1 applied node 3's claim already (token %s): the interleaving did not arise", tok1)
	}
	t.Logf("before the event, node 1 sees token %s, node 3 %s", tok1, tok3)
	goAt := time.Now()
	close(goOn)
	<-firstDone
	t.Logf("the event settled %v after the handler returned", time.Since(goAt))
	mu.Lock()
	defer mu.Unlock()
	var notes int
	_ = dbs[0].QueryRowContext(ctx, "SELECT count(*) FROM "+side).Scan(&notes)
	if firstErr == nil || notes != 0 {
		t.Fatalf("node 1's event settled with err=%v and wrote %d notes while node 3 held the row", firstErr, notes)
	}
	t.Logf("node 1's event: %v", firstErr)
}

// oneApplier sets MariaDB's default of one applier thread on a node for the test: a write
// set from another node then waits behind an earlier one unapplied (with two, it is
// applied beside it and holds its rows' locks until its turn to commit).
func oneApplier(t *testing.T, db *sql.DB) {
	t.Helper()
	var threads int
	if err := db.QueryRow("SELECT @@GLOBAL.wsrep_slave_threads").Scan(&threads); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("SET GLOBAL wsrep_slave_threads = 1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec(fmt.Sprintf("SET GLOBAL wsrep_slave_threads = %d", threads)) })
}

// wText is W, a write set that is small but slow to apply on other nodes: 6,000 row
// updates of a table without a key, each of which an applier finds by a full scan (a
// big write set would do too, but fills the nodes' 64 MB gcache, whose recovery after a
// SIGKILL then ran a node out of memory).
func wText(fill string) string { return "UPDATE " + fill + " SET v = v + 1 WHERE k <= 6000" }
