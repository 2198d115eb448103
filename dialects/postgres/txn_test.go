package postgres

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// sideTable creates a table a handler writes to through its lent transaction.
func sideTable(t *testing.T, d *Dialect) string {
	t.Helper()
	name := tableName(t, d)
	mustExec(t, d, "CREATE TABLE "+quote(name)+" (id bigserial PRIMARY KEY, note text NOT NULL)")
	return name
}

// write is a handler's write through its lent transaction.
func write(t *testing.T, tx any, side, note string) {
	t.Helper()
	ptx, ok := tx.(pgx.Tx)
	if !ok {
		t.Fatalf("Tx() returned %T, not a pgx.Tx", tx)
	}
	if _, err := ptx.Exec(ctx, "INSERT INTO "+quote(side)+" (note) VALUES ($1)", note); err != nil {
		t.Fatal(err)
	}
}

// written counts the committed rows of side with note.
func written(t *testing.T, d *Dialect, side, note string) int {
	t.Helper()
	return count(t, d, "SELECT count(*) FROM "+quote(side)+" WHERE note = $1", note)
}

func isolationOf(t *testing.T, tx any) string {
	t.Helper()
	var level string
	if err := tx.(pgx.Tx).QueryRow(ctx, "SHOW transaction_isolation").Scan(&level); err != nil {
		t.Fatal(err)
	}
	return level
}

func backendPID(t *testing.T, tx any) int {
	t.Helper()
	var pid int
	if err := tx.(pgx.Tx).QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// levels maps each level PostgreSQL opens to what SHOW transaction_isolation reads.
var levels = map[dialects.Isolation]string{
	"":                      "read committed", // plain BEGIN: the server's default
	dialects.ReadCommitted:  "read committed",
	dialects.RepeatableRead: "repeatable read",
	dialects.Serializable:   "serializable",
}

func TestOpenTransactional(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d)
	createTable(t, d, leaseTable(name))

	// A transactional lease table at repeatable read or serializable is refused.
	for _, level := range []dialects.Isolation{dialects.RepeatableRead, dialects.Serializable} {
		tbl := leaseTable(name)
		tbl.Isolation = level
		q, err := d.Open(ctx, dialects.QueueSpec{Table: tbl, Transactional: true})
		if err == nil {
			q.Close()
			t.Fatalf("%s: Open accepted a transactional lease table", level)
		}
		ce := dialecttest.ConfigError(t, err)
		if ce.Table != name || ce.Option != "Table.Isolation" {
			t.Errorf("%s: table %q option %q", level, ce.Table, ce.Option)
		}
		dialecttest.Contains(t, err.Error(), string(level))
		dialecttest.Contains(t, err.Error(), "renewer's extended lease")
		dialecttest.Contains(t, ce.Fix, "drop Transactional")
		// Outside transactional mode the level only concerns other forms: accepted.
		if q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl}); isTxLease(q) {
			t.Errorf("%s: a lease queue outside transactional mode lends transactions", level)
		}
	}
	for _, level := range []dialects.Isolation{"", dialects.ReadCommitted} {
		tbl := leaseTable(name)
		tbl.Isolation = level
		if q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Transactional: true}); !isTxLease(q) {
			t.Errorf("%q: Open returned %T, not a TxLeaseQueue", level, q)
		}
	}
	// The other forms serve every level transactionally.
	rl := rowLockTable(tableName(t, d))
	createTable(t, d, rl)
	adv := advisoryTable(tableName(t, d))
	createTable(t, d, adv)
	for level := range levels {
		rl.Isolation, adv.Isolation = level, level
		dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: rl, Transactional: true})
		dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: adv, Transactional: true})
	}
}

func isTxLease(q dialects.LeaseQueue) bool {
	_, ok := q.(dialects.TxLeaseQueue)
	return ok
}

func TestRowLockTransactional(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	side := sideTable(t, d)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})

	// Outside transactional mode the claim lends nothing.
	plain := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl})
	c, _ := claimLocked(t, plain, t0)
	if _, isTx := c.(dialects.TxLockedClaim); isTx {
		t.Error("a claim outside transactional mode lends its transaction")
	}
	c.Rollback(ctx)

	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl, Transactional: true})

	// Retry: the handler's writes roll back to the savepoint; the attempt is counted.
	tc := dialecttest.ClaimTx(t, q)
	write(t, tc.Tx(), side, "retried")
	if err := tc.RollbackToSavepoint(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tc.Settle(ctx, dialects.Step{Kind: dialects.StepRetry, Now: t0}); err != nil {
		t.Fatal(err)
	}
	if n := written(t, d, side, "retried"); n != 0 {
		t.Fatalf("a retry committed the handler's write (%d rows)", n)
	}
	if s, _ := stateOf(t, d, tbl, id); s.Attempt != 2 {
		t.Fatalf("the retry did not count the attempt: %+v", s)
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held after a retry", n)
	}

	// A handler statement that failed spoils the transaction; the rollback to the
	// savepoint recovers it, and the retry still counts.
	tc = dialecttest.ClaimTx(t, q)
	if _, err := tc.Tx().(pgx.Tx).Exec(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("a division by zero succeeded")
	}
	if err := tc.RollbackToSavepoint(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tc.Settle(ctx, dialects.Step{Kind: dialects.StepRetryAfter, Now: t0, At: t0}); err != nil {
		t.Fatal(err)
	}
	if s, _ := stateOf(t, d, tbl, id); s.Attempt != 3 || !sameTime(s.RetryAfter, t0) {
		t.Fatalf("after a failed handler's retry: %+v", s)
	}

	// Rollback discards the handler's writes and returns the row as it was.
	tc = dialecttest.ClaimTx(t, q)
	write(t, tc.Tx(), side, "rolled back")
	if err := tc.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := written(t, d, side, "rolled back"); n != 0 {
		t.Fatalf("a rollback committed the handler's write (%d rows)", n)
	}
	if err := tc.RollbackToSavepoint(ctx); err == nil {
		t.Error("a rollback to the savepoint of an ended claim succeeded")
	}

	// Ack commits the handler's writes with the settlement.
	tc = dialecttest.ClaimTx(t, q)
	if tc.Row().ID != id || tc.Row().Attempt != 3 {
		t.Fatalf("claimed %+v", tc.Row())
	}
	write(t, tc.Tx(), side, "acked")
	if n := written(t, d, side, "acked"); n != 0 {
		t.Fatal("the handler's write is visible before the settlement")
	}
	if err := tc.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}); err != nil {
		t.Fatal(err)
	}
	if _, exists := stateOf(t, d, tbl, id); exists {
		t.Fatal("ack kept the row")
	}
	if n := written(t, d, side, "acked"); n != 1 {
		t.Fatalf("the ack committed %d of the handler's writes", n)
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held after the ack", n)
	}
}

// A handler that ends its lent transaction itself has lost the row lock: the settlement
// refuses to run outside it, and the connection is not lost.
func TestRowLockTransactionalEndedByHandler(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl, Transactional: true})
	tc := dialecttest.ClaimTx(t, q)
	if _, err := tc.Tx().(pgx.Tx).Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if err := tc.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}); err == nil {
		t.Fatal("a settlement ran outside the claim transaction")
	} else {
		dialecttest.Contains(t, err.Error(), "ended outside rowactor")
	}
	if _, exists := stateOf(t, d, tbl, id); !exists {
		t.Fatal("the row was settled outside its claim")
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held", n)
	}
}

func TestLeaseTransactional(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	mustExec(t, d, "ALTER TABLE "+quote(tbl.Name)+" ADD CONSTRAINT not_dead CHECK (grp <> 'dead')")
	f := leaseTxFixture{d: d, tbl: tbl, side: sideTable(t, d), now: t0.Add(time.Second)}
	// Rows the handler publishes through its transaction go to another queue table.
	f.out = rowLockTable(tableName(t, d))
	createTable(t, d, f.out)
	var err error
	if f.pub, err = d.Publisher(ctx, f.out); err != nil {
		t.Fatal(err)
	}
	f.q = dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead", Transactional: true})

	f.rightTokenCommits(t)
	held, before := f.wrongTokenRollsBack(t)
	f.rollbackDiscards(t)
	f.failedStatementRollsBack(t, held, before)
}

// leaseTxFixture is TestLeaseTransactional's queue table, its side table, and the
// queue table out that the handler publishes to.
type leaseTxFixture struct {
	d    *Dialect
	tbl  dialects.Table
	side string
	out  dialects.Table
	pub  dialects.Publisher
	q    dialects.LeaseQueue
	now  time.Time
}

// claim publishes a row and claims it.
func (f *leaseTxFixture) claim(t *testing.T) dialects.Lease {
	t.Helper()
	id := dialecttest.Publish(t, f.d, f.tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	rows, err := f.q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(rows) != 1 || rows[0].ID != id {
		t.Fatalf("claim: %+v %v", rows, err)
	}
	return dialects.Lease{ID: id, Token: rows[0].Token}
}

// begin begins a delivery's transaction.
func (f *leaseTxFixture) begin(t *testing.T) dialects.LeaseTx {
	t.Helper()
	ltx, err := f.q.(dialects.TxLeaseQueue).BeginDelivery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ltx
}

// published reports whether row id of out is committed.
func (f *leaseTxFixture) published(t *testing.T, id int64) bool {
	t.Helper()
	_, exists := stateOf(t, f.d, f.out, id)
	return exists
}

// rightTokenCommits: with the right token the handler's writes, its publish and the ack
// commit together.
func (f *leaseTxFixture) rightTokenCommits(t *testing.T) {
	d := f.d
	held := f.claim(t)
	ltx := f.begin(t)
	if n := acquired(d); n != 1 {
		t.Fatalf("a delivery's transaction holds %d connections", n)
	}
	write(t, ltx.Tx(), f.side, "acked")
	pid, err := f.pub.Publish(ctx, ltx.Tx(), dialects.Message{Payload: []byte("out")})
	if err != nil {
		t.Fatal(err)
	}
	if f.published(t, pid) || written(t, d, f.side, "acked") != 0 {
		t.Fatal("the handler's writes are visible before the commit")
	}
	ok, err := ltx.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: f.now}, held)
	if err != nil || !ok {
		t.Fatalf("settle with the token: %v %v", ok, err)
	}
	if _, exists := stateOf(t, d, f.tbl, held.ID); exists {
		t.Fatal("ack kept the row")
	}
	if written(t, d, f.side, "acked") != 1 || !f.published(t, pid) {
		t.Fatal("the ack did not commit the handler's writes")
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held after the commit", n)
	}
	if _, err := ltx.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: f.now}, held); err == nil {
		t.Error("a second settlement of an ended transaction succeeded")
	}
	if err := ltx.Rollback(ctx); err != nil {
		t.Errorf("a rollback after the commit: %v", err)
	}
}

// wrongTokenRollsBack: with a wrong token everything rolls back, the handler's writes
// included. It returns the lease it claimed, still held, and its row as claimed.
func (f *leaseTxFixture) wrongTokenRollsBack(t *testing.T) (dialects.Lease, rowState) {
	d := f.d
	held := f.claim(t)
	before, _ := stateOf(t, d, f.tbl, held.ID)
	ltx := f.begin(t)
	write(t, ltx.Tx(), f.side, "lost")
	pid, err := f.pub.Publish(ctx, ltx.Tx(), dialects.Message{Payload: []byte("lost")})
	if err != nil {
		t.Fatal(err)
	}
	stale := dialects.Lease{ID: held.ID, Token: held.Token.Add(-time.Second)}
	ok, err := ltx.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: f.now}, stale)
	if err != nil || ok {
		t.Fatalf("settle with a wrong token: %v %v", ok, err)
	}
	if after, _ := stateOf(t, d, f.tbl, held.ID); !sameState(before, after) {
		t.Fatalf("a lost lease changed the row: %+v -> %+v", before, after)
	}
	if written(t, d, f.side, "lost") != 0 || f.published(t, pid) {
		t.Fatal("a lost lease committed the handler's writes")
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held after the rollback", n)
	}
	return held, before
}

// rollbackDiscards: Rollback discards the handler's writes; a second one is a no-op.
func (f *leaseTxFixture) rollbackDiscards(t *testing.T) {
	d := f.d
	ltx := f.begin(t)
	write(t, ltx.Tx(), f.side, "discarded")
	if err := ltx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ltx.Rollback(ctx); err != nil {
		t.Fatalf("a second rollback: %v", err)
	}
	if written(t, d, f.side, "discarded") != 0 {
		t.Fatal("a rollback committed the handler's write")
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held after the rollback", n)
	}
}

// failedStatementRollsBack: a failed statement rolls back and returns the error; the row
// (held, as before) keeps its lease.
func (f *leaseTxFixture) failedStatementRollsBack(t *testing.T, held dialects.Lease, before rowState) {
	d := f.d
	ltx := f.begin(t)
	write(t, ltx.Tx(), f.side, "failed")
	if _, err := ltx.SettleLease(ctx, dialects.Step{Kind: dialects.StepDeadLetter, Now: f.now}, held); err == nil {
		t.Fatal("a settlement breaking a constraint succeeded")
	}
	if after, _ := stateOf(t, d, f.tbl, held.ID); !sameState(before, after) {
		t.Fatalf("a failed settlement changed the row: %+v -> %+v", before, after)
	}
	if written(t, d, f.side, "failed") != 0 {
		t.Fatal("a failed settlement committed the handler's write")
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held after a failed settlement", n)
	}
	// The lease still holds: the settlement outside the transaction runs.
	if ok, err := f.q.SettleLease(ctx, dialects.Step{Kind: dialects.StepRelease}, held); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
}

// A delivery's transaction whose rollback fails (its backend died) closes the connection
// rather than pooling it.
func TestLeaseTransactionalRollbackFailure(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Transactional: true})
	ltx, err := q.(dialects.TxLeaseQueue).BeginDelivery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid := backendPID(t, ltx.Tx())
	mustExec(t, d, "SELECT pg_terminate_backend($1)", pid)
	waitGone(t, d, pid)
	total := d.Pool().Stat().TotalConns()
	if err := ltx.Rollback(ctx); err == nil {
		t.Fatal("a rollback on a dead connection reported success")
	}
	if s := d.Pool().Stat(); s.AcquiredConns() != 0 || s.TotalConns() != total-1 {
		t.Fatalf("after a failed rollback: %d acquired, %d total (was %d)", s.AcquiredConns(), s.TotalConns(), total)
	}
}

// takeTx claims the first candidate of a transactional advisory queue on a session of its
// own and begins its transaction, as the claimer does.
func takeTx(t *testing.T, q dialects.AdvisoryQueue) (dialects.TxSession, dialects.Row) {
	t.Helper()
	cands, err := q.Candidates(ctx, t0, 1)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates %v %v", cands, err)
	}
	s := dialecttest.NewSession(t, q)
	ts, ok := s.(dialects.TxSession)
	if !ok {
		t.Fatalf("a transactional session is a %T, not a TxSession", s)
	}
	if ts.Tx() != nil {
		t.Fatal("Tx() before Begin is not nil")
	}
	if !dialecttest.TryLock(t, s, cands[0].Key) {
		t.Fatal("lock refused")
	}
	r, ok, err := s.Take(ctx, cands[0].ID, t0)
	if err != nil || !ok {
		t.Fatalf("take: %v %v", ok, err)
	}
	if err := ts.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	if ts.Tx() == nil {
		t.Fatal("Tx() after Begin is nil")
	}
	return ts, r
}

func TestAdvisoryTransactional(t *testing.T) {
	d := newDialect(t)
	tbl := advisoryTable(tableName(t, d))
	createTable(t, d, tbl)
	side := sideTable(t, d)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	key := tbl.Name + "-'s"

	plain := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	ps := dialecttest.NewSession(t, plain)
	if _, isTx := ps.(dialects.TxSession); isTx {
		t.Error("a session outside transactional mode lends a transaction")
	}
	unlock(t, ps) // nothing held: just ends
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl, Transactional: true})

	// Anything but ack rolls back first, then settles in autocommit.
	s, r := takeTx(t, q)
	if r.ID != id {
		t.Fatalf("took %+v", r)
	}
	write(t, s.Tx(), side, "retried")
	if err := s.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Rollback(ctx); err != nil {
		t.Fatalf("a second rollback: %v", err)
	}
	at := t0.Add(-time.Second)
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepRetryAfter, Now: t0, At: at}, id); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx); err == nil {
		t.Error("a commit without an open transaction succeeded")
	}
	if unlock(t, s) {
		t.Fatal("a confirmed unlock closed the connection")
	}
	if written(t, d, side, "retried") != 0 {
		t.Fatal("a rollback committed the handler's write")
	}
	if st, _ := stateOf(t, d, tbl, id); st.Attempt != 2 || !sameTime(st.RetryAfter, at) {
		t.Fatalf("after the retry: %+v", st)
	}

	// Plain retry: nothing to write, the take counted.
	s, _ = takeTx(t, q)
	write(t, s.Tx(), side, "retried")
	if err := s.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepRetry, Now: t0}, id); err != nil {
		t.Fatal(err)
	}
	unlock(t, s)
	if written(t, d, side, "retried") != 0 {
		t.Fatal("a retry committed the handler's write")
	}
	if st, _ := stateOf(t, d, tbl, id); st.Attempt != 3 {
		t.Fatalf("after the retry: %+v", st)
	}

	// Ack settles inside the transaction and commits with the handler's writes.
	s, _ = takeTx(t, q)
	write(t, s.Tx(), side, "acked")
	now := t0.Add(time.Second)
	if err := s.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: now}, id); err != nil {
		t.Fatal(err)
	}
	if st, _ := stateOf(t, d, tbl, id); st.ProcessedAt != nil {
		t.Fatal("the settlement inside the transaction is visible before the commit")
	}
	if err := s.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := stateOf(t, d, tbl, id); !sameTime(st.ProcessedAt, now) {
		t.Fatalf("after the commit: %+v", st)
	}
	if written(t, d, side, "acked") != 1 {
		t.Fatal("the commit lost the handler's write")
	}
	if unlock(t, s) {
		t.Fatal("a confirmed unlock closed the connection")
	}
	if n := locksHeld(t, d, key); n != 0 {
		t.Fatalf("%d locks left", n)
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held", n)
	}
}

// Each form's lent transaction runs at the declared level.
func TestTransactionalIsolation(t *testing.T) {
	d := newDialect(t)
	rl := rowLockTable(tableName(t, d))
	createTable(t, d, rl)
	dialecttest.Publish(t, d, rl, dialects.Message{Payload: []byte("p")})
	adv := advisoryTable(tableName(t, d))
	createTable(t, d, adv)
	dialecttest.Publish(t, d, adv, dialects.Message{Payload: []byte("p")})
	ls := leaseTable(tableName(t, d))
	createTable(t, d, ls)

	for level, want := range levels {
		rl.Isolation, adv.Isolation, ls.Isolation = level, level, level

		tc := dialecttest.ClaimTx(t, dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: rl, Transactional: true}))
		if got := isolationOf(t, tc.Tx()); got != want {
			t.Errorf("row lock declared %q: the transaction runs at %q", level, got)
		}
		if err := tc.Rollback(ctx); err != nil {
			t.Fatal(err)
		}

		s, _ := takeTx(t, dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: adv, Transactional: true}))
		if got := isolationOf(t, s.Tx()); got != want {
			t.Errorf("advisory declared %q: the transaction runs at %q", level, got)
		}
		if err := s.Abort(ctx); err != nil {
			t.Fatal(err)
		}

		if level == dialects.RepeatableRead || level == dialects.Serializable {
			continue // refused for the lease form
		}
		lq := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: ls, Transactional: true})
		ltx, err := lq.(dialects.TxLeaseQueue).BeginDelivery(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := isolationOf(t, ltx.Tx()); got != want {
			t.Errorf("lease declared %q: the transaction runs at %q", level, got)
		}
		if err := ltx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := acquired(d); n != 0 {
		t.Fatalf("%d connections held", n)
	}

	// On a server whose default is serializable, plain BEGIN opens at it, and a declared
	// read committed overrides it. A transactional lease table declaring no level is then
	// refused: its snapshot would not see the renewer's extensions either.
	sd := openURL(t, withParams(testURL(), "pool_max_conns=4", "default_transaction_isolation=serializable"))
	rl.Isolation, adv.Isolation, ls.Isolation = "", "", ""
	tc := dialecttest.ClaimTx(t, dialecttest.OpenRowLock(t, sd, dialects.QueueSpec{Table: rl, Transactional: true}))
	if got := isolationOf(t, tc.Tx()); got != "serializable" {
		t.Errorf("row lock declaring nothing on a serializable server runs at %q", got)
	}
	tc.Rollback(ctx)
	s, _ := takeTx(t, dialecttest.OpenAdvisory(t, sd, dialects.QueueSpec{Table: adv, Transactional: true}))
	if got := isolationOf(t, s.Tx()); got != "serializable" {
		t.Errorf("advisory declaring nothing on a serializable server runs at %q", got)
	}
	s.Abort(ctx)
	if q, err := sd.Open(ctx, dialects.QueueSpec{Table: ls, Transactional: true}); err == nil {
		q.Close()
		t.Error("a transactional lease table opened on a serializable server")
	} else {
		ce := dialecttest.ConfigError(t, err)
		if ce.Option != "Table.Isolation" {
			t.Errorf("option %q", ce.Option)
		}
		dialecttest.Contains(t, err.Error(), "default_transaction_isolation")
	}
	ls.Isolation = dialects.ReadCommitted
	lq := dialecttest.OpenLease(t, sd, dialects.QueueSpec{Table: ls, Transactional: true})
	ltx, err := lq.(dialects.TxLeaseQueue).BeginDelivery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := isolationOf(t, ltx.Tx()); got != "read committed" {
		t.Errorf("lease declaring read committed on a serializable server runs at %q", got)
	}
	if err := ltx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := sd.Pool().Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections held", n)
	}
}

// WatchSession: after Unlock the session's backend is back in the pool, idle outside any
// transaction, as every idle pooled connection is; after Abort the pool has one connection
// less.
func (harness) WatchSession(t *testing.T, dd dialects.Dialect, s dialects.TxSession) func(bool) {
	t.Helper()
	d := dd.(*Dialect)
	pid := backendPID(t, s.Tx())
	total := d.Pool().Stat().TotalConns()
	return func(closed bool) {
		t.Helper()
		if closed {
			if st := d.Pool().Stat(); st.AcquiredConns() != 0 || st.TotalConns() != total-1 {
				t.Fatalf("after abort: %d acquired, %d total (was %d)", st.AcquiredConns(), st.TotalConns(), total)
			}
			return
		}
		if st := d.Pool().Stat(); st.AcquiredConns() != 0 || st.TotalConns() != total {
			t.Fatalf("after the unlock: %d acquired, %d total (was %d)", st.AcquiredConns(), st.TotalConns(), total)
		}
		conns := d.Pool().AcquireAllIdle(ctx)
		seen := false
		for _, c := range conns {
			var p int
			var xid *int64
			if err := c.QueryRow(ctx, "SELECT pg_backend_pid(), txid_current_if_assigned()").Scan(&p, &xid); err != nil {
				t.Fatal(err)
			}
			if xid != nil || c.Conn().PgConn().TxStatus() != 'I' {
				t.Errorf("pooled connection %d is inside a transaction", p)
			}
			seen = seen || p == pid
		}
		if !seen {
			t.Error("the session's connection is not in the pool")
		}
		// While it is held here, another connection sees its backend idle, not idle in
		// transaction.
		var state string
		if err := d.Pool().QueryRow(ctx, "SELECT state FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state); err != nil {
			t.Fatal(err)
		}
		if state != "idle" {
			t.Errorf("the pooled connection is %q", state)
		}
		for _, c := range conns {
			c.Release()
		}
	}
}

func (harness) IsTxEnded(err error) bool { return errors.Is(err, errTxEnded) }
