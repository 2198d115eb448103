package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// backend is what the parent does on one database: create and drop the table, publish,
// count, and kill the consumers' sessions.
type backend interface {
	// consumerURL is what a consumer passes to rowactor.Open.
	consumerURL() string
	exec(ctx context.Context, stmt string) error
	count(ctx context.Context, table string) (int, error)
	remaining(ctx context.Context, table string) ([]int64, error)
	// publish inserts one batch in one transaction through PublishTx and returns the ids
	// once the transaction committed.
	publish(ctx context.Context, b *rowactor.Broker, t rowactor.Table, queue string, payloads [][]byte) ([]int64, error)
	// killSessions kills the consumers' sessions: all of them, or a random half (at least
	// one). pids are the live consumer processes. It returns how many it killed.
	killSessions(ctx context.Context, rng *rand.Rand, pids []int, all bool) (int, error)
	// canKillSessions is false where there are no sessions to kill (SQLite).
	canKillSessions() bool
	quote(name string) string
}

// defaultURL is the URL rowactor.Open takes for a database: -dsn, else the environment
// the test suite reads, else the local server (SQLite: a file in the scenario's directory).
func defaultURL(db, dsn, dir string) string {
	switch db {
	case "postgres":
		if dsn == "" {
			dsn = os.Getenv("ROWACTOR_POSTGRES_URL")
		}
		if dsn == "" {
			dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
		}
		return dsn
	case "mysql":
		if dsn == "" {
			dsn = os.Getenv("ROWACTOR_MYSQL_DSN")
		}
		if dsn == "" {
			dsn = "root@tcp(127.0.0.1:3306)/test"
		}
		if !strings.HasPrefix(dsn, "mysql://") {
			dsn = "mysql://" + dsn
		}
		return dsn
	default:
		if dsn == "" {
			return "sqlite:" + filepath.Join(dir, "chaos.db")
		}
		if !strings.HasPrefix(dsn, "sqlite:") {
			dsn = "sqlite:" + dsn
		}
		return dsn
	}
}

// newBackend reaches the pool behind the parent's broker (opened on url, poll only: it
// never subscribes) and derives the consumers' URL.
func newBackend(db, url string, b *rowactor.Broker, workers int) (backend, error) {
	switch d := b.Dialect().(type) {
	case *postgres.Dialect:
		// Consumers mark their sessions with an application name of this run's own, so
		// killing them never touches anybody else's (nor the parent's) sessions.
		app := fmt.Sprintf("rowactor-chaos-%d", os.Getpid())
		cu := withParam(url, "application_name", app)
		// Row lock and advisory hold a connection per row in work: Workers(n) needs n+1.
		cu = withParam(cu, "pool_max_conns", fmt.Sprint(workers+2))
		return &pgBackend{pool: d.Pool(), url: cu, app: app}, nil
	case *mysql.Dialect:
		return &myBackend{db: d.DB(), url: url}, nil
	case *sqlite.Dialect:
		return &liteBackend{db: d.DB(), url: url}, nil
	default:
		return nil, fmt.Errorf("%s: unknown dialect %T", db, d)
	}
}

// withParam adds key=value to a URL's query unless the URL sets key already.
func withParam(url, key, value string) string {
	if strings.Contains(url, key+"=") {
		return url
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + key + "=" + value
}

// ---- PostgreSQL

type pgBackend struct {
	pool *pgxpool.Pool
	url  string
	app  string
}

func (p *pgBackend) consumerURL() string      { return p.url }
func (p *pgBackend) canKillSessions() bool    { return true }
func (p *pgBackend) quote(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

func (p *pgBackend) exec(ctx context.Context, stmt string) error {
	_, err := p.pool.Exec(ctx, stmt)
	return err
}

func (p *pgBackend) count(ctx context.Context, table string) (int, error) {
	var n int
	err := p.pool.QueryRow(ctx, "SELECT count(*) FROM "+p.quote(table)).Scan(&n)
	return n, err
}

func (p *pgBackend) remaining(ctx context.Context, table string) ([]int64, error) {
	rows, err := p.pool.Query(ctx, "SELECT id FROM "+p.quote(table)+" ORDER BY id")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

func (p *pgBackend) publish(ctx context.Context, b *rowactor.Broker, t rowactor.Table, queue string, payloads [][]byte) ([]int64, error) {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	ids := make([]int64, 0, len(payloads))
	for _, pl := range payloads {
		id, err := b.PublishTx(ctx, tx, t, queue, pl)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return ids, nil
}

func (p *pgBackend) killSessions(ctx context.Context, rng *rand.Rand, _ []int, all bool) (int, error) {
	rows, err := p.pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()", p.app)
	if err != nil {
		return 0, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, err
	}
	victims := choose(rng, pids, all)
	killed := 0
	for _, pid := range victims {
		var ok bool
		if err := p.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil {
			return killed, err
		}
		if ok {
			killed++
		}
	}
	return killed, nil
}

// ---- MySQL / MariaDB

type myBackend struct {
	db  *sql.DB
	url string
}

func (m *myBackend) consumerURL() string      { return m.url }
func (m *myBackend) canKillSessions() bool    { return true }
func (m *myBackend) quote(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

func (m *myBackend) exec(ctx context.Context, stmt string) error {
	_, err := m.db.ExecContext(ctx, stmt)
	return err
}

func (m *myBackend) count(ctx context.Context, table string) (int, error) {
	var n int
	err := m.db.QueryRowContext(ctx, "SELECT count(*) FROM "+m.quote(table)).Scan(&n)
	return n, err
}

func (m *myBackend) remaining(ctx context.Context, table string) ([]int64, error) {
	return sqlIDs(ctx, m.db, "SELECT id FROM "+m.quote(table)+" ORDER BY id")
}

func (m *myBackend) publish(ctx context.Context, b *rowactor.Broker, t rowactor.Table, queue string, payloads [][]byte) ([]int64, error) {
	return sqlPublish(ctx, m.db, b, t, queue, payloads)
}

// killSessions kills the sessions whose client end is a socket of a live consumer
// process: the server's PROCESSLIST shows each session's client address, and the
// consumers' sockets and their local ports are in /proc. Sessions of other programs on the
// same server and database (other people's tests, the parent's own pool) are never
// touched. (MariaDB without performance_schema shows no connection attributes, so
// sessions cannot be told apart by a program name as on PostgreSQL.)
func (m *myBackend) killSessions(ctx context.Context, rng *rand.Rand, pids []int, all bool) (int, error) {
	ports, err := clientPorts(pids)
	if err != nil {
		return 0, err
	}
	rows, err := m.db.QueryContext(ctx, "SELECT ID, HOST FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()")
	if err != nil {
		return 0, err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		var host string
		if err := rows.Scan(&id, &host); err != nil {
			rows.Close()
			return 0, err
		}
		i := strings.LastIndex(host, ":")
		if i < 0 {
			continue // a Unix socket or a system thread
		}
		var port int
		if _, err := fmt.Sscanf(host[i+1:], "%d", &port); err == nil && ports[port] {
			ids = append(ids, id)
		}
	}
	if err := rows.Close(); err != nil {
		return 0, err
	}
	killed := 0
	for _, id := range choose(rng, ids, all) {
		if _, err := m.db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
			if strings.Contains(err.Error(), "Unknown thread id") {
				continue // it ended on its own meanwhile
			}
			return killed, err
		}
		killed++
	}
	return killed, nil
}

// ---- SQLite

type liteBackend struct {
	db  *sql.DB
	url string
}

func (l *liteBackend) consumerURL() string   { return l.url }
func (l *liteBackend) canKillSessions() bool { return false }
func (l *liteBackend) quote(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

func (l *liteBackend) exec(ctx context.Context, stmt string) error {
	_, err := l.db.ExecContext(ctx, stmt)
	return err
}

func (l *liteBackend) count(ctx context.Context, table string) (int, error) {
	var n int
	err := l.db.QueryRowContext(ctx, "SELECT count(*) FROM "+l.quote(table)).Scan(&n)
	return n, err
}

func (l *liteBackend) remaining(ctx context.Context, table string) ([]int64, error) {
	return sqlIDs(ctx, l.db, "SELECT id FROM "+l.quote(table)+" ORDER BY id")
}

func (l *liteBackend) publish(ctx context.Context, b *rowactor.Broker, t rowactor.Table, queue string, payloads [][]byte) ([]int64, error) {
	return sqlPublish(ctx, l.db, b, t, queue, payloads)
}

func (l *liteBackend) killSessions(context.Context, *rand.Rand, []int, bool) (int, error) {
	return 0, errors.New("sqlite: no sessions to kill")
}

// ---- shared

func sqlIDs(ctx context.Context, db *sql.DB, query string) ([]int64, error) {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

func sqlPublish(ctx context.Context, db *sql.DB, b *rowactor.Broker, t rowactor.Table, queue string, payloads [][]byte) ([]int64, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	ids := make([]int64, 0, len(payloads))
	for _, pl := range payloads {
		id, err := b.PublishTx(ctx, tx, t, queue, pl)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	b.Wake(t, queue) // wakes this process's subscriptions only: the consumers poll
	return ids, nil
}

// choose returns all of xs, or a random half of them (at least one).
func choose[T any](rng *rand.Rand, xs []T, all bool) []T {
	if all || len(xs) <= 1 {
		return xs
	}
	rng.Shuffle(len(xs), func(i, j int) { xs[i], xs[j] = xs[j], xs[i] })
	return xs[:max(1, len(xs)/2)]
}
