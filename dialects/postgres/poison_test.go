package postgres

import (
	"errors"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// Poison rows: an attempt counter at its column type's maximum must neither overflow nor
// fail the statement that counts it (which, in a claim, would stop the whole queue).

// narrowAttempt gives an existing table's attempt column another integer type, as a table
// created before rowactor rendered integer attempts has.
func narrowAttempt(t *testing.T, d *Dialect, tbl dialects.Table, typ string) {
	t.Helper()
	mustExec(t, d, "ALTER TABLE "+quote(tbl.Name)+" ALTER COLUMN "+quote(tbl.Attempt)+" TYPE "+typ)
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
		q := dialecttest.OpenQueue(t, d, dialects.QueueSpec{Table: tbl, Group: "g"}).(*leaseQueue)
		dialecttest.Contains(t, q.claim.text, `CASE WHEN u."attempt" < `+want+` THEN u."attempt" + 1 ELSE u."attempt" END`)
	}
}

// A value a statement cannot take (SQLSTATE class 22) or a constraint refuses (class 23)
// is one row's data: FaultData.
func TestClassifyDataFaults(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d)
	mustExec(t, d, "CREATE TABLE "+quote(name)+" (id bigint PRIMARY KEY, attempt smallint NOT NULL CHECK (attempt < 100))")
	mustExec(t, d, "INSERT INTO "+quote(name)+" VALUES (1, 1)")
	check := func(what string, err error) { t.Helper(); dialecttest.DataFault(t, d, what, err) }
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
