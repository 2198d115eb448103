package rowactor_test

import (
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
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
)

func withUniqueKey(t *rowactor.Table) { t.UniqueKey = "unique_key" }

var uniqueScenarios = []scenario{
	{
		name:   "a unique key is published once while a row holds it, and again once the row is deleted",
		shapes: []tableShape{withUniqueKey},
		run:    uniqueScenario,
	},
	{
		name:   "publishes of one unique key racing from two brokers leave one row",
		shapes: []tableShape{withUniqueKey},
		run:    uniqueRaceScenario,
	},
	{
		name:   "a finished row kept with processed_at holds its key, unless ClearUniqueKeyAtAck clears it at the ack",
		shapes: []tableShape{withUniqueKey, withProcessedAt},
		run:    uniqueKeptScenario,
	},
	{
		name:   "a move to a dead-letter table frees the unique key and writes it there as NULL",
		shapes: []tableShape{withUniqueKey, withoutGroup},
		run:    uniqueDeadLetterScenario,
	},
	{
		name:   "PublishTx of a held key in a transaction whose snapshot predates the holder returns the holder, never a deleted row",
		forms:  []rowactor.Form{rowactor.FormLease},
		shapes: []tableShape{withUniqueKey},
		run:    uniqueSnapshotScenario,
	},
	{
		name: "a unique publish into a table without the column, or with an empty key, is refused before anything is written",
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			b := h.broker()
			for _, key := range []string{"k", ""} {
				tb := h.table
				if key == "" {
					tb.UniqueKey = "unique_key"
				}
				_, err := b.Publish(context.Background(), tb, h.queue, []byte("x"), rowactor.Unique(key))
				var ce *rowactor.ConfigError
				if !errors.As(err, &ce) || ce.Option != "Unique" {
					t.Fatalf("Publish with Unique(%q): %v", key, err)
				}
			}
			if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != 0 {
				t.Fatalf("%d rows written", n)
			}
			kept := h.table
			kept.Name, kept.ClearUniqueKeyAtAck = kept.Name+"_nokey", true
			if _, err := rowactor.Schema(h.d, kept); !errors.Is(err, rowactor.ErrConfig) {
				t.Fatalf("Schema with ClearUniqueKeyAtAck and no unique key: %v", err)
			}
		},
	},
	{
		name:   "a unique publish that conflicts on another unique index of the table is that index's error",
		forms:  []rowactor.Form{rowactor.FormLease},
		shapes: []tableShape{withUniqueKey},
		run:    uniqueOtherIndexScenario,
	},
	{
		name:   "a unique publish of the key a row in work holds returns that row at once",
		shapes: []tableShape{withUniqueKey},
		run:    uniqueHeldKeyScenario,
	},
}

// publishKey publishes a new row with key and returns its id; a publish that found the
// key held fails the test.
func (h *harness) publishKey(b *rowactor.Broker, key string) int64 {
	h.t.Helper()
	id, dup := h.publishKeyOrFind(b, key)
	if dup {
		h.t.Fatalf("Publish with Unique(%q) found the key held by row %d, want a new row", key, id)
	}
	return id
}

// publishHeldKey publishes key, which a row holds, and returns that row's id: the publish
// must say ErrDuplicate.
func (h *harness) publishHeldKey(b *rowactor.Broker, key string) int64 {
	h.t.Helper()
	id, dup := h.publishKeyOrFind(b, key)
	if !dup {
		h.t.Fatalf("Publish with Unique(%q) inserted row %d, want ErrDuplicate with the holder's id", key, id)
	}
	return id
}

// publishKeyOrFind publishes key and returns the id Publish gave, and whether it said the
// key was held (ErrDuplicate). Any other error fails the test.
func (h *harness) publishKeyOrFind(b *rowactor.Broker, key string) (int64, bool) {
	h.t.Helper()
	id, err := b.Publish(context.Background(), h.table, h.queue, []byte("job-"+key), rowactor.Unique(key))
	if err != nil && !errors.Is(err, rowactor.ErrDuplicate) {
		h.t.Fatalf("Publish with Unique(%q): %v", key, err)
	}
	if id == 0 {
		h.t.Fatalf("Publish with Unique(%q) returned no id (%v)", key, err)
	}
	return id, err != nil
}

func (h *harness) countKey(key string) int {
	h.t.Helper()
	return h.drv.count(h.t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE unique_key = ?", h.table.Name), key)
}

func uniqueScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	first := h.publishKey(b, "order-1")
	if again := h.publishHeldKey(b, "order-1"); again != first {
		t.Fatalf("the second publish of a held key returned %d, want the holder %d", again, first)
	}
	other := h.publishKey(b, "order-2")
	plain := h.publish(b, 2) // no key: NULLs never conflict
	if other == first || plain[0] == plain[1] {
		t.Fatalf("ids %d %d %v", first, other, plain)
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != 4 {
		t.Fatalf("%d rows, want 4", n)
	}
	if h.countKey("order-1") != 1 {
		t.Fatal("the key is not in its row's unique_key column")
	}
	// Deleted by its ack, the row frees its key.
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	h.waitSettled(4)
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != 0 {
		t.Fatalf("%d rows left after the acks", n)
	}
	if again := h.publishKey(b, "order-1"); again == first {
		t.Fatalf("a key freed by the row's deletion returned the deleted row's id %d", again)
	}
	h.waitSettled(1)
}

func uniqueRaceScenario(t *testing.T, h *harness, _ rowactor.Form) {
	brokers := []*rowactor.Broker{h.broker(), h.second()}
	var wg sync.WaitGroup
	ids := make(chan int64, 16)
	var dups atomic.Int64
	start := make(chan struct{})
	for _, b := range brokers {
		for range 8 {
			wg.Go(func() {
				<-start
				id, err := b.Publish(context.Background(), h.table, h.queue, []byte("race"), rowactor.Unique("race"))
				if errors.Is(err, rowactor.ErrDuplicate) {
					dups.Add(1)
				} else if err != nil {
					t.Error(err)
					return
				}
				ids <- id
			})
		}
	}
	close(start)
	wg.Wait()
	close(ids)
	var first int64
	n := 0
	for id := range ids {
		if n == 0 {
			first = id
		} else if id != first {
			t.Fatalf("racing publishes of one key returned ids %d and %d", first, id)
		}
		n++
	}
	if n != 16 {
		t.Fatalf("%d of 16 publishes returned", n)
	}
	if d := dups.Load(); d != 15 {
		t.Fatalf("%d of 16 racing publishes of one key said ErrDuplicate, want 15: the one that inserted must say so", d)
	}
	if c := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); c != 1 {
		t.Fatalf("%d rows after 16 racing publishes of one key", c)
	}
}

func uniqueKeptScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	first := h.publishKey(b, "report-7")
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	h.waitSettled(1)
	if st := h.row(first); !st.exists || st.processedAt == nil {
		t.Fatalf("row after its ack: %+v", st)
	}
	if again := h.publishHeldKey(b, "report-7"); again != first {
		t.Fatalf("a finished row's key published again: %d, want the finished row %d", again, first)
	}
	h.quiet(200 * time.Millisecond) // nothing new to handle

	// The same with ClearUniqueKeyAtAck, on a table of its own.
	cleared := *h
	cleared.table.Name += "_cleared"
	cleared.table.ClearUniqueKeyAtAck = true
	cleared.createTable(cleared.table)
	b2 := cleared.broker()
	id := cleared.publishKey(b2, "report-7")
	cleared.subscribe(b2, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
	cleared.waitSettled(1)
	if cleared.countKey("report-7") != 0 {
		t.Fatal("the ack kept the key although ClearUniqueKeyAtAck")
	}
	if again := cleared.publishKey(b2, "report-7"); again == id {
		t.Fatalf("a key cleared at the ack returned the finished row %d", again)
	}
	cleared.waitSettled(1)
}

func uniqueDeadLetterScenario(t *testing.T, h *harness, _ rowactor.Form) {
	dead := h.table
	dead.Name = h.table.Name + "_dead"
	h.createTable(dead) // with its own unique index: two dead letters of one key must both fit
	b := h.broker()
	h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Fail(errors.New("no")) },
		rowactor.MaxAttempts(1), rowactor.DeadLetterTable(dead.Name))
	for round := range 2 {
		id := h.publishKey(b, "k")
		if s := h.waitSettled(1)[0]; s.Step != "dead_letter" || s.Err != nil {
			t.Fatalf("round %d: settlement %+v", round, s)
		}
		if h.row(id).exists {
			t.Fatalf("round %d: row still in the queue table", round)
		}
		if !h.drv.state(t, h.d, dead, id).exists {
			t.Fatalf("round %d: row %d not in the dead-letter table", round, id)
		}
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE unique_key IS NULL", dead.Name)); n != 2 {
		t.Fatalf("%d dead letters with a NULL key, want 2", n)
	}
}

// snapshotLevels are the isolation levels a service transaction of the database may
// read at, each with how to open one ("" is the database's own default).
func snapshotLevels(drv driver) []string {
	switch drv.name {
	case "postgres":
		return []string{"repeatable read", "serializable"}
	case "mysql":
		// Serializable makes every read a locking one: the cancel would wait for the
		// transaction, and the snapshot cannot go stale.
		return []string{"repeatable read"}
	}
	return []string{""}
}

// beginAt opens a transaction of the type PublishTx takes at level ("" the default).
func beginAt(t *testing.T, h *harness, level string) (tx any, rollback func() error) {
	t.Helper()
	if h.drv.name == "mysql" && level != "" {
		// A transaction's level is set before it starts.
		iso := map[string]sql.IsolationLevel{"repeatable read": sql.LevelRepeatableRead, "serializable": sql.LevelSerializable}[level]
		x, err := mysqlDB(h.d).BeginTx(context.Background(), &sql.TxOptions{Isolation: iso})
		if err != nil {
			t.Fatal(err)
		}
		return x, x.Rollback
	}
	tx, _, rollback = h.drv.begin(t, h.d)
	if level != "" {
		if err := h.drv.txExec(context.Background(), tx, "SET TRANSACTION ISOLATION LEVEL "+level); err != nil {
			_ = rollback()
			t.Fatal(err)
		}
	}
	return tx, rollback
}

// uniqueSnapshotScenario: row X holds key K; a service transaction reads the table (its
// snapshot starts); X is cancelled and K published again as Y; the transaction's
// PublishTx(Unique(K)) meets Y's key. It must answer Y, or refuse as the database refuses
// a transaction whose snapshot cannot see Y (a serialization failure, to be retried): the
// id of X, gone, would make the caller track a row that no longer exists.
func uniqueSnapshotScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	other := h.newD()
	for _, level := range snapshotLevels(h.drv) {
		label := level
		if label == "" {
			label = "default"
		}
		key := "order-" + strings.ReplaceAll(label, " ", "-")
		x := h.publishKey(b, key)
		tx, rollback := beginAt(t, h, level)
		if err := h.drv.txExec(ctx, tx, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); err != nil {
			_ = rollback()
			t.Fatalf("%s: read in the transaction: %v", label, err)
		}
		h.drv.exec(t, other, fmt.Sprintf("DELETE FROM %s WHERE id = ?", h.table.Name), x)
		y := h.publishKey(b, key)
		got, err := b.PublishTx(ctx, tx, h.table, h.queue, []byte("again"), rowactor.Unique(key))
		_ = rollback()
		if errors.Is(err, rowactor.ErrDuplicate) {
			err = nil // the holder's id, as wanted
		}
		switch {
		case err == nil && got != y:
			t.Fatalf("%s: PublishTx of key %q held by row %d returned %d (the deleted row was %d)", label, key, y, got, x)
		case err != nil && dialects.Classify(h.d, err) != dialects.FaultContention:
			t.Fatalf("%s: PublishTx of a key held by a row newer than the snapshot: %v, want row %d or a serialization failure", label, err, y)
		case err != nil:
			t.Logf("%s: refused as a serialization failure: %v", label, err)
		}
		if n := h.countKey(key); n != 1 {
			t.Fatalf("%s: %d rows hold key %q", label, n, key)
		}
	}
}

// runPublisherChild publishes job.UniqueKey from 8 goroutines at job.StartAt and writes
// every id Publish returned, a line each.
func runPublisherChild(job childJob, out *os.File) int {
	ctx := context.Background()
	b, err := rowactor.Open(ctx, job.URL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	time.Sleep(time.Until(job.StartAt))
	ids := make([]int64, 8)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			ids[i], errs[i] = b.Publish(ctx, job.Table, job.Queue, []byte("race"), rowactor.Unique(job.UniqueKey))
			if errors.Is(errs[i], rowactor.ErrDuplicate) {
				errs[i] = nil // the holder's id: counted by the parent
			}
		})
	}
	wg.Wait()
	code := 0
	for i := range ids {
		if errs[i] != nil {
			fmt.Fprintln(os.Stderr, "child: publish:", errs[i])
			code = 1
		}
		fmt.Fprintf(out, "%d\n", ids[i])
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := b.Shutdown(sctx); err != nil {
		fmt.Fprintln(os.Stderr, "child: shutdown:", err)
		code = 1
	}
	return code
}

// TestUniquePublishRacesAcrossProcesses: two OS processes, 8 goroutines each, publish one
// unique key at the same instant; every publish returns the same id and the table holds
// one row, on every database.
func TestUniquePublishRacesAcrossProcesses(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		if drv.url == nil {
			continue
		}
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease, withUniqueKey)
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now().Add(2 * time.Second) // both processes up and connected by then
			var procs []*exec.Cmd
			var outs []string
			for i := range 2 {
				job := childJob{URL: drv.url(t, h.d), Table: h.table, Queue: h.queue, UniqueKey: "race-key", StartAt: start,
					Out: filepath.Join(t.TempDir(), fmt.Sprintf("publisher%d.txt", i))}
				spec, _ := json.Marshal(job)
				cmd := exec.Command(exe, "-test.run=^$")
				cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				procs, outs = append(procs, cmd), append(outs, job.Out)
			}
			for _, cmd := range procs {
				if err := cmd.Wait(); err != nil {
					t.Fatalf("publisher process: %v", err)
				}
			}
			ids := map[string]int{}
			for _, path := range outs {
				data, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				for _, line := range strings.Fields(string(data)) {
					ids[line]++
				}
			}
			if len(ids) != 1 || ids[fmt.Sprint(h.drv.count(t, h.d, "SELECT max(id) FROM "+h.table.Name))] != 16 {
				t.Fatalf("16 publishes of one key from two processes returned ids %v", ids)
			}
			if n := h.drv.count(t, h.d, "SELECT count(*) FROM "+h.table.Name); n != 1 {
				t.Fatalf("%d rows after 16 racing publishes of one key from two processes", n)
			}
		})
	}
}

// TestUniqueKeysCompareExactly: a unique key is a key: two keys that differ in case,
// accents or trailing spaces are two keys on every database, as PostgreSQL and SQLite
// compare them. Each publish of a new key inserts its own row and returns its own id; a
// publish that returned another key's holder would silently drop the message.
func TestUniqueKeysCompareExactly(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease, withUniqueKey)
			b := h.broker()
			keys := []string{"order-a", "ORDER-A", "order-á", "order-a ", "order-ä"}
			ids := map[int64]string{}
			for _, k := range keys {
				id := h.publishKey(b, k)
				if prev, ok := ids[id]; ok {
					t.Errorf("Publish with Unique(%q) returned id %d, the row of key %q: the message was not written", k, id, prev)
					continue
				}
				ids[id] = k
			}
			if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != len(keys) {
				t.Fatalf("%d rows for %d distinct keys", n, len(keys))
			}
			// The held keys are still recognised, each as its own.
			for id, k := range ids {
				if again := h.publishHeldKey(b, k); again != id {
					t.Errorf("Unique(%q) again returned %d, want its holder %d", k, again, id)
				}
			}
		})
	}
}

// TestUniqueLongKeyIsNotTruncated: a key longer than the column Schema renders is an
// error, never a truncated key that could collide with another.
func TestUniqueLongKeyIsNotTruncated(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease, withUniqueKey)
			b := h.broker()
			base := strings.Repeat("k", 300)
			id1, err1 := b.Publish(context.Background(), h.table, h.queue, []byte("1"), rowactor.Unique(base+"1"))
			id2, err2 := b.Publish(context.Background(), h.table, h.queue, []byte("2"), rowactor.Unique(base+"2"))
			t.Logf("long keys: %d %v / %d %v", id1, err1, id2, err2)
			if err1 == nil && err2 == nil && id1 == id2 {
				t.Fatalf("two different 301-character keys returned one id %d", id1)
			}
		})
	}
}

// TestUniquePublishInARolledBackTxLeavesTheKeyFree: a unique publish in a transaction
// rolled back leaves the key free.
func TestUniquePublishInARolledBackTxLeavesTheKeyFree(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease, withUniqueKey)
			b := h.broker()
			tx, _, rollback := drv.begin(t, h.d)
			id1, err := b.PublishTx(context.Background(), tx, h.table, h.queue, []byte("1"), rowactor.Unique("rb"))
			if err != nil {
				t.Fatal(err)
			}
			id1b, err := b.PublishTx(context.Background(), tx, h.table, h.queue, []byte("1b"), rowactor.Unique("rb"))
			if !errors.Is(err, rowactor.ErrDuplicate) || id1b != id1 {
				t.Fatalf("second publish in the same transaction: %d %v, want %d", id1b, err, id1)
			}
			if err := rollback(); err != nil {
				t.Fatal(err)
			}
			// (SQLite may hand the rolled-back id out again: ids of rows never committed
			// are free.)
			h.publishKey(b, "rb")
			if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != 1 {
				t.Fatalf("%d rows after the rollback and one publish", n)
			}
			if n := h.countKey("rb"); n != 1 {
				t.Fatalf("%d rows hold the key", n)
			}
		})
	}
}

// uniqueOtherIndexScenario: the table has a unique index of the service's own besides the
// key's. A publish that breaks it is that index's error, not "held already" (the other
// row's id returned and the message lost) nor a failed lookup of the key. MariaDB's
// ON DUPLICATE KEY cannot name the key's index: the publish finds the conflict by the
// insert id its update leaves.
func uniqueOtherIndexScenario(t *testing.T, h *harness, _ rowactor.Form) {
	col := "payload"
	if h.drv.name == "mysql" {
		col = "payload(20)" // a BLOB's index needs a prefix
	}
	h.drv.exec(t, h.d, fmt.Sprintf("CREATE UNIQUE INDEX %s_payload ON %s (%s)", h.table.Name, h.table.Name, col))
	b := h.broker()
	ctx := context.Background()
	first, err := b.Publish(ctx, h.table, h.queue, []byte("same"), rowactor.Unique("k1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]rowactor.PublishOption{{rowactor.Unique("k2")}, nil} {
		id, err := b.Publish(ctx, h.table, h.queue, []byte("same"), opts...)
		if err == nil {
			t.Fatalf("a publish breaking the payload index returned id %d (the first row is %d): the message is lost", id, first)
		}
		if msg := err.Error(); !strings.Contains(msg, "duplicate key") && !strings.Contains(msg, "UNIQUE constraint failed") &&
			!strings.Contains(msg, "Duplicate entry") {
			t.Fatalf("a publish breaking the payload index: %v; want the index's own error", err)
		}
	}
	// A row without a key, and a publish without a key breaking the other index with it.
	if _, err := b.Publish(ctx, h.table, h.queue, []byte("keyless")); err != nil {
		t.Fatal(err)
	}
	if id, err := b.Publish(ctx, h.table, h.queue, []byte("keyless")); err == nil {
		t.Fatalf("a keyless publish breaking the payload index returned id %d: the message is lost", id)
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != 2 {
		t.Fatalf("%d rows, want the first two only", n)
	}
}

// uniqueHeldKeyScenario: a handler publishes the key its own row holds (a follow-up it
// means to deduplicate). The row lock form holds the row's lock all the while: the
// publish must not wait for it (on MariaDB, ON DUPLICATE KEY UPDATE would wait up to
// innodb_lock_wait_timeout: the handler waiting on itself).
func uniqueHeldKeyScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	id := h.publishKey(b, "held")
	got := make(chan error, 1)
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		c, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		again, err := b.Publish(c, h.table, h.queue, []byte("again"), rowactor.Unique("held"))
		if errors.Is(err, rowactor.ErrDuplicate) {
			err = nil
		} else if err == nil {
			err = errors.New("the publish of a held key inserted a row and said nothing")
		}
		if err == nil && again != d.ID() {
			err = fmt.Errorf("the publish returned id %d, the row holding the key is %d", again, d.ID())
		}
		got <- err
		return rowactor.Ack()
	})
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("a publish of the key row %d holds, from its own handler: %v", id, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	h.waitSettled(1)
	if n := h.countKey("held"); n != 0 {
		t.Fatalf("%d rows hold the key after the ack", n)
	}
}

// TestUniqueLongKeyNotTruncatedOnANonStrictMySQLSession: on a MySQL session without
// strict mode the server stores a value longer than its column cut, with a warning: two
// long keys that share the column's length must not become one key, the second publish
// returning the first's row and writing nothing.
func TestUniqueLongKeyNotTruncatedOnANonStrictMySQLSession(t *testing.T) {
	t.Parallel()
	drv := driverNamed(t, "mysql")
	h := newHarness(t, drv, rowactor.FormLease, withUniqueKey)
	d, err := mysql.Open(context.Background(), mysqlDSN()+"&sql_mode=%27NO_ENGINE_SUBSTITUTION%27")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	b := h.brokerOn(d)
	base := strings.Repeat("k", 1000)
	id1, err1 := b.Publish(context.Background(), h.table, h.queue, []byte("1"), rowactor.Unique(base+"1"))
	id2, err2 := b.Publish(context.Background(), h.table, h.queue, []byte("2"), rowactor.Unique(base+"2"))
	t.Logf("%d %v / %d %v", id1, err1, id2, err2)
	if err1 == nil && err2 == nil && id1 == id2 {
		t.Fatalf("two different 1,001-byte keys returned one id %d: the second message was not written", id1)
	}
}
