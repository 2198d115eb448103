package rowactor_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

func init() {
	drivers = append(drivers, driver{
		name:  "sqlite",
		forms: []rowactor.Form{rowactor.FormLease, rowactor.FormAdvisory},
		open: func(t *testing.T) func() dialects.Dialect {
			path := filepath.Join(t.TempDir(), "queue.db")
			return func() dialects.Dialect {
				d, err := sqlite.Open(context.Background(), path)
				if err != nil {
					t.Fatalf("sqlite.Open: %v", err)
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
			if _, err := sqliteDB(d).Exec(query, args...); err != nil {
				t.Fatalf("exec %q: %v", query, err)
			}
		},
		count: func(t *testing.T, d dialects.Dialect, query string, args ...any) int {
			t.Helper()
			var n int
			if err := sqliteDB(d).QueryRow(query, args...).Scan(&n); err != nil {
				t.Fatalf("count %q: %v", query, err)
			}
			return n
		},
		sorts: func(t *testing.T, d dialects.Dialect, table, query string, args ...any) (bool, string) {
			t.Helper()
			if _, err := sqliteDB(d).Exec("ANALYZE `" + table + "`"); err != nil {
				t.Fatal(err)
			}
			text := explainRows(t, sqliteDB(d), "EXPLAIN QUERY PLAN "+query, args...)
			return strings.Contains(text, "TEMP B-TREE FOR ORDER BY"), text
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
				locked, retry, proc sql.NullString
				lastError           sql.NullString
			)
			err := sqliteDB(d).QueryRow("SELECT "+col(tb.Attempt)+", "+col(tb.Group)+", "+col(tb.LockedUntil)+", "+col(tb.RetryAfter)+", "+col(tb.ProcessedAt)+", "+col(tb.Error)+
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
			st.lockedUntil, st.retryAfter, st.processedAt = sqliteTime(t, locked), sqliteTime(t, retry), sqliteTime(t, proc)
			return st
		},
		begin: func(t *testing.T, d dialects.Dialect) (any, func() error, func() error) {
			tx, err := sqliteDB(d).Begin()
			if err != nil {
				t.Fatalf("begin: %v", err)
			}
			return tx, tx.Commit, tx.Rollback
		},
		timeValue: func(tm time.Time) any { return tm.UTC().Format(sqlite.TimeLayout) },
		url: func(t *testing.T, d dialects.Dialect) string {
			var file string
			if err := sqliteDB(d).QueryRow("SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file); err != nil {
				t.Fatal(err)
			}
			return "sqlite:" + file
		},
	})
}

func sqliteDB(d dialects.Dialect) *sql.DB { return d.(*sqlite.Dialect).DB() }

func sqliteTime(t *testing.T, s sql.NullString) *time.Time {
	if !s.Valid {
		return nil
	}
	tm, err := time.Parse(sqlite.TimeLayout, s.String)
	if err != nil {
		t.Fatalf("time %q: %v", s.String, err)
	}
	return &tm
}
