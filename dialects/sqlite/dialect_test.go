package sqlite

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

func TestNewLeavesThePoolToTheCaller(t *testing.T) {
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
	tbl := leaseTable("jobs")
	createTable(t, d, tbl)
	if _, err := d.Open(ctx, dialects.QueueSpec{Table: tbl}); err != nil {
		t.Fatal(err)
	}
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("Close closed the caller's pool: %v", err)
	}
	// The dialect's statements are gone with it.
	if _, err := p.Publish(ctx, nil, dialects.Message{Payload: []byte("x")}); err == nil {
		t.Error("a closed dialect published")
	}
	if _, err := d.Open(ctx, dialects.QueueSpec{Table: tbl}); err == nil {
		t.Error("a closed dialect opened a queue")
	}
}
