package postgres

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// A row another session holds only FOR KEY SHARE (the foreign key check of an insert into
// a table referencing the queue's rows, kept until that transaction ends) does not block
// an UPDATE of its lease: an UPDATE of non-key columns takes FOR NO KEY UPDATE, which
// KEY SHARE allows. The extension and the batched release used to be such UPDATEs and
// moved the lease at once. Since 3fe98c6 they lock their rows FOR UPDATE (the strongest
// mode, which conflicts with KEY SHARE) ... SKIP LOCKED, so the lease is reported busy
// and is not extended for as long as the child's transaction stays open: a handler that
// writes a row referencing its job in its own transaction (d.Tx()) runs on with its lease
// never extended, and it runs out.
func TestExtendMovesALeaseWhoseRowIsOnlyKeyShared(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	child := tableName(t, d)
	mustExec(t, d, "CREATE TABLE "+quote(child)+" (id bigserial PRIMARY KEY, job bigint NOT NULL REFERENCES "+quote(tbl.Name)+"(id))")
	var in []int64
	for range 2 {
		in = append(in, dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")}))
	}
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl})
	start := t0.Truncate(time.Second)
	token := start.Add(10 * time.Second)
	if rows, err := q.ClaimLeases(ctx, start, token, 2); err != nil || len(rows) != 2 {
		t.Fatalf("claim: %v %v", dialecttest.IDs(rows), err)
	}
	// A service's transaction records a result for the first job and stays open.
	other, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if _, err := other.Exec(ctx, "INSERT INTO "+quote(child)+" (job) VALUES ($1)", in[0]); err != nil {
		t.Fatal(err)
	}

	// The plain UPDATE the extension used to be goes through at once.
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	probe, err := d.pool.Begin(short)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := probe.Exec(short, "UPDATE "+quote(tbl.Name)+" SET locked_until = locked_until WHERE id = $1", in[0]); err != nil {
		t.Fatalf("a plain UPDATE of the lease waits for the key share: %v", err)
	}
	_ = probe.Rollback(ctx)

	until := token.Add(20 * time.Second)
	held := []dialects.Lease{{ID: in[0], Token: token}, {ID: in[1], Token: token}}
	moved, err := q.ExtendLeases(short, until, held)
	var busy *dialects.RowsBusyError
	slices.Sort(moved)
	if errors.As(err, &busy) || err != nil || !slices.Equal(moved, []int64{in[0], in[1]}) {
		t.Fatalf("extension: moved %v, err %v; want both leases moved (a key share does not block an UPDATE of the lease)",
			moved, err)
	}
}
