package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/dialects"
)

// TestClassifyRealFaults produces each fault on the server and checks its class, bare and
// wrapped the way the runtime wraps claim errors.
func TestClassifyRealFaults(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d)
	mustExec(t, d, "CREATE TABLE "+quote(name)+" (id bigint PRIMARY KEY)")
	mustExec(t, d, "INSERT INTO "+quote(name)+" VALUES (1)")

	check := func(what string, err error, want dialects.Fault) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		for _, e := range []error{err, fmt.Errorf("claim leases: %w", err)} {
			if got := dialects.Classify(d, e); got != want {
				t.Errorf("%s: Classify(%v) = %v, want %v", what, e, got, want)
			}
		}
	}

	// A connection the server terminates (pg_terminate_backend, as a fast shutdown does).
	conn, err := pgx.Connect(ctx, testURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	mustExec(t, d, "SELECT pg_terminate_backend($1)", conn.PgConn().PID())
	_, err = conn.Exec(ctx, "SELECT 1")
	check("query on a terminated connection", err, dialects.FaultConnection)
	_, err = conn.Exec(ctx, "SELECT 1")
	check("query on a connection pgx closed", err, dialects.FaultConnection)

	// A server that is not there.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pgx.Connect(cctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable")
	check("connect to a closed port", err, dialects.FaultConnection)

	// A table and a column that are not there.
	_, err = d.Pool().Exec(ctx, "SELECT * FROM "+quote(name+"_missing"))
	check("missing table", err, dialects.FaultSchema)
	_, err = d.Pool().Exec(ctx, "SELECT nope FROM "+quote(name))
	check("missing column", err, dialects.FaultSchema)

	// A row lock another transaction holds, with lock_timeout.
	holder, err := d.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, "SELECT id FROM "+quote(name)+" WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	waiter, err := d.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Rollback(ctx)
	if _, err := waiter.Exec(ctx, "SET LOCAL lock_timeout = '50ms'"); err != nil {
		t.Fatal(err)
	}
	_, err = waiter.Exec(ctx, "SELECT id FROM "+quote(name)+" WHERE id = 1 FOR UPDATE")
	check("lock timeout", err, dialects.FaultContention)

	// A context that ended is the caller's doing, not the database's.
	ended, stop := context.WithCancel(ctx)
	stop()
	_, err = d.Pool().Exec(ended, "SELECT 1")
	check("ended context", err, dialects.FaultUnknown)
}
