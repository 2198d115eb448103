package mysql

import (
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// The take counts the attempt and reads the row together, or neither: a read that fails
// spends no attempt (the row is not delivered, so nothing may count it).
func TestAdvisoryTakeFailedReadCountsNothing(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_takef", advisoryTable)
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	s, _ := dialecttest.LockFirst(t, q)
	// The read of the row now fails (its payload column is gone); counting the attempt
	// needs no payload.
	mustExec(t, d.DB(), "ALTER TABLE "+quote(tbl.Name)+" DROP COLUMN payload")
	if _, ok, err := s.Take(ctx, id, t0); ok || err == nil {
		t.Fatalf("take of a row that cannot be read: %v %v, want an error", ok, err)
	}
	if st, ok := stateOf(t, d, tbl, id); !ok || st.Attempt != 1 {
		t.Fatalf("row %+v (exists %v): a take whose read failed spent an attempt", st, ok)
	}
}

// The count after the read is fenced by the attempt read: a row counted (or taken,
// settled, delayed) between the two is not counted again, and the take reports it not
// taken. Run here statement by statement, as Take runs them.
func TestAdvisoryTakeCountIsFencedByTheRead(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_takec", advisoryTable)
	aq := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl}).(*advisoryQueue)
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	args := append(aq.cl.args([]any{id}, aq.group, t0), keyOf(t, d, tbl, id))
	// Another take counted the row after this one read attempt 1.
	mustExec(t, d.DB(), "UPDATE "+quote(tbl.Name)+" SET attempt = attempt + 1 WHERE id = ?", id)
	if n, err := affected(d.DB().ExecContext(ctx, aq.count, append(args, int64(1))...)); n != 0 || err != nil {
		t.Fatalf("a count fenced by a stale attempt changed %d rows (%v)", n, err)
	}
	if n, err := affected(d.DB().ExecContext(ctx, aq.count, append(args, int64(2))...)); n != 1 || err != nil {
		t.Fatalf("a count fenced by the current attempt changed %d rows (%v)", n, err)
	}
	if st, _ := stateOf(t, d, tbl, id); st.Attempt != 3 {
		t.Fatalf("attempt %d, want 3", st.Attempt)
	}
}

// keyOf is row id's key as the dialect renders it now.
func keyOf(t *testing.T, d *Dialect, tbl dialects.Table, id int64) string {
	t.Helper()
	expr, err := keyText(tbl.AdvisoryKey)
	if err != nil {
		t.Fatal(err)
	}
	var key string
	if err := d.DB().QueryRowContext(ctx, "SELECT "+expr+" FROM "+quote(tbl.Name)+" WHERE id = ?", id).Scan(&key); err != nil {
		t.Fatal(err)
	}
	return key
}
