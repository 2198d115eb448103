package rowactor_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/internal/pgwarm"
)

// postgresURL is the server the suite runs on: ROWACTOR_POSTGRES_URL, or the local test
// server. The suite fails, never skips, when it is unreachable.
func postgresURL() string {
	url := os.Getenv("ROWACTOR_POSTGRES_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	// The advisory scenarios hold a connection per delivery (up to five at once), and
	// pgxpool's default size is max(4, CPUs).
	if !strings.Contains(url, "pool_max_conns") {
		sep := "?"
		if strings.Contains(url, "?") {
			sep = "&"
		}
		url += sep + "pool_max_conns=12"
	}
	return url
}

// createdTable finds the table a schema statement creates, to drop it after the test.
var createdTable = regexp.MustCompile(`^CREATE TABLE IF NOT EXISTS "((?:[^"]|"")+)"`)

func init() {
	drivers = append(drivers, driver{
		name:  "postgres",
		forms: []rowactor.Form{rowactor.FormRowLock, rowactor.FormLease, rowactor.FormAdvisory},
		open: func(t *testing.T) func() dialects.Dialect {
			url := postgresURL()
			return func() dialects.Dialect {
				pool, err := pgwarm.Take(context.Background(), url)
				if err != nil {
					t.Fatalf("pgxpool.New: PostgreSQL is unreachable at %s: %v", url, err)
				}
				d := postgres.New(pool)
				t.Cleanup(func() {
					_ = d.Close()
					pgwarm.Give(t, pool) // fails the test if a connection was never released
				})
				return d
			}
		},
		txExec: func(ctx context.Context, tx any, query string, args ...any) error {
			if x, ok := tx.(pgx.Tx); ok { // a DriverTx
				_, err := x.Exec(ctx, dollarPlaceholders(query), args...)
				return err
			}
			_, err := tx.(*sql.Tx).ExecContext(ctx, dollarPlaceholders(query), args...)
			return err
		},
		exec: func(t *testing.T, d dialects.Dialect, query string, args ...any) {
			t.Helper()
			query = dollarPlaceholders(query)
			if m := createdTable.FindStringSubmatch(query); m != nil {
				dropAtCleanup(t, d, strings.ReplaceAll(m[1], `""`, `"`))
			}
			if _, err := pgPool(d).Exec(context.Background(), query, args...); err != nil {
				t.Fatalf("exec %q: %v", query, err)
			}
		},
		count: func(t *testing.T, d dialects.Dialect, query string, args ...any) int {
			t.Helper()
			var n int
			if err := pgPool(d).QueryRow(context.Background(), dollarPlaceholders(query), args...).Scan(&n); err != nil {
				t.Fatalf("count %q: %v", query, err)
			}
			return n
		},
		sorts: func(t *testing.T, d dialects.Dialect, table, query string, args ...any) (bool, string) {
			t.Helper()
			ctx := context.Background()
			if _, err := pgPool(d).Exec(ctx, "ANALYZE "+pgQuote(table)); err != nil {
				t.Fatal(err)
			}
			rows, err := pgPool(d).Query(ctx, "EXPLAIN "+dollarPlaceholders(query), args...)
			if err != nil {
				t.Fatalf("explain %q: %v", query, err)
			}
			defer rows.Close()
			var plan []string
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, line)
			}
			text := strings.Join(plan, "\n")
			return strings.Contains(text, "Sort"), text
		},
		state: func(t *testing.T, d dialects.Dialect, tb rowactor.Table, id int64) rowState {
			t.Helper()
			col := func(name, typ string) string {
				if name == "" {
					return "NULL::" + typ
				}
				return pgQuote(name)
			}
			var (
				st                  rowState
				attempt             *int64
				group               *string
				locked, retry, proc *time.Time
				lastError           *string
			)
			err := pgPool(d).QueryRow(context.Background(), "SELECT "+col(tb.Attempt, "bigint")+", "+col(tb.Group, "text")+", "+
				col(tb.LockedUntil, "timestamptz")+", "+col(tb.RetryAfter, "timestamptz")+", "+col(tb.ProcessedAt, "timestamptz")+", "+col(tb.Error, "text")+
				" FROM "+pgQuote(tb.Name)+" WHERE "+pgQuote(tb.ID)+" = $1", id).Scan(&attempt, &group, &locked, &retry, &proc, &lastError)
			if errors.Is(err, pgx.ErrNoRows) {
				return st
			}
			if err != nil {
				t.Fatalf("row %d: %v", id, err)
			}
			st.exists = true
			if attempt != nil {
				st.attempt = int(*attempt)
			}
			if group != nil {
				st.group = *group
			}
			st.lockedUntil, st.retryAfter, st.processedAt, st.lastError = locked, retry, proc, lastError
			return st
		},
		begin: func(t *testing.T, d dialects.Dialect) (any, func() error, func() error) {
			ctx := context.Background()
			tx, err := pgPool(d).Begin(ctx)
			if err != nil {
				t.Fatalf("begin: %v", err)
			}
			return tx, func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) }
		},
		timeValue: func(tm time.Time) any { return tm },
		notifies:  true,
		url:       func(*testing.T, dialects.Dialect) string { return postgresURL() },
		keyLocked: func(t *testing.T, d dialects.Dialect, key string) bool {
			t.Helper()
			var held bool
			// A bigint advisory key shows in pg_locks as two 32-bit halves.
			err := d.(*postgres.Dialect).Pool().QueryRow(context.Background(),
				`SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
				   AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 0))`, key).Scan(&held)
			if err != nil {
				t.Fatal(err)
			}
			return held
		},
	})
}

func pgPool(d dialects.Dialect) *pgxpool.Pool { return d.(*postgres.Dialect).Pool() }

func pgQuote(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

// dollarPlaceholders rewrites the suite's ? placeholders as $1..$n, left to right (the
// suite's statements have no ? inside literals).
func dollarPlaceholders(query string) string {
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// dropAtCleanup drops a table the test created when the test ends: after its brokers
// shut down (their cleanups were registered later, so they run first) and before its
// dialects close. Unlike SQLite's temporary files, the server's tables outlive the test.
func dropAtCleanup(t *testing.T, d dialects.Dialect, table string) {
	pool := pgPool(d)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgQuote(table)); err != nil {
			t.Errorf("drop table %s (a lock left behind?): %v", table, err)
		}
	})
}
