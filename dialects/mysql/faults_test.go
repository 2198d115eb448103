package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// TestClassifyRealFaults produces each fault on the server and checks its class, bare and
// wrapped the way the runtime wraps claim errors.
func TestClassifyRealFaults(t *testing.T) {
	d := newDialect(t)
	db := d.DB()
	name := tableName(t, d, "fault")
	mustExec(t, db, "CREATE TABLE `"+name+"` (id BIGINT PRIMARY KEY) ENGINE=InnoDB")
	mustExec(t, db, "INSERT INTO `"+name+"` VALUES (1)")

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
	check("query on a killed connection", err, dialects.FaultConnection)

	// A server that is not there.
	down, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/test?timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	err = down.PingContext(ctx)
	check("connect to a closed port", err, dialects.FaultConnection)

	// A table and a column that are not there.
	_, err = db.ExecContext(ctx, "SELECT * FROM `"+name+"_missing`")
	check("missing table", err, dialects.FaultSchema)
	_, err = db.ExecContext(ctx, "SELECT nope FROM `"+name+"`")
	check("missing column", err, dialects.FaultSchema)

	// A row lock another transaction holds, with a one-second lock wait.
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if _, err := holder.ExecContext(ctx, "SELECT id FROM `"+name+"` WHERE id = 1 FOR UPDATE"); err != nil {
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
	_, err = waiter.ExecContext(ctx, "SELECT id FROM `"+name+"` WHERE id = 1 FOR UPDATE")
	check("lock wait timeout", err, dialects.FaultContention)

	// A context that ended is the caller's doing, not the database's.
	ended, stop := context.WithTimeout(ctx, time.Nanosecond)
	defer stop()
	<-ended.Done()
	_, err = db.ExecContext(ended, "SELECT 1")
	check("ended context", err, dialects.FaultUnknown)
}
