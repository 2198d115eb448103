package mysql

import (
	"database/sql"
	"fmt"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// MakeFaults: a connection the server kills, a server that is not there, a lock wait that
// times out.
func (harness) MakeFaults(t *testing.T, dd dialects.Dialect, name string) []dialecttest.MadeFault {
	t.Helper()
	db := dd.(*Dialect).DB()
	var faults []dialecttest.MadeFault

	// A connection the server kills (KILL, as an operator or a failover does).
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var id int64
	if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, fmt.Sprintf("KILL %d", id))
	waitGone(t, db, id)
	_, err = conn.ExecContext(ctx, "SELECT 1")
	faults = append(faults, dialecttest.MadeFault{What: "query on a killed connection", Err: err, Want: dialects.FaultConnection})

	// A server that is not there.
	down, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/test?timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	err = down.PingContext(ctx)
	faults = append(faults, dialecttest.MadeFault{What: "connect to a closed port", Err: err, Want: dialects.FaultConnection})

	// A row lock another transaction holds, with a one-second lock wait.
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if _, err := holder.ExecContext(ctx, "SELECT id FROM "+quote(name)+" WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	waiter, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	if _, err := waiter.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
		t.Fatal(err)
	}
	_, err = waiter.ExecContext(ctx, "SELECT id FROM "+quote(name)+" WHERE id = 1 FOR UPDATE")
	return append(faults, dialecttest.MadeFault{What: "lock wait timeout", Err: err, Want: dialects.FaultContention})
}
