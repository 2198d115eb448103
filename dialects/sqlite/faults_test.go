package sqlite

import (
	"database/sql"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// MakeFaults: a second handle on the file that finds the write lock taken, and does not
// wait. (SQLite has no server to lose.)
func (h *harness) MakeFaults(t *testing.T, d dialects.Dialect, name string) []dialecttest.MadeFault {
	t.Helper()
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
	return []dialecttest.MadeFault{{What: "busy file", Err: err, Want: dialects.FaultContention}}
}
