package sqlite

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// Poison rows: SQLite's integers are 64-bit, and rowactor caps the attempt counter at
// 2147483647 (what a 32-bit column holds on the other databases); a row whose data fails
// to scan is returned flagged, and the rows claimed beside it are delivered.

const attemptCap = 2147483647

func setAttempt(t *testing.T, d *Dialect, table string, id int64, attempt any) {
	t.Helper()
	mustExec(t, d, "UPDATE `"+table+"` SET attempt = ? WHERE id = ?", attempt, id)
}

// A row whose attempt column holds a REAL (SQLite keeps what it is given) cannot be read
// as an integer. The lease claim returns it flagged with its token, and the rows beside it
// (leased by the same statement) are returned, not left leased and undelivered.
func TestPoisonLeaseClaimReturnsRowsBesideAnUnreadableOne(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
	createTable(t, d, tbl)
	before := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("before")})
	bad := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("bad")})
	after := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("after")})
	setAttempt(t, d, tbl.Name, bad, 2.5)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(30*time.Second), 10)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if len(rows) != 3 || rows[0].ID != before || rows[1].ID != bad || rows[2].ID != after {
		t.Fatalf("claimed %+v, want rows %d, %d, %d", rows, before, bad, after)
	}
	checkUnreadable(t, rows[1])
	for _, r := range []dialects.Row{rows[0], rows[2]} {
		checkReadable(t, r)
	}
	for _, r := range rows {
		if !r.Token.Equal(t0.Add(30 * time.Second)) {
			t.Fatalf("row %d without its token: %+v", r.ID, r)
		}
		// Every row holds its lease: the runtime settles each of them by its token.
		ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepRelease, Now: t0}, dialects.Lease{ID: r.ID, Token: r.Token})
		if err != nil || !ok {
			t.Fatalf("release row %d: %v, %v", r.ID, ok, err)
		}
	}
}

func TestPoisonAdvisoryTakeReturnsAnUnreadableRow(t *testing.T) {
	d := newDialect(t)
	tbl := dialects.Table{Name: "jobs", ID: "id", Payload: "payload", Attempt: "attempt", AdvisoryKey: "jobs-{id}"}
	createTable(t, d, tbl)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	setAttempt(t, d, tbl.Name, id, 2.5)
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	s, _ := q.Session(ctx)
	defer s.Abort(ctx)
	if ok, err := s.TryLock(ctx, fmt.Sprintf("jobs-%d", id)); !ok || err != nil {
		t.Fatalf("lock: %v, %v", ok, err)
	}
	r, ok, err := s.Take(ctx, id, t0)
	if err != nil || !ok {
		t.Fatalf("take: %v, %v", ok, err)
	}
	checkUnreadable(t, r)
	if r.ID != id {
		t.Fatalf("took row %d, want %d", r.ID, id)
	}
}

func checkUnreadable(t *testing.T, r dialects.Row) {
	t.Helper()
	var de *dialects.RowDataError
	if !errors.As(r.Fault, &de) || !errors.Is(r.Fault, dialects.ErrRowData) || de.ID != r.ID || de.Table != "jobs" {
		t.Fatalf("row %d: Fault = %v, want a *RowDataError naming it", r.ID, r.Fault)
	}
}

func checkReadable(t *testing.T, r dialects.Row) {
	t.Helper()
	if r.Fault != nil || len(r.Payload) == 0 || r.Attempt != 1 {
		t.Fatalf("readable row %+v", r)
	}
}

// Data faults: a value a constraint or a STRICT column refuses, and a row that cannot be
// read, are FaultData, bare and wrapped as the runtime wraps them.
func TestClassifyDataFaults(t *testing.T) {
	d := newDialect(t)
	mustExec(t, d, "CREATE TABLE strict_jobs (id INTEGER PRIMARY KEY, attempt INTEGER NOT NULL CHECK (attempt < 100)) STRICT")
	check := func(what string, err error) { t.Helper(); dialecttest.DataFault(t, d, what, err) }
	_, err := d.DB().ExecContext(ctx, "INSERT INTO strict_jobs (attempt) VALUES ('many')")
	check("mismatch", err)
	_, err = d.DB().ExecContext(ctx, "INSERT INTO strict_jobs (attempt) VALUES (100)")
	check("check constraint", err)
	_, err = d.DB().ExecContext(ctx, "INSERT INTO strict_jobs (attempt) VALUES (NULL)")
	check("not null", err)
	check("unreadable row", &dialects.RowDataError{Table: "jobs", ID: 1, Err: errors.New("converting")})
	if got := dialects.FaultData.String(); got != "data" {
		t.Errorf("FaultData is %q", got)
	}
}
