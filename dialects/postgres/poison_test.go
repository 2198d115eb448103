package postgres

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
	mustExec(t, d, "ALTER TABLE "+quote(tbl.Name)+" ALTER COLUMN "+quote(tbl.Attempt)+" TYPE "+typ)
}

func setAttempt(t *testing.T, d *Dialect, tbl dialects.Table, id int64, attempt int64) {
	t.Helper()
	mustExec(t, d, "UPDATE "+quote(tbl.Name)+" SET "+quote(tbl.Attempt)+" = $1 WHERE "+quote(tbl.ID)+" = $2", attempt, id)
}

func attemptOf(t *testing.T, d *Dialect, tbl dialects.Table, id int64) int64 {
	t.Helper()
	var n int64
	if err := d.Pool().QueryRow(ctx, "SELECT "+quote(tbl.Attempt)+" FROM "+quote(tbl.Name)+" WHERE "+quote(tbl.ID)+" = $1", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// attemptTypes are the attempt column types an existing table may have, with their maxima.
var attemptTypes = []struct {
	typ string
	max int64
}{{"smallint", 32767}, {"integer", 2147483647}, {"bigint", 9223372036854775807}}

// The lease claim counts every row it takes in one statement: a row at the maximum stays
// there, and the rows beside it are claimed and counted.
func TestPoisonLeaseClaimSaturates(t *testing.T) {
	for _, at := range attemptTypes {
		t.Run(at.typ, func(t *testing.T) {
			d := newDialect(t)
			tbl := leaseTable(tableName(t, d))
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
	tbl := leaseTable(tableName(t, d))
	tbl.FIFO = true
	createTable(t, d, tbl)
	narrowAttempt(t, d, tbl, "smallint")
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
	tbl := dialects.Table{Name: tableName(t, d), ID: "id", Payload: "payload", Attempt: "attempt", RetryAfter: "retry_after"}
	tbl.AdvisoryKey = tbl.Name + "-{id}"
	createTable(t, d, tbl)
	narrowAttempt(t, d, tbl, "smallint")
	id := publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	setAttempt(t, d, tbl, id, 32767)
	q := openAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	s := newSession(t, q)
	defer s.Abort(ctx)
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
			tbl := rowLockTable(tableName(t, d))
			tbl.FIFO = fifo
			createTable(t, d, tbl)
			narrowAttempt(t, d, tbl, "smallint")
			id := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("p")})
			setAttempt(t, d, tbl, id, 32767)
			q := openRowLock(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
			for _, step := range []dialects.Step{{Kind: dialects.StepRetry, Now: t0}, {Kind: dialects.StepRetryAfter, Now: t0, At: t0}} {
				c, ok := claimLocked(t, q, t0)
				if !ok {
					t.Fatal("nothing claimed")
				}
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
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	narrowAttempt(t, d, tbl, "smallint")
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
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	mustExec(t, d, "CREATE DOMAIN "+quote(tbl.Name+"_n")+" AS smallint")
	t.Cleanup(func() { mustExec(t, d, "DROP DOMAIN IF EXISTS "+quote(tbl.Name+"_n")+" CASCADE") })
	for typ, want := range map[string]string{"integer": "2147483647", quote(tbl.Name + "_n"): "32767", "bigint": "9223372036854775807"} {
		narrowAttempt(t, d, tbl, typ)
		q := openQueue(t, d, dialects.QueueSpec{Table: tbl, Group: "g"}).(*leaseQueue)
		contains(t, q.claim.text, `CASE WHEN u."attempt" < `+want+` THEN u."attempt" + 1 ELSE u."attempt" END`)
	}
}

// A value a statement cannot take (SQLSTATE class 22) or a constraint refuses (class 23)
// is one row's data: FaultData.
func TestClassifyDataFaults(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d)
	mustExec(t, d, "CREATE TABLE "+quote(name)+" (id bigint PRIMARY KEY, attempt smallint NOT NULL CHECK (attempt < 100))")
	mustExec(t, d, "INSERT INTO "+quote(name)+" VALUES (1, 1)")
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
	_, err := d.Pool().Exec(ctx, "UPDATE "+quote(name)+" SET attempt = attempt + 40000")
	check("smallint out of range", err)
	_, err = d.Pool().Exec(ctx, "SELECT 1e400::numeric(10,2)")
	check("numeric out of range", err)
	_, err = d.Pool().Exec(ctx, "UPDATE "+quote(name)+" SET attempt = 200")
	check("check constraint", err)
	_, err = d.Pool().Exec(ctx, "INSERT INTO "+quote(name)+" VALUES (1, 1)")
	check("unique violation", err)
	check("unreadable row", &dialects.RowDataError{Table: name, ID: 1, Err: errors.New("cannot scan")})
}

// scanValues goes on after a value that does not scan, where pgx's Scan would end the
// result: the lease claim then returns the rows after it too.
func TestPoisonScanValuesKeepsTheResult(t *testing.T) {
	d := newDialect(t)
	q := &queue{d: d, name: "jobs", hasAttempt: true}
	rows, err := d.Pool().Query(ctx, "SELECT id, convert_to('p' || id, 'UTF8'), CASE WHEN id = 2 THEN NULL ELSE 1 END FROM generate_series(1, 3) AS id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []dialects.Row
	for rows.Next() {
		var id, attempt int64 // attempt not nullable: row 2's NULL does not scan
		r := dialects.Row{}
		if err := scanValues(rows, &id, &r.Payload, &attempt); err != nil {
			r, err = q.unreadable(rows, err)
			if err != nil {
				t.Fatal(err)
			}
		} else {
			r.ID = id
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[1].ID != 2 || got[1].Fault == nil || got[0].Fault != nil || got[2].Fault != nil || string(got[2].Payload) != "p3" {
		t.Fatalf("rows %+v", got)
	}
	if !errors.Is(got[1].Fault, dialects.ErrRowData) {
		t.Fatalf("fault %v", got[1].Fault)
	}
}

// A row lock queue's claims pass over the rows set aside in memory: single claims, batch
// claims, and a FIFO group's head (which then holds its group).
func TestPoisonRowLockSkip(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d))
	createTable(t, d, tbl)
	bad := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("bad")})
	good := publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("good")})
	q := openQueue(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	q.(dialects.SkipQueue).Skip(bad)
	c, ok := claimLocked(t, q.(dialects.RowLockQueue), t0)
	if !ok || c.Row().ID != good {
		t.Fatalf("claimed %v, %v; want row %d", ok, c, good)
	}
	c.Rollback(ctx)
	b, ok, err := q.(dialects.RowLockBatchQueue).ClaimLockedBatch(ctx, t0, 10)
	if err != nil || !ok || len(b.Rows()) != 1 || b.Rows()[0].ID != good {
		t.Fatalf("batch %v, %v", ok, err)
	}
	b.Rollback(ctx)

	ft := rowLockTable(tableName(t, d))
	ft.FIFO = true
	createTable(t, d, ft)
	head := publish(t, d, ft, dialects.Message{Group: "g", Payload: []byte("head")})
	publish(t, d, ft, dialects.Message{Group: "g", Payload: []byte("next")})
	fq := openQueue(t, d, dialects.QueueSpec{Table: ft, Group: "g"})
	fq.(dialects.SkipQueue).Skip(head)
	if c, ok := claimLocked(t, fq.(dialects.RowLockQueue), t0); ok {
		c.Rollback(ctx)
		t.Fatalf("a FIFO claim took row %d past the head set aside", c.Row().ID)
	}
}
