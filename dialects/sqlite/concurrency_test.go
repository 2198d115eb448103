package sqlite

import (
	"database/sql"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// Claimers on two Dialects over one file take every row exactly once.
func TestConcurrentClaims(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.db")
	d1, d2 := openFile(t, path), openFile(t, path)
	tbl := leaseTable("jobs")
	createTable(t, d1, tbl)
	const rows = 400
	mustExec(t, d1, "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?) INSERT INTO jobs (payload) SELECT 'p' FROM s", rows)
	queues := []dialects.LeaseQueue{
		dialecttest.OpenLease(t, d1, dialects.QueueSpec{Table: tbl}),
		dialecttest.OpenLease(t, d2, dialects.QueueSpec{Table: tbl}),
	}

	var (
		mu   sync.Mutex
		seen = map[int64]int{}
		wg   sync.WaitGroup
	)
	for w := range 8 {
		q := queues[w%2]
		wg.Go(func() {
			for {
				got, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 7)
				if err != nil {
					t.Error(err)
					return
				}
				if len(got) == 0 {
					return
				}
				for _, r := range got {
					if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck}, dialects.Lease{ID: r.ID, Token: r.Token}); !ok || err != nil {
						t.Errorf("ack %d: %v %v", r.ID, ok, err)
					}
				}
				mu.Lock()
				for _, r := range got {
					seen[r.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != rows {
		t.Errorf("claimed %d distinct rows of %d", len(seen), rows)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("row %d claimed %d times", id, n)
		}
	}
}

// A writer outside this process's turn (another process, or a pool not wrapped by the
// dialect) holds the write lock for a while: the claim waits in the busy handler instead
// of failing.
func TestClaimWaitsForForeignWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.db")
	d := openFile(t, path)
	tbl := leaseTable("jobs")
	createTable(t, d, tbl)
	dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl})

	other, err := sql.Open("sqlite", dsn(path))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		conn.ExecContext(ctx, "COMMIT")
	}()
	start := time.Now()
	got, err := q.ClaimLeases(ctx, t0, t0.Add(time.Minute), 1)
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %v %v", got, err)
	}
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Errorf("the claim did not wait for the foreign writer (%v)", waited)
	}
}

func TestClaimUsesIndex(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
	tbl.ProcessedAt = "processed_at"
	createTable(t, d, tbl)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl}).(*leaseQueue)
	rows, err := d.DB().QueryContext(ctx, "EXPLAIN QUERY PLAN "+q.claim,
		sql.Named("until", "x"), sql.Named("now", "x"), sql.Named("group", "g"), sql.Named("limit", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan += detail + "\n"
	}
	if !strings.Contains(plan, "USING INDEX jobs_claim") {
		t.Errorf("the claim does not use the claim index:\n%s", plan)
	}
}
