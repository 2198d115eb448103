package sqlite

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

func TestNewOnTheCallersPool(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.db")
	db, err := sql.Open("sqlite", dsn(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d := New(db)
	if d.DB() != db || d.Name() != "sqlite" || d.Limits() != (dialects.Limits{Connections: 0, ClaimsInFlight: 1}) {
		t.Fatal("accessors")
	}
	// Closing leaves the pool to the caller: TestConformance/admin/NewLeavesThePoolToTheCaller.
}

// OnCallerPool: New on a *sql.DB of the test's own, on this test's file.
func (h *harness) OnCallerPool(t *testing.T) (dialects.Dialect, func() error) {
	path, loaded := h.files.LoadOrStore(t, filepath.Join(t.TempDir(), "queue.db"))
	if !loaded {
		t.Cleanup(func() { h.files.Delete(t) })
	}
	db, err := sql.Open("sqlite", dsn(path.(string)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return New(db), func() error { return db.PingContext(ctx) }
}
