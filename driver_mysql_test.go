package rowactor_test

import (
	"context"
	"database/sql"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
)

// mysqlDSN is the MySQL or MariaDB server of the suite. It must be reachable: the suite
// fails, never skips, without it.
func mysqlDSN() string {
	if dsn := os.Getenv("ROWACTOR_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	return "root@tcp(127.0.0.1:3306)/test?parseTime=true"
}

// mysqlTables records the tables each test created through exec, dropped when it ends.
var mysqlTables struct {
	mu sync.Mutex
	m  map[*testing.T][]string
}

var createTableRE = regexp.MustCompile("^CREATE TABLE (?:IF NOT EXISTS )?`((?:[^`]|``)+)`")

func init() {
	drivers = append(drivers, driver{
		name: "mysql",
		// InnoDB queues record locks: a waiting settlement gets its row first.
		waiterKeepsPlace: true,
		forms:            []rowactor.Form{rowactor.FormRowLock, rowactor.FormLease, rowactor.FormAdvisory},
		open: func(t *testing.T) func() dialects.Dialect {
			dsn := mysqlDSN()
			// Registered before any dialect or broker of the test, so it runs after all
			// of them have shut down and closed.
			t.Cleanup(func() { dropMySQLTables(t, dsn) })
			return func() dialects.Dialect {
				d, err := mysql.Open(context.Background(), dsn)
				if err != nil {
					t.Fatalf("mysql.Open (the server at ROWACTOR_MYSQL_DSN must be up): %v", err)
				}
				t.Cleanup(func() { _ = d.Close() })
				return d
			}
		},
		txExec: func(ctx context.Context, tx any, query string, args ...any) error {
			_, err := tx.(*sql.Tx).ExecContext(ctx, query, args...)
			return err
		},
		exec: func(t *testing.T, d dialects.Dialect, query string, args ...any) {
			t.Helper()
			if m := createTableRE.FindStringSubmatch(query); m != nil {
				mysqlTables.mu.Lock()
				if mysqlTables.m == nil {
					mysqlTables.m = make(map[*testing.T][]string)
				}
				mysqlTables.m[t] = append(mysqlTables.m[t], m[1])
				mysqlTables.mu.Unlock()
			}
			if _, err := mysqlDB(d).Exec(query, args...); err != nil {
				t.Fatalf("exec %q: %v", query, err)
			}
		},
		count: func(t *testing.T, d dialects.Dialect, query string, args ...any) int {
			t.Helper()
			var n int
			if err := mysqlDB(d).QueryRow(query, args...).Scan(&n); err != nil {
				t.Fatalf("count %q: %v", query, err)
			}
			return n
		},
		sorts: func(t *testing.T, d dialects.Dialect, table, query string, args ...any) (bool, string) {
			t.Helper()
			if _, err := mysqlDB(d).Exec("ANALYZE TABLE `" + table + "`"); err != nil {
				t.Fatal(err)
			}
			text := explainRows(t, mysqlDB(d), "EXPLAIN "+query, args...)
			return strings.Contains(text, "filesort"), text
		},
		state: func(t *testing.T, d dialects.Dialect, tb rowactor.Table, id int64) rowState {
			t.Helper()
			col := func(name string) string {
				if name == "" {
					return "NULL"
				}
				return "`" + name + "`"
			}
			var (
				st                  rowState
				attempt             sql.NullInt64
				group               sql.NullString
				locked, retry, proc sql.NullTime
				lastError           sql.NullString
			)
			err := mysqlDB(d).QueryRow("SELECT "+col(tb.Attempt)+", "+col(tb.Group)+", "+col(tb.LockedUntil)+", "+col(tb.RetryAfter)+", "+col(tb.ProcessedAt)+", "+col(tb.Error)+
				" FROM `"+tb.Name+"` WHERE `"+tb.ID+"` = ?", id).Scan(&attempt, &group, &locked, &retry, &proc, &lastError)
			if err == sql.ErrNoRows {
				return st
			}
			if err != nil {
				t.Fatalf("row %d: %v", id, err)
			}
			st.exists, st.attempt, st.group = true, int(attempt.Int64), group.String
			if lastError.Valid {
				st.lastError = &lastError.String
			}
			st.lockedUntil, st.retryAfter, st.processedAt = mysqlTime(locked), mysqlTime(retry), mysqlTime(proc)
			return st
		},
		begin: func(t *testing.T, d dialects.Dialect) (any, func() error, func() error) {
			tx, err := mysqlDB(d).Begin()
			if err != nil {
				t.Fatalf("begin: %v", err)
			}
			return tx, tx.Commit, tx.Rollback
		},
		timeValue: func(tm time.Time) any { return tm.UTC().Truncate(time.Microsecond) },
		url:       func(*testing.T, dialects.Dialect) string { return "mysql://" + mysqlDSN() },
		keyLocked: func(t *testing.T, d dialects.Dialect, key string) bool {
			t.Helper()
			var db string
			var holder sql.NullInt64
			conn := d.(*mysql.Dialect).DB()
			if err := conn.QueryRow("SELECT DATABASE()").Scan(&db); err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRow("SELECT IS_USED_LOCK(?)", mysql.LockName(db, key)).Scan(&holder); err != nil {
				t.Fatal(err)
			}
			return holder.Valid
		},
	})
}

func mysqlDB(d dialects.Dialect) *sql.DB { return d.(*mysql.Dialect).DB() }

func mysqlTime(n sql.NullTime) *time.Time {
	if !n.Valid {
		return nil
	}
	return &n.Time
}

// dropMySQLTables drops the tables t created, on a pool of its own (the test's dialects
// are closed by now), never waiting long for a lock a leftover session might hold.
func dropMySQLTables(t *testing.T, dsn string) {
	mysqlTables.mu.Lock()
	names := mysqlTables.m[t]
	delete(mysqlTables.m, t)
	mysqlTables.mu.Unlock()
	if len(names) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := mysql.Open(ctx, dsn)
	if err != nil {
		t.Errorf("drop tables %v: %v", names, err)
		return
	}
	defer d.Close()
	conn, err := d.DB().Conn(ctx)
	if err != nil {
		t.Errorf("drop tables %v: %v", names, err)
		return
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET SESSION lock_wait_timeout = 10"); err != nil {
		t.Errorf("drop tables: %v", err)
	}
	for _, name := range names {
		// The name is as the CREATE TABLE quoted it.
		if _, err := conn.ExecContext(ctx, "DROP TABLE IF EXISTS `"+name+"`"); err != nil {
			t.Errorf("drop table %s: %v", name, err)
		}
	}
}
