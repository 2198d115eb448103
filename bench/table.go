package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// tableDesc is a queue table of one form without groups: id, payload, attempt, and the
// form's column (locked_until for the lease form, an advisory key per row for the
// advisory form, nothing for the row lock form).
type tableDesc struct{ rowactor.Table }

// tableFor names the table after the form and this process, so that a run never touches
// another run's table; advisory keys are database-wide, so they carry the table's name.
func tableFor(f dialects.Form) tableDesc {
	return tableNamed(f, fmt.Sprintf("bench_%s_%d", f, os.Getpid()))
}

// tableNamed is tableFor's description under another name (another process's table, a
// second table of this one).
func tableNamed(f dialects.Form, name string) tableDesc {
	t := rowactor.Table{Name: name, ID: "id", Payload: "payload", Attempt: "attempt"}
	switch f {
	case dialects.FormLease:
		t.LockedUntil = "locked_until"
	case dialects.FormAdvisory:
		t.AdvisoryKey = name + "-{id}"
	}
	return tableDesc{t}
}

// payloadSize is the size of every row's payload.
const payloadSize = 64

var payload = func() []byte {
	p := make([]byte, payloadSize)
	for i := range p {
		p[i] = 'a' + byte(i%26)
	}
	return p
}()

// fillBatch is how many rows one INSERT carries; all of a fill's INSERTs run in one
// transaction.
const fillBatch = 500

// target is one database: its dialect, shared by both contenders, and what the harness
// needs around the drains.
type target struct {
	db      string
	d       dialects.Dialect
	version string
	// driverStmts counts every statement the driver runs (PostgreSQL, through a pgx
	// tracer); nil where the driver cannot count.
	driverStmts *atomic.Int64
	costs       costs

	exec  func(ctx context.Context, text string) error
	query func(ctx context.Context, text string) (int64, error)
	// fill inserts rows in batches inside one transaction.
	fill func(ctx context.Context, table string, rows int) error
	// settle runs after a fill: checkpoints, statistics.
	settle func(ctx context.Context, table string) error
	close  func()

	// nodes are a cluster's pools, one per node (nodes[0] is d); nil on one server.
	nodes []dialects.Dialect
	// retries counts the claims and settlements the raw loops ran again after a
	// cluster's certification aborted them.
	retries atomic.Int64
}

func openTarget(ctx context.Context, db string, cfg config) (*target, error) {
	switch db {
	case "sqlite":
		return openSQLite(ctx, cfg.dir)
	case "postgres":
		return withBrokers(ctx, cfg.brokers, func(ctx context.Context) (dialects.Dialect, error) {
			return postgres.Open(ctx, cfg.pgURL)
		})(openPostgres(ctx, cfg.pgURL))
	case "mysql":
		return withBrokers(ctx, cfg.brokers, func(ctx context.Context) (dialects.Dialect, error) {
			return mysql.Open(ctx, cfg.mysqlDSN)
		})(openMySQL(ctx, cfg.mysqlDSN))
	case "galera":
		return openGalera(ctx, cfg.galeraDSNs)
	}
	return nil, fmt.Errorf("unknown database %q", db)
}

// refill drops and recreates the table (rowactor.Schema's DDL) and fills it, outside the
// timed window.
func (tg *target) refill(ctx context.Context, t rowactor.Table, rows int) error {
	if _, err := tg.create(ctx, t); err != nil {
		return err
	}
	if err := tg.fill(ctx, t.Name, rows); err != nil {
		return err
	}
	if n, err := tg.count(ctx, t.Name); err != nil || n != rows {
		return fmt.Errorf("filled %d rows of %d: %v", n, rows, err)
	}
	return tg.settle(ctx, t.Name)
}

// create drops the table and creates it afresh with the DDL rowactor.Schema renders,
// which it returns.
func (tg *target) create(ctx context.Context, t rowactor.Table) (string, error) {
	ddl, err := rowactor.Schema(tg.d, t)
	if err != nil {
		return "", err
	}
	tg.drop(ctx, t.Name)
	for _, s := range strings.Split(ddl, ";\n") {
		if s = strings.TrimSpace(s); s != "" {
			if err := tg.exec(ctx, s); err != nil {
				return "", fmt.Errorf("%s: %w", s, err)
			}
		}
	}
	return ddl, nil
}

func (tg *target) drop(ctx context.Context, table string) {
	if err := tg.exec(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
		fmt.Fprintf(os.Stderr, "bench: drop %s: %v\n", table, err)
	}
}

func (tg *target) count(ctx context.Context, table string) (int, error) {
	n, err := tg.query(ctx, "SELECT count(*) FROM "+table)
	return int(n), err
}

// insertText renders a multi-row INSERT of n payloads.
func insertText(table string, n int, placeholder func(i int) string) string {
	var b strings.Builder
	b.WriteString("INSERT INTO " + table + " (payload) VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(" + placeholder(i) + ")")
	}
	return b.String()
}

// fillSQL fills a table through database/sql (SQLite, MySQL).
func fillSQL(ctx context.Context, db *sql.DB, table string, rows int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op after Commit
	args := make([]any, 0, fillBatch)
	for left := rows; left > 0; left -= fillBatch {
		n := min(left, fillBatch)
		args = args[:0]
		for range n {
			args = append(args, payload)
		}
		if _, err := tx.ExecContext(ctx, insertText(table, n, func(int) string { return "?" }), args...); err != nil {
			return err
		}
	}
	return tx.Commit()
}

func sqlTarget(name string, d dialects.Dialect, db *sql.DB) *target {
	return &target{
		db: name, d: d,
		exec: func(ctx context.Context, text string) error {
			_, err := db.ExecContext(ctx, text)
			return err
		},
		query: func(ctx context.Context, text string) (n int64, err error) {
			err = db.QueryRowContext(ctx, text).Scan(&n)
			return n, err
		},
		fill: func(ctx context.Context, table string, rows int) error { return fillSQL(ctx, db, table, rows) },
	}
}

// openSQLite opens one pool with sqlite.Open's pragmas (WAL, busy_timeout,
// synchronous=NORMAL) on a file in dir, or in a fresh temporary directory.
func openSQLite(ctx context.Context, dir string) (*target, error) {
	var cleanup func()
	if dir == "" {
		tmp, err := os.MkdirTemp("", "rowactor-bench-")
		if err != nil {
			return nil, err
		}
		dir, cleanup = tmp, func() { os.RemoveAll(tmp) }
	}
	path := filepath.Join(dir, "bench.db")
	d, err := sqlite.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	tg := sqlTarget("sqlite", d, d.DB())
	tg.costs = sqliteCosts
	if err := d.DB().QueryRowContext(ctx, "select sqlite_version()").Scan(&tg.version); err != nil {
		d.Close()
		return nil, err
	}
	tg.version += ", " + path
	// Every drain starts from a checkpointed, truncated WAL.
	tg.settle = func(ctx context.Context, _ string) error { return tg.exec(ctx, "PRAGMA wal_checkpoint(TRUNCATE)") }
	tg.close = func() {
		d.Close()
		if cleanup != nil {
			cleanup()
		}
	}
	return tg, nil
}

// openMySQL opens the pool mysql.Open makes (20 connections, parseTime, loc=UTC).
func openMySQL(ctx context.Context, dsn string) (*target, error) {
	d, err := mysql.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	tg := sqlTarget("mysql", d, d.DB())
	tg.costs = mysqlCosts
	if err := d.DB().QueryRowContext(ctx, "SELECT VERSION()").Scan(&tg.version); err != nil {
		d.Close()
		return nil, err
	}
	tg.version += fmt.Sprintf(", pool of %d", d.DB().Stats().MaxOpenConnections)
	tg.settle = func(context.Context, string) error { return nil }
	tg.close = func() { d.Close() }
	return tg, nil
}

// openPostgres opens the pool postgres.Open would (pgxpool on the URL), with one
// addition: a pgx tracer that counts every statement the pool's connections run, so both
// contenders' statements per message are measured at the driver.
func openPostgres(ctx context.Context, url string) (*target, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	counter := &stmtCounter{}
	pc.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	d := postgres.New(pool)
	tg := &target{db: "postgres", d: d, driverStmts: &counter.n, costs: postgresCosts}
	tg.exec = func(ctx context.Context, text string) error {
		_, err := pool.Exec(ctx, text)
		return err
	}
	tg.query = func(ctx context.Context, text string) (n int64, err error) {
		err = pool.QueryRow(ctx, text).Scan(&n)
		return n, err
	}
	tg.fill = func(ctx context.Context, table string, rows int) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) // a no-op after Commit
		args := make([]any, 0, fillBatch)
		for left := rows; left > 0; left -= fillBatch {
			n := min(left, fillBatch)
			args = args[:0]
			for range n {
				args = append(args, payload)
			}
			text := insertText(table, n, func(i int) string { return "$" + strconv.Itoa(i+1) })
			// Simple protocol: a fill's texts are not worth a prepared statement each.
			if _, err := tx.Exec(ctx, text, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...); err != nil {
				return err
			}
		}
		return tx.Commit(ctx)
	}
	// Every drain starts from a vacuumed, analysed table and a fresh checkpoint.
	tg.settle = func(ctx context.Context, table string) error {
		if err := tg.exec(ctx, "VACUUM (ANALYZE) "+table); err != nil {
			return err
		}
		return tg.exec(ctx, "CHECKPOINT")
	}
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&tg.version); err != nil {
		pool.Close()
		return nil, err
	}
	tg.version += fmt.Sprintf(", pool of %d", pool.Config().MaxConns)
	tg.close = func() {
		d.Close()
		pool.Close()
	}
	return tg, nil
}

// stmtCounter is a pgx tracer counting statements (Query, QueryRow, Exec: BEGIN, COMMIT
// and ROLLBACK included, and each statement of a batch; not the protocol's Parse/Describe
// of a statement's first run on a connection).
type stmtCounter struct{ n atomic.Int64 }

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *stmtCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *stmtCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.n.Add(1)
}

func (c *stmtCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
