package sqlite

import (
	"database/sql"
	"errors"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	msqlite "modernc.org/sqlite"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// txFixture is a database with a queue table and a table for the handler's own writes.
func txFixture(t *testing.T, d *Dialect, tbl dialects.Table) {
	t.Helper()
	createTable(t, d, tbl)
	mustExec(t, d, "CREATE TABLE notes (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
}

func beginLease(t *testing.T, q dialects.LeaseQueue) (dialects.LeaseTx, *sql.Tx) {
	t.Helper()
	tq, ok := q.(dialects.TxLeaseQueue)
	if !ok {
		t.Fatalf("%T is not a TxLeaseQueue", q)
	}
	ltx, err := tq.BeginDelivery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ltx.Rollback(ctx) })
	tx, ok := ltx.Tx().(*sql.Tx)
	if !ok || tx == nil {
		t.Fatalf("Tx() = %T, want a *sql.Tx", ltx.Tx())
	}
	return ltx, tx
}

func note(t *testing.T, tx *sql.Tx, v string) {
	t.Helper()
	if _, err := tx.ExecContext(ctx, "INSERT INTO notes (v) VALUES (?)", v); err != nil {
		t.Fatal(err)
	}
}

func ack() dialects.Step { return dialects.Step{Kind: dialects.StepAck, Now: t0} }

func TestTxLeaseEndedByHandler(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
	txFixture(t, d, tbl)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true})
	r := dialecttest.ClaimOne(t, d, q, tbl)

	ltx, tx := beginLease(t, q)
	note(t, tx, "x")
	// The handler rolls the transaction back behind rowactor's back: an ack now must not
	// commit on its own.
	if _, err := tx.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	ok, err := ltx.SettleLease(ctx, ack(), r)
	if ok || !errors.Is(err, errNotInTx) {
		t.Fatalf("settle: %v %v", ok, err)
	}
	if _, found := stateOf(t, d, "jobs", r.ID); !found {
		t.Error("the row was acked outside the transaction")
	}
	if n := d.DB().Stats().InUse; n != 0 {
		t.Errorf("%d connections still in use", n)
	}
}

// A settlement inside a delivery's transaction does not wait for this process's writer
// turn: here a claim holds the turn while it waits for the write lock the delivery holds.
func TestTxLeaseSettleSkipsWriterTurn(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
	tbl.Mode = dialects.Immediate
	txFixture(t, d, tbl)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", Transactional: true})
	r := dialecttest.ClaimOne(t, d, q, tbl)
	dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("second")})

	ltx, tx := beginLease(t, q)
	note(t, tx, "x")
	claimed := make(chan error, 1)
	go func() {
		_, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
		claimed <- err
	}()
	// Wait until the claim holds the writer turn.
	f, _ := d.fileEntry(ctx)
	for deadline := time.Now().Add(5 * time.Second); len(f.writer) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the claim never took the writer turn")
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	if ok, err := ltx.SettleLease(ctx, ack(), r); err != nil || !ok {
		t.Fatalf("settle: %v %v", ok, err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the settlement waited %v", took)
	}
	if err := <-claimed; err != nil {
		t.Errorf("the claim waiting for the delivery failed: %v", err)
	}
}

// busy reports an SQLITE_BUSY error.
func busy(err error) bool {
	var se *msqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == 5
}

// foreign opens a second pool on the file with a short busy timeout, as another process
// would, in the given journal mode.
func foreign(t *testing.T, path, journal string) *sql.DB {
	t.Helper()
	q := url.Values{"_pragma": {"busy_timeout(50)", "journal_mode(" + journal + ")"}}
	db, err := sql.Open("sqlite", "file:"+filepath.ToSlash(path)+"?"+q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestTxModes checks that each mode locks what SQLite's BEGIN of that mode locks, while the
// delivery has run nothing yet: immediate and exclusive hold the write lock, deferred
// nothing; in rollback-journal mode exclusive also keeps readers out.
func TestTxModes(t *testing.T) {
	cases := []struct {
		journal      string
		mode         dialects.Mode
		blocksWrites bool
		blocksReads  bool
	}{
		{"WAL", "", false, false},
		{"WAL", dialects.Deferred, false, false},
		{"WAL", dialects.Immediate, true, false},
		{"WAL", dialects.Exclusive, true, false},
		{"DELETE", dialects.Deferred, false, false},
		{"DELETE", dialects.Immediate, true, false},
		{"DELETE", dialects.Exclusive, true, true},
	}
	for _, c := range cases {
		t.Run(c.journal+"/"+string(c.mode), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "queue.db")
			other := foreign(t, path, c.journal)
			other.SetMaxOpenConns(1)                                      // one connection, whose schema is read before the delivery begins
			if _, err := other.ExecContext(ctx, "SELECT 1"); err != nil { // sets the journal mode
				t.Fatal(err)
			}
			var d *Dialect
			if c.journal == "WAL" {
				d = openFile(t, path)
			} else {
				db := foreign(t, path, c.journal)
				d = New(db)
				t.Cleanup(func() { d.Close() })
			}
			for _, form := range []dialects.Form{dialects.FormLease, dialects.FormAdvisory} {
				tbl := leaseTable("jobs_" + form.String())
				if form == dialects.FormAdvisory {
					tbl = advisoryTable("jobs_" + form.String())
				}
				tbl.Mode = c.mode
				txFixture(t, d, tbl)
				mustExec(t, d, "DROP TABLE notes")
				q, err := d.Open(ctx, dialects.QueueSpec{Table: tbl, Transactional: true})
				if err != nil {
					t.Fatal(err)
				}
				var n int
				if err := other.QueryRowContext(ctx, "SELECT count(*) FROM `"+tbl.Name+"`").Scan(&n); err != nil {
					t.Fatal(err)
				}
				var end func()
				if form == dialects.FormLease {
					ltx, err := q.(dialects.TxLeaseQueue).BeginDelivery(ctx)
					if err != nil {
						t.Fatal(err)
					}
					end = func() { ltx.Rollback(ctx) }
				} else {
					s, err := q.(dialects.AdvisoryQueue).Session(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if err := s.(dialects.TxSession).Begin(ctx); err != nil {
						t.Fatal(err)
					}
					end = func() { s.Unlock(ctx) }
				}

				start := time.Now()
				_, werr := other.ExecContext(ctx, "INSERT INTO `"+tbl.Name+"` (payload) VALUES (x'')")
				if c.blocksWrites != busy(werr) || (!c.blocksWrites && werr != nil) {
					t.Errorf("%s: another connection's write: %v", form, werr)
				}
				if took := time.Since(start); took > 5*time.Second {
					t.Errorf("%s: the write took %v", form, took)
				}
				rerr := other.QueryRowContext(ctx, "SELECT count(*) FROM `"+tbl.Name+"`").Scan(&n)
				if c.blocksReads != busy(rerr) || (!c.blocksReads && rerr != nil) {
					t.Errorf("%s: another connection's read: %v", form, rerr)
				}
				end()
				if _, err := other.ExecContext(ctx, "INSERT INTO `"+tbl.Name+"` (payload) VALUES (x'')"); err != nil {
					t.Errorf("%s: a write after the delivery ended: %v", form, err)
				}
				q.Close()
			}
		})
	}
}

// A BEGIN that cannot get the write lock fails with SQLITE_BUSY after busy_timeout, and
// its connection does not return to the pool inside a transaction.
func TestTxBeginBusy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.db")
	d := New(foreign(t, path, "WAL"))
	t.Cleanup(func() { d.Close() })
	tbl := leaseTable("jobs")
	tbl.Mode = dialects.Immediate
	txFixture(t, d, tbl)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Transactional: true}).(dialects.TxLeaseQueue)

	holder, err := foreign(t, path, "WAL").Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	if _, err := q.BeginDelivery(ctx); !busy(err) {
		t.Fatalf("begin while another connection writes: %v", err)
	}
	if _, err := holder.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if n := d.DB().Stats().InUse; n != 0 {
		t.Errorf("%d connections still in use", n)
	}
	for range 3 { // whichever connection the pool hands out is outside a transaction
		if _, err := d.DB().ExecContext(ctx, "INSERT INTO notes (v) VALUES ('x')"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := foreign(t, path, "WAL").ExecContext(ctx, "INSERT INTO notes (v) VALUES ('y')"); err != nil {
		t.Errorf("a connection was left holding the write lock: %v", err)
	}
}

func TestTxOpenAcceptsForms(t *testing.T) {
	d := newDialect(t)
	for _, tbl := range []dialects.Table{leaseTable("leases"), advisoryTable("keys")} {
		tbl.Mode = dialects.Exclusive
		createTable(t, d, tbl)
		q, err := d.Open(ctx, dialects.QueueSpec{Table: tbl, Transactional: true})
		if err != nil {
			t.Fatalf("%s: %v", tbl.Name, err)
		}
		q.Close()
		tbl.Mode = ""
		tbl.Isolation = dialects.ReadCommitted
		_, err = d.Open(ctx, dialects.QueueSpec{Table: tbl, Transactional: true})
		dialecttest.ConfigError(t, err)
	}
}

// WatchSession: whether unlocked or aborted, the transaction's connection is back.
func (*harness) WatchSession(t *testing.T, d dialects.Dialect, s dialects.TxSession) func(bool) {
	return func(bool) {
		t.Helper()
		if n := d.(*Dialect).DB().Stats().InUse; n != 0 {
			t.Errorf("%d connections still in use", n)
		}
	}
}

func (*harness) IsTxEnded(err error) bool { return errors.Is(err, errTxEnded) }
