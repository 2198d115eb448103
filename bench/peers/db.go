package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	_ "modernc.org/sqlite" // registers the "sqlite" driver, as rowactor's SQLite dialect uses
)

// openPool opens a pgxpool on the URL with a tracer that counts every statement its
// connections run (BEGIN, COMMIT and COPY included), as bench/ does for PostgreSQL. Each
// system gets a pool of its own from the same URL, so both see the same pool size.
func openPool(ctx context.Context, pgURL string) (*pgxpool.Pool, *atomic.Int64, error) {
	pc, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		return nil, nil, err
	}
	counter := &stmtCounter{}
	pc.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, &counter.n, nil
}

// stmtCounter is a pgx tracer counting Query, QueryRow, Exec and CopyFrom calls.
type stmtCounter struct{ n atomic.Int64 }

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *stmtCounter) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *stmtCounter) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

// settlePostgres runs after every fill, as bench/ does, so each drain starts from a
// vacuumed, analysed table and a fresh checkpoint.
func settlePostgres(ctx context.Context, pool *pgxpool.Pool, table string) error {
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) "+table); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, "CHECKPOINT")
	return err
}

func countRows(ctx context.Context, pool *pgxpool.Pool, query string, args ...any) (n int, err error) {
	err = pool.QueryRow(ctx, query, args...).Scan(&n)
	return n, err
}

// sqlitePragmas are the ones rowactor's sqlite.Open sets on every connection
// (dialects/sqlite/dialect.go, dsn): WAL, a 10 s busy timeout and synchronous NORMAL.
// goqite's pool gets the same, so both commit with the same durability: in WAL mode,
// NORMAL syncs the WAL at checkpoints, not at every commit.
var sqlitePragmas = []string{"busy_timeout(10000)", "journal_mode(WAL)", "synchronous(NORMAL)"}

// openSQLite opens a pool on path the way sqlite.Open does (a URI filename whose _pragma
// parameters the driver runs on each new connection).
func openSQLite(ctx context.Context, path string) (*sql.DB, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	p := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(filepath.ToSlash(abs))
	db, err := sql.Open("sqlite", "file:"+p+"?"+url.Values{"_pragma": sqlitePragmas}.Encode())
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// sqliteSettings reads back what a pool's connection runs with, for the output.
func sqliteSettings(ctx context.Context, db *sql.DB) (string, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	var mode string
	var syncLevel, busy int
	if err := conn.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return "", err
	}
	if err := conn.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&syncLevel); err != nil {
		return "", err
	}
	if err := conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil {
		return "", err
	}
	names := map[int]string{0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
	return fmt.Sprintf("journal_mode=%s synchronous=%s busy_timeout=%d", mode, names[syncLevel], busy), nil
}
