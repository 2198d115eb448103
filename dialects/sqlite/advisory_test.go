package sqlite

import (
	"path/filepath"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

func advisoryTable(name string) dialects.Table { return dialecttest.AdvisoryTableKeyed(name, "'s") }

func TestAdvisoryRegistrySharedByFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.db")
	d1, d2 := openFile(t, path), openFile(t, path)
	tbl := advisoryTable("jobs")
	createTable(t, d1, tbl)
	q1 := dialecttest.OpenAdvisory(t, d1, dialects.QueueSpec{Table: tbl})
	q2 := dialecttest.OpenAdvisory(t, d2, dialects.QueueSpec{Table: tbl})

	s1, s2 := dialecttest.NewSession(t, q1), dialecttest.NewSession(t, q2)
	if !dialecttest.TryLock(t, s1, "k") {
		t.Fatal("first lock refused")
	}
	if dialecttest.TryLock(t, s2, "k") {
		t.Fatal("a second Dialect on the same file locked a held key")
	}
	if !dialecttest.TryLock(t, s2, "other") {
		t.Fatal("a free key was refused")
	}
	if closed, err := s1.Unlock(ctx); closed || err != nil {
		t.Fatalf("unlock: %v %v", closed, err)
	}
	if _, err := s1.Unlock(ctx); err != nil {
		t.Fatal("a second unlock failed")
	}
	s3 := dialecttest.NewSession(t, q2)
	if !dialecttest.TryLock(t, s3, "k") {
		t.Fatal("an unlocked key stayed held")
	}
	if err := s3.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s3.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if !dialecttest.TryLock(t, dialecttest.NewSession(t, q1), "k") {
		t.Fatal("an aborted key stayed held")
	}

	// Another file has its own keys.
	q3 := dialecttest.OpenAdvisory(t, func() *Dialect { d := newDialect(t); createTable(t, d, tbl); return d }(), dialects.QueueSpec{Table: tbl})
	if !dialecttest.TryLock(t, dialecttest.NewSession(t, q3), "k") {
		t.Fatal("a key held on another file was refused")
	}
}
