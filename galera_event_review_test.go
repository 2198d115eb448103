//go:build galera

package rowactor_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

type skewClock time.Duration

func (s skewClock) Now() time.Time { return time.Now().Add(time.Duration(s)) }

// A lease-form event that writes no queue row (here: a note in a side table, the row left
// to its lease) was fenced by the event's confirm alone: a locking read of the row on its
// token. On Galera that read is the node's view and its lock the node's own. Node 3's
// consumer claims the row while node 1, with MariaDB's default of one applier, still
// applies an earlier big write set W; node 1's event then confirmed the old token on its
// stale view and committed: a settlement that succeeded for a delivery that no longer
// held the row. Node 3's broker runs a minute ahead only to make it claim a lease node 1
// still counts on while node 1's renewer (30 s lease) has no extension in flight: with
// clocks in step the same interleaving follows a lapsed lease (a renewer that lagged or
// whose rounds failed). A renewer extension in flight happened to hide it: a settlement
// waits for it, and it waits for the apply.
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
		if node == 1 && s.Step == "custom" {
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
		return rowactor.Custom("note")
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
