package postgres

import (
	"net/url"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// A transactional lease table declaring no isolation level opens its deliveries with a
// plain BEGIN, at the session's default_transaction_isolation: a default of repeatable
// read or serializable set on the role or on the database (not only in the server's
// configuration file) must be refused at Open like a declared one, with a *ConfigError
// naming the table, the setting, where it comes from and the fix.
func TestOpenRefusesSnapshotDefaultOfRoleOrDatabase(t *testing.T) {
	admin := newDialect(t)
	suffix := tableNameSuffix(t)
	role := "ra_role_" + suffix
	mustExec(t, admin, "CREATE ROLE "+quote(role)+" LOGIN")
	t.Cleanup(func() {
		// The role's objects go first; a database made for the test is dropped by its
		// own cleanup, which runs before this one.
		if _, err := admin.Pool().Exec(ctx, "DROP OWNED BY "+quote(role)); err != nil {
			t.Errorf("drop owned by %s: %v", role, err)
		}
		if _, err := admin.Pool().Exec(ctx, "DROP ROLE "+quote(role)); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	base, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	// connect opens a pool as the role on database db.
	connect := func(t *testing.T, db string) *Dialect {
		t.Helper()
		u := *base
		u.User = url.User(role)
		u.Path = "/" + db
		return openURL(t, withParams(u.String(), "pool_max_conns=2"))
	}
	// refused opens a fresh transactional lease table as the role on db and checks it is
	// refused for level, set at source.
	refused := func(t *testing.T, db, level, source, fix string) {
		t.Helper()
		d := connect(t, db)
		tbl := leaseTable(tableName(t, d))
		createTable(t, d, tbl)
		q, err := d.Open(ctx, dialects.QueueSpec{Table: tbl, Transactional: true})
		if err == nil {
			q.Close()
			t.Fatalf("a transactional lease table opened at a default of %s", level)
		}
		ce := dialecttest.ConfigError(t, err)
		if ce.Table != tbl.Name || ce.Option != "Table.Isolation" {
			t.Errorf("table %q option %q", ce.Table, ce.Option)
		}
		dialecttest.Contains(t, err.Error(), "default_transaction_isolation")
		dialecttest.Contains(t, err.Error(), level)
		dialecttest.Contains(t, ce.Reason, source)
		dialecttest.Contains(t, ce.Fix, fix)
		dialecttest.Contains(t, ce.Fix, "ReadCommitted")
		// Declared read committed, the table opens: BEGIN names its level.
		tbl.Isolation = dialects.ReadCommitted
		q, err = d.Open(ctx, dialects.QueueSpec{Table: tbl, Transactional: true})
		if err != nil {
			t.Fatalf("declared read committed: %v", err)
		}
		q.Close()
		// Outside transactional mode the default concerns no lease delivery.
		tbl.Isolation = ""
		q, err = d.Open(ctx, dialects.QueueSpec{Table: tbl})
		if err != nil {
			t.Fatalf("not transactional: %v", err)
		}
		q.Close()
	}
	var db string
	if err := admin.Pool().QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	mustExec(t, admin, "GRANT CREATE, USAGE ON SCHEMA public TO "+quote(role))

	t.Run("role", func(t *testing.T) {
		mustExec(t, admin, "ALTER ROLE "+quote(role)+" SET default_transaction_isolation = 'repeatable read'")
		defer mustExec(t, admin, "ALTER ROLE "+quote(role)+" RESET default_transaction_isolation")
		refused(t, db, "repeatable read", "role", "ALTER ROLE "+quote(role)+" RESET default_transaction_isolation")
	})
	t.Run("role in database", func(t *testing.T) {
		mustExec(t, admin, "ALTER ROLE "+quote(role)+" IN DATABASE "+quote(db)+" SET default_transaction_isolation = 'serializable'")
		defer mustExec(t, admin, "ALTER ROLE "+quote(role)+" IN DATABASE "+quote(db)+" RESET default_transaction_isolation")
		refused(t, db, "serializable", "role", "ALTER ROLE "+quote(role)+" IN DATABASE "+quote(db)+" RESET default_transaction_isolation")
	})
	t.Run("database", func(t *testing.T) {
		// A database of its own: the shared test database's default must not change
		// under other tests.
		own := "ra_db_" + suffix
		mustExec(t, admin, "CREATE DATABASE "+quote(own)+" OWNER "+quote(role))
		t.Cleanup(func() {
			if _, err := admin.Pool().Exec(ctx, "DROP DATABASE IF EXISTS "+quote(own)+" WITH (FORCE)"); err != nil {
				t.Errorf("drop database %s: %v", own, err)
			}
		})
		mustExec(t, admin, "ALTER DATABASE "+quote(own)+" SET default_transaction_isolation = 'serializable'")
		refused(t, own, "serializable", "database", "ALTER DATABASE "+quote(own)+" RESET default_transaction_isolation")
	})
}
