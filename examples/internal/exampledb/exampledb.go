// Package exampledb is what the example programs that run on any of the three databases
// share: choosing the database by its URL (none: a SQLite file in a temporary directory),
// and running their own SQL through whichever pool the dialect has.
package exampledb

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
	"github.com/rowactor/rowactor/internal/dsn"
)

// DB is the database an example runs on.
type DB struct {
	Name string // "sqlite", "postgres" or "mysql"
	URL  string // for rowactor.Open
	dsn  string // for the dialect package's Open: a file path, a pgx URL or a driver DSN
}

// Pick chooses the database by its URL: "" means a SQLite file in a temporary directory,
// which cleanup removes; a postgres:// URL gets a pool of poolSize connections unless it
// names pool_max_conns (the row lock and advisory forms hold a pool connection per row in
// work, and pgxpool's default, max(4, CPUs), would quietly keep fewer rows in work on a
// small machine); a mysql:// URL ("mysql://user@host:3306/db", or the driver's DSN after
// mysql://) or a bare go-sql-driver DSN ("user@tcp(host:3306)/db") is MySQL/MariaDB, read
// as rowactor.Open reads it, whose pool rowactor.Open makes of 20.
func Pick(url string, poolSize int) (db DB, cleanup func(), err error) {
	cleanup = func() {}
	scheme, _, _ := strings.Cut(url, "://")
	switch {
	case url == "":
		dir, err := os.MkdirTemp("", "rowactor-example-")
		if err != nil {
			return db, cleanup, err
		}
		path := filepath.Join(dir, "example.db")
		return DB{Name: "sqlite", URL: "sqlite:" + path, dsn: path}, func() { os.RemoveAll(dir) }, nil
	case scheme == "postgres" || scheme == "postgresql":
		url = withPoolSize(url, poolSize)
		return DB{Name: "postgres", URL: url, dsn: url}, cleanup, nil
	case scheme == "mysql" || scheme == "mariadb" ||
		!strings.Contains(url, "://") && (strings.Contains(url, "@tcp") || strings.Contains(url, "@unix(")):
		// rowactor.Open's reader: a mysql:// URL becomes the driver's DSN for Reopen.
		t, err := dsn.Parse(url)
		if err != nil {
			return db, cleanup, err
		}
		return DB{Name: "mysql", URL: t.URL, dsn: t.Addr}, cleanup, nil
	}
	return db, cleanup, fmt.Errorf("want a postgres:// or mysql:// URL, or a MySQL DSN (or none, for SQLite), got %q", url)
}

// Param is the n-th placeholder (from 1): $n on PostgreSQL, ? on MySQL and SQLite.
func (db DB) Param(n int) string {
	if db.Name == "postgres" {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// Reopen opens the database with its dialect package, outside any broker (Shutdown closes
// a broker's pool).
func (db DB) Reopen(ctx context.Context) (dialects.Dialect, error) {
	switch db.Name {
	case "sqlite":
		d, err := sqlite.Open(ctx, db.dsn)
		if err != nil {
			return nil, err // never a nil *Dialect inside a non-nil interface
		}
		return d, nil
	case "postgres":
		d, err := postgres.Open(ctx, db.dsn)
		if err != nil {
			return nil, err // never a nil *Dialect inside a non-nil interface
		}
		return d, nil
	case "mysql":
		d, err := mysql.Open(ctx, db.dsn)
		if err != nil {
			return nil, err // never a nil *Dialect inside a non-nil interface
		}
		return d, nil
	}
	return nil, fmt.Errorf("no database %q", db.Name)
}

// Pool is a dialect's pool: *pgxpool.Pool on PostgreSQL, *sql.DB on MySQL and SQLite.
func Pool(d dialects.Dialect) any {
	switch d := d.(type) {
	case *postgres.Dialect:
		return d.Pool()
	case *mysql.Dialect:
		return d.DB()
	case *sqlite.Dialect:
		return d.DB()
	}
	return nil
}

// Exec runs one statement on a pool, or in a transaction: a delivery's d.Tx() is a pgx.Tx
// on PostgreSQL and a *sql.Tx on MySQL and SQLite.
func Exec(ctx context.Context, on any, query string, args ...any) error {
	var err error
	switch c := on.(type) {
	case pgx.Tx:
		_, err = c.Exec(ctx, query, args...)
	case *sql.Tx:
		_, err = c.ExecContext(ctx, query, args...)
	case *pgxpool.Pool:
		_, err = c.Exec(ctx, query, args...)
	case *sql.DB:
		_, err = c.ExecContext(ctx, query, args...)
	default:
		err = fmt.Errorf("no statements on a %T", on)
	}
	return err
}

// ExecAll runs the statements of a schema (rowactor.Schema separates them by ";\n"),
// skipping empty ones.
func ExecAll(ctx context.Context, on any, stmts ...string) error {
	for _, s := range stmts {
		for _, one := range strings.Split(s, ";\n") {
			if strings.TrimSpace(one) == "" {
				continue
			}
			if err := Exec(ctx, on, one); err != nil {
				return fmt.Errorf("%w\n%s", err, one)
			}
		}
	}
	return nil
}

// QueryRow scans the one row a query returns.
func QueryRow(ctx context.Context, pool any, query string, into ...any) error {
	switch c := pool.(type) {
	case *pgxpool.Pool:
		return c.QueryRow(ctx, query).Scan(into...)
	case *sql.DB:
		return c.QueryRowContext(ctx, query).Scan(into...)
	}
	return fmt.Errorf("no queries on a %T", pool)
}

// withPoolSize asks pgxpool for n connections unless the URL says otherwise.
func withPoolSize(url string, n int) string {
	if strings.Contains(url, "pool_max_conns=") {
		return url
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "pool_max_conns=" + strconv.Itoa(n)
}
