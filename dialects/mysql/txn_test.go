package mysql

import (
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// effectsTable creates the table a handler writes to through its lent transaction.
func effectsTable(t *testing.T, d *Dialect) string {
	t.Helper()
	name := tableName(t, d, "ra_fx")
	mustExec(t, d.DB(), "CREATE TABLE "+quote(name)+" (id BIGINT PRIMARY KEY, v VARCHAR(20) NOT NULL) ENGINE=InnoDB")
	return name
}

// sqlTx is the *sql.Tx a DeliveryTx lends.
func sqlTx(t *testing.T, dt dialects.DeliveryTx) *sql.Tx {
	t.Helper()
	tx, ok := dt.Tx().(*sql.Tx)
	if !ok || tx == nil {
		t.Fatalf("Tx() is %T %v, want a *sql.Tx", dt.Tx(), dt.Tx())
	}
	return tx
}

// handlerWrite is a handler's write through its transaction: row id of the effects table.
func handlerWrite(t *testing.T, dt dialects.DeliveryTx, fx string, id int64) {
	t.Helper()
	if _, err := sqlTx(t, dt).ExecContext(ctx, "INSERT INTO "+quote(fx)+" (id, v) VALUES (?, 'handler')", id); err != nil {
		t.Fatal(err)
	}
}

// committed reports whether the handler's write of id is visible outside its transaction.
func committed(t *testing.T, d *Dialect, fx string, id int64) bool {
	t.Helper()
	return count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(fx)+" WHERE id = ?", id) == 1
}

func openTxRowLock(t *testing.T, d *Dialect, spec dialects.QueueSpec) dialects.RowLockQueue {
	t.Helper()
	spec.Transactional = true
	return dialecttest.OpenRowLock(t, d, spec)
}

// Row lock: a handler whose write deadlocked (InnoDB rolled the claim transaction back,
// its savepoint and row lock with it): the rollback to the lost savepoint fails and ends
// the claim, and the row returns unsettled, its attempt not counted.
func TestTxRowLockLostSavepoint(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_txls", rowLockTable)
	fx := effectsTable(t, d)
	mustExec(t, d.DB(), "INSERT INTO "+quote(fx)+" (id, v) VALUES (2, 'before')")
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := openTxRowLock(t, d, dialects.QueueSpec{Table: tbl})
	c := dialecttest.ClaimTx(t, q)
	handlerWrite(t, c, fx, 1)
	err := deadlockVictim(t, d, fx, 2, fx, 1, func() error {
		_, err := sqlTx(t, c).ExecContext(ctx, "UPDATE "+quote(fx)+" SET v = 'handler' WHERE id = 2")
		return err
	})
	if !isDeadlock(err) {
		t.Fatalf("want the handler's write deadlocked, got %v", err)
	}
	if err := c.RollbackToSavepoint(ctx); err == nil {
		t.Fatal("a rollback to a lost savepoint succeeded")
	}
	if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetry}); err == nil {
		t.Fatal("a claim settled after its savepoint was lost")
	}
	if committed(t, d, fx, 1) {
		t.Error("the handler's write was committed")
	}
	if s, ok := stateOf(t, d, tbl, id); !ok || s.Attempt != 1 {
		t.Errorf("row %+v %v", s, ok)
	}
	again := claimLocked(t, q)
	if again.Row().ID != id {
		t.Errorf("claimed %d", again.Row().ID)
	}
	again.Rollback(ctx)
}

func openTxLease(t *testing.T, d *Dialect, spec dialects.QueueSpec) dialects.TxLeaseQueue {
	t.Helper()
	spec.Transactional = true
	q := dialecttest.OpenLease(t, d, spec)
	tq, ok := q.(dialects.TxLeaseQueue)
	if !ok {
		t.Fatalf("a transactional lease queue is %T, not a TxLeaseQueue", q)
	}
	return tq
}

func beginDelivery(t *testing.T, q dialects.TxLeaseQueue) dialects.LeaseTx {
	t.Helper()
	tx, err := q.BeginDelivery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	return tx
}

// deadlockVictim makes settle, a settlement inside a delivery's transaction that has
// written row fxID of fx, the victim of a deadlock: another transaction, heavier (it has
// inserted many rows, and InnoDB rolls back the lighter one), locks the queue row and then
// waits for the handler's row; settle then waits for the queue row. It returns settle's
// error once the other transaction has got its locks and rolled back.
func deadlockVictim(t *testing.T, d *Dialect, table string, id int64, fx string, fxID int64, settle func() error) error {
	t.Helper()
	heavy := tableName(t, d, "ra_heavy")
	mustExec(t, d.DB(), "CREATE TABLE "+quote(heavy)+" (id INT PRIMARY KEY) ENGINE=InnoDB")
	other := beginOn(t, d.DB())
	var otherConn int64
	if err := other.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&otherConn); err != nil {
		t.Fatal(err)
	}
	values := strings.TrimSuffix(strings.Repeat("(?),", 500), ",")
	args := make([]any, 500)
	for i := range args {
		args[i] = i
	}
	if _, err := other.ExecContext(ctx, "INSERT INTO "+quote(heavy)+" VALUES "+values, args...); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ExecContext(ctx, "SELECT id FROM "+quote(table)+" WHERE id = ? FOR UPDATE", id); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := other.ExecContext(ctx, "UPDATE "+quote(fx)+" SET v = 'other' WHERE id = ?", fxID)
		waited <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	// Once its UPDATE runs it can only wait: the handler's transaction holds the row.
	// (INNODB_TRX's LOCK WAIT state lags, being a cache.)
	for count(t, d.DB(), "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO LIKE 'UPDATE%'", otherConn) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the other transaction never waited for the handler's row")
		}
		time.Sleep(5 * time.Millisecond)
	}
	err := settle()
	if werr := <-waited; werr != nil {
		t.Fatalf("the heavier transaction was the victim: %v", werr)
	}
	if rerr := other.Rollback(); rerr != nil {
		t.Fatal(rerr)
	}
	return err
}

// Lease: a settlement inside the delivery's transaction that deadlocks is not retried (the
// handler's writes are gone with the transaction InnoDB rolled back): it returns the error
// and nothing is committed, neither then nor by a replay once the other transaction ended.
func TestTxLeaseDeadlockIsNotRetried(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_txdl", leaseTable)
	fx := effectsTable(t, d)
	q := openTxLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	held := dialecttest.ClaimOne(t, d, q, tbl)
	tx := beginDelivery(t, q)
	handlerWrite(t, tx, fx, 1)
	err := deadlockVictim(t, d, tbl.Name, held.ID, fx, 1, func() error {
		ok, err := tx.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, held)
		if ok {
			t.Error("a deadlocked settlement reported success")
		}
		return err
	})
	if !isDeadlock(err) || !IsRetryable(err) {
		t.Fatalf("want the deadlock, got %v", err)
	}
	if committed(t, d, fx, 1) {
		t.Error("the handler's write was committed")
	}
	s, ok := stateOf(t, d, tbl, held.ID)
	if !ok {
		t.Fatal("the settlement was replayed: the row is gone")
	}
	sameTime(t, "locked_until", s.LockedUntil, held.Token)
	if err := tx.Rollback(ctx); err != nil {
		t.Errorf("rollback after the deadlock: %v", err)
	}
	// The lease is still the delivery's: the settlement outside the transaction works.
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepRelease}, held); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
}

func openTxAdvisory(t *testing.T, d *Dialect, spec dialects.QueueSpec) dialects.AdvisoryQueue {
	t.Helper()
	spec.Transactional = true
	return dialecttest.OpenAdvisory(t, d, spec)
}

// takeTx locks key on a new transactional session, takes row id and returns the session
// (its transaction not begun).
func takeTx(t *testing.T, q dialects.AdvisoryQueue, key string, id int64) dialects.TxSession {
	t.Helper()
	s := dialecttest.NewSession(t, q)
	ts, ok := s.(dialects.TxSession)
	if !ok {
		t.Fatalf("a transactional session is %T, not a TxSession", s)
	}
	if !dialecttest.TryLock(t, ts, key) {
		t.Fatal("lock refused")
	}
	if _, ok, err := ts.Take(ctx, id, t0); !ok || err != nil {
		t.Fatalf("take %v %v", ok, err)
	}
	return ts
}

func txSessionConnID(t *testing.T, s dialects.TxSession) int64 {
	t.Helper()
	var id int64
	if err := s.(txSession).conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// Advisory: the dead-letter move inside the transaction is not retried after a deadlock:
// the error returns, the transaction is rolled back and Commit reports it.
func TestTxAdvisoryDeadlockIsNotRetried(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_txadl", advisoryTable)
	dead := newTable(t, d, "ra_txadl_dead", advisoryTable)
	fx := effectsTable(t, d)
	q := openTxAdvisory(t, d, dialects.QueueSpec{Table: tbl, DeadLetterTable: dead.Name})
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("poison")})
	s := takeTx(t, q, keyOf(t, d, tbl, id), id)
	if err := s.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	handlerWrite(t, s, fx, 1)
	err := deadlockVictim(t, d, tbl.Name, id, fx, 1, func() error {
		return s.Settle(ctx, dialects.Step{Kind: dialects.StepDeadLetter}, id)
	})
	if !isDeadlock(err) {
		t.Fatalf("want the deadlock, got %v", err)
	}
	if s.Tx() != nil {
		t.Error("the failed settlement left the transaction open")
	}
	if err := s.Commit(ctx); err == nil {
		t.Error("Commit after a failed settlement reported success")
	}
	if closed, err := s.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock %v %v", closed, err)
	}
	if committed(t, d, fx, 1) {
		t.Error("the handler's write was committed")
	}
	if _, ok := stateOf(t, d, tbl, id); !ok {
		t.Error("the move was replayed: the row left the queue")
	}
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(dead.Name)); n != 0 {
		t.Errorf("the move was replayed: %d rows copied", n)
	}
}

// Advisory: a statement inside the transaction that fails (here a lock wait timeout, which
// InnoDB answers by rolling back the statement only) rolls the whole transaction back.
func TestTxAdvisoryFailedSettleRollsBack(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_txaf", advisoryTable)
	fx := effectsTable(t, d)
	q := openTxAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	s := takeTx(t, q, keyOf(t, d, tbl, id), id)
	if err := s.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	tx := sqlTx(t, s)
	if _, err := tx.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
		t.Fatal(err)
	}
	handlerWrite(t, s, fx, 1)
	other := beginOn(t, d.DB())
	if _, err := other.ExecContext(ctx, "SELECT id FROM "+quote(tbl.Name)+" WHERE id = ? FOR UPDATE", id); err != nil {
		t.Fatal(err)
	}
	err := s.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, id)
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != errLockWaitTimeout {
		t.Fatalf("want the lock wait timeout, got %v", err)
	}
	if err := other.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx); err == nil {
		t.Error("Commit after a failed settlement reported success")
	}
	if closed, err := s.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock %v %v", closed, err)
	}
	if committed(t, d, fx, 1) {
		t.Error("the handler's write survived the failed settlement")
	}
	if st, ok := stateOf(t, d, tbl, id); !ok || st.ProcessedAt != nil {
		t.Errorf("row %+v %v", st, ok)
	}
}

// The transaction lent in each form runs at the table's declared level, READ COMMITTED
// when none is. The level is read from information_schema.INNODB_TRX: on MariaDB 10.11
// @@tx_isolation is the session's default, not the level SET TRANSACTION gave the
// current transaction (database/sql sets it per transaction), and @@transaction_isolation
// does not exist.
func TestTxIsolation(t *testing.T) {
	d := newDialect(t)
	fx := effectsTable(t, d)
	var fxID int64
	forms := []struct {
		name string
		// lend opens a delivery's transaction on a table of the form at level.
		lend func(t *testing.T, level dialects.Isolation) dialects.DeliveryTx
	}{
		{"row lock", func(t *testing.T, level dialects.Isolation) dialects.DeliveryTx {
			tbl := newTable(t, d, "ra_txiso", func(name string) dialects.Table {
				tbl := rowLockTable(name)
				tbl.Isolation = level
				return tbl
			})
			dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
			return dialecttest.ClaimTx(t, openTxRowLock(t, d, dialects.QueueSpec{Table: tbl}))
		}},
		{"lease", func(t *testing.T, level dialects.Isolation) dialects.DeliveryTx {
			tbl := newTable(t, d, "ra_txiso", func(name string) dialects.Table {
				tbl := leaseTable(name)
				tbl.Isolation = level
				return tbl
			})
			q := openTxLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
			dialecttest.ClaimOne(t, d, q, tbl)
			return beginDelivery(t, q)
		}},
		{"advisory", func(t *testing.T, level dialects.Isolation) dialects.DeliveryTx {
			tbl := newTable(t, d, "ra_txiso", func(name string) dialects.Table {
				tbl := advisoryTable(name)
				tbl.Isolation = level
				return tbl
			})
			id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
			s := takeTx(t, openTxAdvisory(t, d, dialects.QueueSpec{Table: tbl}), keyOf(t, d, tbl, id), id)
			if err := s.Begin(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Rollback(ctx) })
			return s
		}},
	}
	levels := []struct {
		declared dialects.Isolation
		want     string
	}{
		{"", "READ COMMITTED"},
		{dialects.ReadUncommitted, "READ UNCOMMITTED"},
		{dialects.ReadCommitted, "READ COMMITTED"},
		{dialects.RepeatableRead, "REPEATABLE READ"},
		{dialects.Serializable, "SERIALIZABLE"},
	}
	for _, f := range forms {
		for _, l := range levels {
			name := string(l.declared)
			if name == "" {
				name = "default"
			}
			t.Run(f.name+"/"+name, func(t *testing.T) {
				dt := f.lend(t, l.declared)
				// A write makes the transaction one InnoDB lists.
				fxID++
				handlerWrite(t, dt, fx, fxID)
				var conn int64
				if err := sqlTx(t, dt).QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&conn); err != nil {
					t.Fatal(err)
				}
				// INNODB_TRX is a cache refreshed at most every 100ms: past that, a read
				// sees the transaction as it is since the write.
				time.Sleep(150 * time.Millisecond)
				var got string
				err := d.DB().QueryRowContext(ctx, "SELECT trx_isolation_level FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ?", conn).Scan(&got)
				if err != nil {
					t.Fatalf("read the transaction's level: %v", err)
				}
				if got != l.want {
					t.Errorf("declared %q: the transaction runs at %s, want %s", l.declared, got, l.want)
				}
			})
		}
	}
}

// WatchSession: after Unlock the session's connection is alive with no InnoDB transaction
// open; after Abort the server has ended it.
func (harness) WatchSession(t *testing.T, d dialects.Dialect, s dialects.TxSession) func(bool) {
	t.Helper()
	db := d.(*Dialect).DB()
	conn := txSessionConnID(t, s)
	return func(closed bool) {
		t.Helper()
		if closed {
			waitGone(t, db, conn)
			return
		}
		if !connectionAlive(t, db, conn) {
			t.Fatal("the connection was closed")
		}
		if n := count(t, db, "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ?", conn); n != 0 {
			t.Errorf("a transaction is still open on the pooled connection")
		}
	}
}
