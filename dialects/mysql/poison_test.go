package mysql

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// Poison rows: an attempt counter at its column type's maximum must neither overflow nor
// fail the statement that counts it (which, in a claim, would stop the whole queue).

// narrowAttempt gives an existing table's attempt column another integer type, as a table
// created before rowactor rendered integer attempts has.
func narrowAttempt(t *testing.T, d *Dialect, tbl dialects.Table, typ string) {
	t.Helper()
	mustExec(t, d.DB(), "ALTER TABLE "+quote(tbl.Name)+" MODIFY "+quote(tbl.Attempt)+" "+typ+" NOT NULL DEFAULT 1")
}

func setAttempt(t *testing.T, d *Dialect, tbl dialects.Table, id int64, attempt int64) {
	t.Helper()
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET "+quote(tbl.Attempt)+" = ? WHERE "+quote(tbl.ID)+" = ?", attempt, id)
}

func attemptOf(t *testing.T, d *Dialect, tbl dialects.Table, id int64) int64 {
	t.Helper()
	var n int64
	if err := d.DB().QueryRowContext(ctx, "SELECT "+quote(tbl.Attempt)+" FROM "+quote(tbl.Name)+" WHERE "+quote(tbl.ID)+" = ?", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// attemptTypes are the attempt column types an existing table may have, with their maxima.
var attemptTypes = []struct {
	typ string
	max int64
}{{"SMALLINT", 32767}, {"TINYINT UNSIGNED", 255}, {"INT", 2147483647}, {"MEDIUMINT", 8388607}, {"BIGINT", 9223372036854775807}}

// The lease claim counts every row it takes in one statement: a row at the maximum stays
// there, and the rows beside it are claimed and counted.
func TestPoisonLeaseClaimSaturates(t *testing.T) {
	for _, at := range attemptTypes {
		t.Run(at.typ, func(t *testing.T) {
			d := newDialect(t)
			tbl := leaseTable(tableName(t, d, "rapoison"))
			createTable(t, d, tbl)
			narrowAttempt(t, d, tbl, at.typ)
			full := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("full")})
			near := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("near")})
			fresh := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("fresh")})
			setAttempt(t, d, tbl, full, at.max)
			setAttempt(t, d, tbl, near, at.max-1)
			q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
			rows, err := q.ClaimLeases(ctx, t0, t0.Add(30*time.Second), 10)
			if err != nil {
				t.Fatalf("claim: %v", err)
			}
			if len(rows) != 3 {
				t.Fatalf("claimed %v, want 3 rows", ids(rows))
			}
			for id, want := range map[int64]int64{full: at.max, near: at.max, fresh: 2} {
				if got := attemptOf(t, d, tbl, id); got != want {
					t.Errorf("row %d: attempt %d, want %d", id, got, want)
				}
			}
		})
	}
}

func TestPoisonFIFOLeaseClaimSaturates(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d, "rapoison"))
	tbl.FIFO = true
	createTable(t, d, tbl)
	narrowAttempt(t, d, tbl, "SMALLINT")
	id := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("head")})
	setAttempt(t, d, tbl, id, 32767)
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(30*time.Second), 1)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if len(rows) != 1 || attemptOf(t, d, tbl, id) != 32767 {
		t.Fatalf("claimed %v; attempt %d", ids(rows), attemptOf(t, d, tbl, id))
	}
}

func TestPoisonAdvisoryTakeSaturates(t *testing.T) {
	d := newDialect(t)
	tbl := dialects.Table{Name: tableName(t, d, "rapoison"), ID: "id", Payload: "payload", Attempt: "attempt", RetryAfter: "retry_after"}
	tbl.AdvisoryKey = tbl.Name + "-{id}"
	createTable(t, d, tbl)
	narrowAttempt(t, d, tbl, "SMALLINT")
	id := publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	setAttempt(t, d, tbl, id, 32767)
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	s := newSession(t, q)
	if !tryLock(t, s, fmt.Sprintf("%s-%d", tbl.Name, id)) {
		t.Fatal("key not locked")
	}
	_, ok, err := s.Take(ctx, id, t0)
	if err != nil || !ok {
		t.Fatalf("take: %v, %v", ok, err)
	}
	if got := attemptOf(t, d, tbl, id); got != 32767 {
		t.Fatalf("attempt %d, want 32767", got)
	}
}

// The row lock form counts the attempt when a retry returns the row: Retry and RetryAfter
// settle a row at the maximum (alone, in a batch, in a FIFO group), and leave it there.
func TestPoisonRowLockRetrySaturates(t *testing.T) {
	for _, fifo := range []bool{false, true} {
		t.Run(fmt.Sprintf("fifo=%v", fifo), func(t *testing.T) {
			d := newDialect(t)
			tbl := rowLockTable(tableName(t, d, "rapoison"))
			tbl.FIFO = fifo
			createTable(t, d, tbl)
			narrowAttempt(t, d, tbl, "SMALLINT")
			id := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
			setAttempt(t, d, tbl, id, 32767)
			q := openRowLock(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
			for _, step := range []dialects.Step{{Kind: dialects.StepRetry, Now: t0}, {Kind: dialects.StepRetryAfter, Now: t0, At: t0}} {
				c := claimLocked(t, q)
				if err := c.Settle(ctx, step); err != nil {
					t.Fatalf("%v: %v", step.Kind, err)
				}
				if got := attemptOf(t, d, tbl, id); got != 32767 {
					t.Fatalf("after %v: attempt %d, want 32767", step.Kind, got)
				}
			}
		})
	}
}

func TestPoisonRowLockBatchRetrySaturates(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d, "rapoison"))
	createTable(t, d, tbl)
	narrowAttempt(t, d, tbl, "SMALLINT")
	full := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("full")})
	fresh := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("fresh")})
	setAttempt(t, d, tbl, full, 32767)
	q := openQueue(t, d, dialects.QueueSpec{Table: tbl, Group: "g"}).(dialects.RowLockBatchQueue)
	b, ok, err := q.ClaimLockedBatch(ctx, t0, 10)
	if err != nil || !ok || len(b.Rows()) != 2 {
		t.Fatalf("claim batch: %v, %v", ok, err)
	}
	if err := b.Settle(ctx, []dialects.Step{{Kind: dialects.StepRetry, Now: t0}, {Kind: dialects.StepRetry, Now: t0}}); err != nil {
		t.Fatalf("settle: %v", err)
	}
	if a, b := attemptOf(t, d, tbl, full), attemptOf(t, d, tbl, fresh); a != 32767 || b != 2 {
		t.Fatalf("attempts %d, %d; want 32767, 2", a, b)
	}
}

// The statements that count attempts are built once, at Open, with the column type's
// maximum read from the catalog.
func TestPoisonAttemptMaxFromTheCatalog(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d, "rapoison"))
	createTable(t, d, tbl)
	for typ, want := range map[string]string{"INT": "2147483647", "SMALLINT UNSIGNED": "65535", "BIGINT UNSIGNED": "9223372036854775807", "DECIMAL(12,0)": "2147483647"} {
		narrowAttempt(t, d, tbl, typ)
		q := openQueue(t, d, dialects.QueueSpec{Table: tbl, Group: "g"}).(*leaseQueue)
		contains(t, q.stamp.text(0), "CASE WHEN `attempt` < "+want+" THEN `attempt` + 1 ELSE `attempt` END")
	}
}

// Values a statement cannot take, or a constraint refuses, are one row's data: FaultData.
func TestClassifyDataFaults(t *testing.T) {
	d := newDialect(t)
	db := d.DB()
	name := tableName(t, d, "rapoison")
	mustExec(t, db, "CREATE TABLE "+quote(name)+" (id BIGINT PRIMARY KEY, attempt SMALLINT NOT NULL, note VARCHAR(3)) ENGINE=InnoDB")
	mustExec(t, db, "INSERT INTO "+quote(name)+" VALUES (1, 32767, 'a')")
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		for _, e := range []error{err, fmt.Errorf("settle retry of row 1: %w", err)} {
			if got := dialects.Classify(d, e); got != dialects.FaultData {
				t.Errorf("%s: Classify(%v) = %v, want %v", what, e, got, dialects.FaultData)
			}
		}
	}
	_, err := db.ExecContext(ctx, "UPDATE "+quote(name)+" SET attempt = attempt + 1")
	check("out of range (1264)", err)
	_, err = db.ExecContext(ctx, "SELECT CAST(18446744073709551615 AS UNSIGNED) + 1")
	check("expression out of range (1690)", err)
	_, err = db.ExecContext(ctx, "UPDATE "+quote(name)+" SET attempt = 'many'")
	check("incorrect integer value (1366)", err)
	_, err = db.ExecContext(ctx, "UPDATE "+quote(name)+" SET note = 'long'")
	check("data too long (1406)", err)
	_, err = db.ExecContext(ctx, "UPDATE "+quote(name)+" SET attempt = NULL")
	check("not null (1048)", err)
	_, err = db.ExecContext(ctx, "INSERT INTO "+quote(name)+" VALUES (1, 1, 'b')")
	check("duplicate key (1062)", err)
	check("unreadable row", &dialects.RowDataError{Table: name, ID: 1, Err: errors.New("cannot scan")})
}

// A row lock queue's claims pass over the rows set aside in memory: single claims, batch
// claims, and a FIFO group's head (which then holds its group).
func TestPoisonRowLockSkip(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "rapoison", rowLockTable)
	bad := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("bad")})
	good := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("good")})
	q := openQueue(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	q.(dialects.SkipQueue).Skip(bad)
	c := claimLocked(t, q.(dialects.RowLockQueue))
	if c.Row().ID != good {
		t.Fatalf("claimed row %d, want %d", c.Row().ID, good)
	}
	c.Rollback(ctx)
	b, ok, err := q.(dialects.RowLockBatchQueue).ClaimLockedBatch(ctx, t0, 10)
	if err != nil || !ok || len(b.Rows()) != 1 || b.Rows()[0].ID != good {
		t.Fatalf("batch %v, %v", ok, err)
	}
	b.Rollback(ctx)

	ft := newTable(t, d, "rapoison", func(name string) dialects.Table {
		tb := rowLockTable(name)
		tb.FIFO = true
		return tb
	})
	head := publish(t, d, ft, dialects.Message{Group: "g", Payload: []byte("head")})
	publish(t, d, ft, dialects.Message{Group: "g", Payload: []byte("next")})
	fq := openQueue(t, d, dialects.QueueSpec{Table: ft, Group: "g"})
	fq.(dialects.SkipQueue).Skip(head)
	if c, ok, err := fq.(dialects.RowLockQueue).ClaimLocked(ctx, t0); err != nil || ok {
		if ok {
			c.Rollback(ctx)
		}
		t.Fatalf("a FIFO claim past the head set aside: %v, %v", ok, err)
	}
}

// A row whose values do not scan (here an unsigned attempt beyond what an int64 holds) is
// returned flagged, leased with the rows beside it, which are returned too.
func TestPoisonClaimsReturnRowsBesideAnUnreadableOne(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d, "rapoison"))
	createTable(t, d, tbl)
	narrowAttempt(t, d, tbl, "BIGINT UNSIGNED")
	before := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("before")})
	bad := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("bad")})
	after := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("after")})
	// Beyond what rowactor counts to (int64), and beyond what an int64 reads.
	setAttempt(t, d, tbl, bad, 0)
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET attempt = 18446744073709551615 WHERE id = ?", bad)
	q := openLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(30*time.Second), 10)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if len(rows) != 3 || rows[0].ID != before || rows[1].ID != bad || rows[2].ID != after {
		t.Fatalf("claimed %+v", rows)
	}
	if rows[1].Fault == nil || !errors.Is(rows[1].Fault, dialects.ErrRowData) || rows[0].Fault != nil || rows[2].Fault != nil {
		t.Fatalf("faults %v, %v, %v", rows[0].Fault, rows[1].Fault, rows[2].Fault)
	}
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(tbl.Name)+" WHERE locked_until = ?", dbTime(t0.Add(30*time.Second))); n != 3 {
		t.Fatalf("%d rows hold the claim's lease, want 3", n)
	}
}
