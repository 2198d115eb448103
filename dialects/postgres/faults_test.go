package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

func (harness) Try(c context.Context, d dialects.Dialect, query string, args ...any) error {
	_, err := d.(*Dialect).Pool().Exec(c, dialecttest.Dollar(query), args...)
	return err
}

// MakeFaults: a connection the server terminates (then one pgx closed), a server that is
// not there, a lock_timeout.
func (harness) MakeFaults(t *testing.T, dd dialects.Dialect, name string) []dialecttest.MadeFault {
	t.Helper()
	d := dd.(*Dialect)
	var faults []dialecttest.MadeFault

	// A connection the server terminates (pg_terminate_backend, as a fast shutdown does).
	conn, err := pgx.Connect(ctx, testURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	mustExec(t, d, "SELECT pg_terminate_backend($1)", conn.PgConn().PID())
	_, err = conn.Exec(ctx, "SELECT 1")
	faults = append(faults, dialecttest.MadeFault{What: "query on a terminated connection", Err: err, Want: dialects.FaultConnection})
	_, err = conn.Exec(ctx, "SELECT 1")
	faults = append(faults, dialecttest.MadeFault{What: "query on a connection pgx closed", Err: err, Want: dialects.FaultConnection})

	// A server that is not there.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pgx.Connect(cctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable")
	faults = append(faults, dialecttest.MadeFault{What: "connect to a closed port", Err: err, Want: dialects.FaultConnection})

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
	return append(faults, dialecttest.MadeFault{What: "lock timeout", Err: err, Want: dialects.FaultContention})
}
