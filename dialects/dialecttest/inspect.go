package dialecttest

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// inspectScenarios are Inspect's (dialects.Inspector): one row and where it stands.
var inspectScenarios = []scenario{
	{name: "EveryState", run: testInspectEveryState},
	{name: "RowLockCannotTellInWork", run: testInspectRowLock, applies: func(h Harness) bool { return h.Caps().RowLock }},
	{name: "Refusals", run: testInspectRefusals},
}

func inspector(t *testing.T, d dialects.Dialect) dialects.Inspector {
	t.Helper()
	in, ok := d.(dialects.Inspector)
	if !ok {
		t.Fatalf("%T is not a dialects.Inspector", d)
	}
	return in
}

// Each row reads as it stands, every described column included, in the state Stats would
// count it in.
func testInspectEveryState(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_insp", func(name string) dialects.Table {
		tb := leaseTable(name)
		tb.ProcessedAt, tb.Error = "processed_at", "error"
		return tb
	})
	due := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("due"), Headers: []byte(`{"k":"v"}`)})
	later := t0.Add(time.Hour)
	delayed := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("delayed"), NotBefore: later})
	inWork := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("in work")})
	processed := e.publish(tbl, dialects.Message{Group: "other", Payload: []byte("processed")})
	q := e.openLease(dialects.QueueSpec{Table: tbl, Group: "g"})
	e.exec("UPDATE "+e.q(tbl.Name)+" SET retry_after = ? WHERE id IN (?, ?)", h.TimeArg(later), delayed, due)
	e.exec("UPDATE "+e.q(tbl.Name)+" SET retry_after = NULL WHERE id = ?", due)
	// The claim takes the due rows of g in id order: due first, then in work (each one
	// attempt on: a row is published at attempt 1); due is released again with its error
	// kept, as a failed delivery leaves it.
	token := t0.Add(30 * time.Second)
	if rows, err := q.ClaimLeases(ctx, t0, token, 2); err != nil || len(rows) != 2 {
		t.Fatalf("claim: %v %v", ids(rows), err)
	}
	e.exec("UPDATE "+e.q(tbl.Name)+" SET locked_until = NULL, error = ? WHERE id = ?", "boom: the first try failed", due)
	e.exec("UPDATE "+e.q(tbl.Name)+" SET processed_at = ? WHERE id = ?", h.TimeArg(t0.Add(-time.Minute)), processed)

	in := inspector(t, e.d)
	read := func(id int64) dialects.Job {
		t.Helper()
		j, err := in.Inspect(ctx, tbl, id, t0)
		if err != nil {
			t.Fatalf("Inspect(%d): %v", id, err)
		}
		if j.ID != id || !j.InWorkCounted {
			t.Fatalf("Inspect(%d): id %d, InWorkCounted %v", id, j.ID, j.InWorkCounted)
		}
		return j
	}
	j := read(due)
	if j.State != dialects.JobDue || j.Group != "g" || j.NullGroup || j.Attempt != 2 || string(j.Payload) != "due" ||
		!bytes.Contains(j.Headers, []byte(`"k"`)) || j.Error != "boom: the first try failed" ||
		!j.LockedUntil.IsZero() || !j.RetryAfter.IsZero() || !j.ProcessedAt.IsZero() {
		t.Errorf("due row: %+v", j)
	}
	j = read(delayed)
	if j.State != dialects.JobDelayed || j.Attempt != 1 || string(j.Payload) != "delayed" || j.Error != "" {
		t.Errorf("delayed row: %+v", j)
	}
	sameTime(t, "the delayed row's retry_after", &j.RetryAfter, later)
	j = read(inWork)
	if j.State != dialects.JobInWork || j.Attempt != 2 {
		t.Errorf("row in work: %+v", j)
	}
	sameTime(t, "the lease", &j.LockedUntil, token)
	// The same row once its lease has run out reads as due.
	if j, err := in.Inspect(ctx, tbl, inWork, token.Add(time.Second)); err != nil || j.State != dialects.JobDue {
		t.Errorf("row whose lease ran out: %+v, %v", j, err)
	}
	j = read(processed)
	if j.State != dialects.JobProcessed || j.Group != "other" {
		t.Errorf("processed row: %+v", j)
	}
	sameTime(t, "processed_at", &j.ProcessedAt, t0.Add(-time.Minute))
}

// The row lock form's locks cannot be listed: a row a claim holds reads as due, and the
// job says so.
func testInspectRowLock(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_inspr", rowLockTable)
	id := e.publish(tbl, dialects.Message{Group: "g", Payload: []byte("p")})
	j, err := inspector(t, e.d).Inspect(ctx, tbl, id, t0)
	if err != nil || j.State != dialects.JobDue || j.InWorkCounted {
		t.Fatalf("row lock row: %+v, %v; want due with InWorkCounted false", j, err)
	}
}

// An id the table does not hold is ErrRowNotFound; a description the live table does not
// match is a *ConfigError, before any row is read; a table describing only its id and
// payload reads as due.
func testInspectRefusals(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_inspx", leaseTable)
	in := inspector(t, e.d)
	if _, err := in.Inspect(ctx, tbl, 12345, t0); !errors.Is(err, dialects.ErrRowNotFound) {
		t.Errorf("Inspect of a missing id: %v, want ErrRowNotFound", err)
	}
	wrong := tbl
	wrong.Error = "no_such_column"
	var ce *dialects.ConfigError
	if _, err := in.Inspect(ctx, wrong, 1, t0); !errors.As(err, &ce) {
		t.Errorf("Inspect with a column the table lacks: %v, want a *ConfigError", err)
	}
	bare := e.table("ra_inspb", func(name string) dialects.Table { return dialects.Table{Name: name, ID: "id", Payload: "payload"} })
	id := e.publish(bare, dialects.Message{Payload: []byte("p")})
	if j, err := in.Inspect(ctx, bare, id, t0); err != nil || j.State != dialects.JobDue || string(j.Payload) != "p" {
		t.Errorf("bare table's row: %+v, %v", j, err)
	}
}
