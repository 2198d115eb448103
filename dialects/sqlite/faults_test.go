package sqlite

import (
	"database/sql"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// MakeFaults: a second handle on the file that finds the write lock taken, and does not
// wait (SQLite has no server to lose); a trigger's RAISE(ABORT), which SQLite reports as a
// constraint (SQLITE_CONSTRAINT_TRIGGER) and which is the database's refusal, not a row's
// data, beside a CHECK constraint that is.
func (h *harness) MakeFaults(t *testing.T, d dialects.Dialect, name string) []dialecttest.MadeFault {
	t.Helper()
	faults := refusals(t, d.(*Dialect), name)
	path, ok := h.files.Load(t)
	if !ok {
		t.Fatal("no database file for this test")
	}
	other, err := sql.Open("sqlite", "file:"+path.(string)+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	other.SetMaxOpenConns(1)
	holder, err := d.(*Dialect).DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer holder.ExecContext(ctx, "ROLLBACK")
	_, err = other.ExecContext(ctx, "INSERT INTO "+quote(name)+" (v) VALUES ('y')")
	return append(faults, dialecttest.MadeFault{What: "busy file", Err: err, Want: dialects.FaultContention})
}

// refusals are a trigger's refusal of an UPDATE of name's rows and a CHECK constraint's.
func refusals(t *testing.T, d *Dialect, name string) []dialecttest.MadeFault {
	t.Helper()
	for _, stmt := range []string{
		"CREATE TRIGGER " + quote(name+"_refuses") + " BEFORE UPDATE ON " + quote(name) + " WHEN NEW.v = 'refused' BEGIN SELECT RAISE(ABORT, 'closed'); END",
		"CREATE TABLE " + quote(name+"_checked") + " (n INTEGER CHECK (n > 0))",
	} {
		if _, err := d.DB().ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	_, trigger := d.DB().ExecContext(ctx, "UPDATE "+quote(name)+" SET v = 'refused'")
	_, check := d.DB().ExecContext(ctx, "INSERT INTO "+quote(name+"_checked")+" (n) VALUES (-1)")
	return []dialecttest.MadeFault{
		{What: "a trigger's RAISE(ABORT)", Err: trigger, Want: dialects.FaultUnknown},
		{What: "a CHECK constraint", Err: check, Want: dialects.FaultData},
	}
}
