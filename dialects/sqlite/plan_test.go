package sqlite

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	msqlite "modernc.org/sqlite"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// compiles counts SQLite's compilations of statements on the dialect's one connection:
// the authorizer is consulted each time a statement is prepared, or prepared again.
func compiles(t *testing.T, d *Dialect) *atomic.Int64 {
	t.Helper()
	d.db.SetMaxOpenConns(1)
	var n atomic.Int64
	conn, err := d.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		return dc.(msqlite.AuthorizerRegisterer).RegisterAuthorizer(
			func(msqlite.AuthorizerActionCode, string, string, string, string) msqlite.AuthorizerReturnCode {
				n.Add(1)
				return msqlite.AuthorizerOK
			})
	})
	if err != nil {
		t.Fatal(err)
	}
	return &n
}

// A claim's limit changes from one claim to the next: binding a new one must not make
// SQLite plan the claim again (limitParam), which cost a third of a claim's CPU.
func TestClaimsWithNewLimitsAreNotPlannedAgain(t *testing.T) {
	t.Run("lease", func(t *testing.T) {
		d := newDialect(t)
		tbl := leaseTable("jobs")
		createTable(t, d, tbl)
		mustExec(t, d, "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 200) "+
			"INSERT INTO jobs (payload, grp) SELECT x'78', 'g' FROM s")
		q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
		n := compiles(t, d)
		claim := func(limit int) {
			now := time.Now()
			rows, err := q.ClaimLeases(ctx, now, now.Add(time.Hour), limit)
			if err != nil || len(rows) != limit {
				t.Fatalf("claimed %d rows of %d: %v", len(rows), limit, err)
			}
		}
		claim(1) // prepared once more: registering the authorizer expired the statements
		before := n.Load()
		for limit := 2; limit <= 9; limit++ {
			claim(limit)
		}
		if got := n.Load() - before; got != 0 {
			t.Fatalf("8 claims with new limits compiled statements %d times; want 0", got)
		}
	})
	t.Run("advisory", func(t *testing.T) {
		d := newDialect(t)
		tbl := advisoryTable("jobs")
		createTable(t, d, tbl)
		for i := 0; i < 50; i++ {
			mustExec(t, d, "INSERT INTO jobs (payload) VALUES (x'78')")
		}
		q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl})
		n := compiles(t, d)
		candidates := func(limit int) {
			got, err := q.Candidates(context.Background(), time.Now(), limit)
			if err != nil || len(got) != limit {
				t.Fatalf("read %d candidates of %d: %v", len(got), limit, err)
			}
		}
		candidates(1)
		before := n.Load()
		for limit := 2; limit <= 9; limit++ {
			candidates(limit)
		}
		if got := n.Load() - before; got != 0 {
			t.Fatalf("8 candidate reads with new limits compiled statements %d times; want 0", got)
		}
	})
}
