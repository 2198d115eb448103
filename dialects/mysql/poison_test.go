package mysql

import (
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
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

// The statements that count attempts are built once, at Open, with the column type's
// maximum read from the catalog.
func TestPoisonAttemptMaxFromTheCatalog(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d, "rapoison"))
	createTable(t, d, tbl)
	for typ, want := range map[string]string{"INT": "2147483647", "SMALLINT UNSIGNED": "65535", "BIGINT UNSIGNED": "9223372036854775807", "DECIMAL(12,0)": "2147483647"} {
		narrowAttempt(t, d, tbl, typ)
		q := dialecttest.OpenQueue(t, d, dialects.QueueSpec{Table: tbl, Group: "g"}).(*leaseQueue)
		dialecttest.Contains(t, q.stamp.text(0), "CASE WHEN `attempt` < "+want+" THEN `attempt` + 1 ELSE `attempt` END")
	}
}

// Values a statement cannot take, or a constraint refuses, are one row's data: FaultData.
func TestClassifyDataFaults(t *testing.T) {
	d := newDialect(t)
	db := d.DB()
	name := tableName(t, d, "rapoison")
	mustExec(t, db, "CREATE TABLE "+quote(name)+" (id BIGINT PRIMARY KEY, attempt SMALLINT NOT NULL, note VARCHAR(3)) ENGINE=InnoDB")
	mustExec(t, db, "INSERT INTO "+quote(name)+" VALUES (1, 32767, 'a')")
	check := func(what string, err error) { t.Helper(); dialecttest.DataFault(t, d, what, err) }
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

// A row whose values do not scan (here an unsigned attempt beyond what an int64 holds) is
// returned flagged, leased with the rows beside it, which are returned too.
func TestPoisonClaimsReturnRowsBesideAnUnreadableOne(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d, "rapoison"))
	createTable(t, d, tbl)
	narrowAttempt(t, d, tbl, "BIGINT UNSIGNED")
	before := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("before")})
	bad := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("bad")})
	after := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("after")})
	// Beyond what rowactor counts to (int64), and beyond what an int64 reads.
	setAttempt(t, d, tbl, bad, 0)
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET attempt = 18446744073709551615 WHERE id = ?", bad)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
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
