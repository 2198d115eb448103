package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// leftRow is a row still in a table at a check.
type leftRow struct {
	id     int64
	group  string
	leased bool // locked_until later than now (lease form)
	// setAside: the lease is dialects.SetAsideUntil, a row the runtime set aside because its
	// data cannot be worked (a poison row, or one whose key function panics): no leak.
	setAside bool
}

// session is a consumer's database session.
type session struct {
	id       int64 // PostgreSQL backend pid, MySQL connection id
	consumer int   // the consumer's number
	inTx     bool  // a transaction is open on it
	state    string
}

// backend is what the parent does on one database: create and drop tables, publish,
// count, kill the consumers' sessions and look for what they left behind.
type backend interface {
	// consumerURL is what consumer n passes to rowactor.Open; poolMax > 0 asks for a pool
	// of that size where the URL can say so (PostgreSQL), params adds URL parameters.
	consumerURL(n, poolMax int, params ...string) string
	exec(ctx context.Context, stmt string) error
	// count is the rows of t still to be worked: in group when t has groups, else all.
	count(ctx context.Context, t rowactor.Table, group string) (int, error)
	// left lists t's rows.
	left(ctx context.Context, t rowactor.Table) ([]leftRow, error)
	// publish inserts one batch in one transaction through PublishTx and returns the ids
	// once the transaction committed.
	publish(ctx context.Context, b *rowactor.Broker, t rowactor.Table, queue string, payloads [][]byte) ([]int64, error)
	canKillSessions() bool
	// sessions lists the sessions of the consumers pids (os pid -> consumer number).
	sessions(ctx context.Context, pids map[int]int) ([]session, error)
	// kill kills sessions and returns how many it killed.
	kill(ctx context.Context, ss []session) (int, error)
	// keysHeld lists the advisory keys of t's rows ids that some session holds
	// (PostgreSQL, MySQL: database-wide; SQLite keeps keys in the process: none).
	keysHeld(ctx context.Context, t rowactor.Table, ids []int64) ([]int64, error)
	// writeLocked reports a write transaction holding the database (SQLite).
	writeLocked(ctx context.Context) (bool, error)
	// hold locks t's rows ids that hold a lease now (at most max of them) from a session
	// of the parent's for d: FOR UPDATE in a READ COMMITTED transaction (PostgreSQL,
	// MySQL: only the rows it returns stay locked), or the whole file with BEGIN IMMEDIATE
	// (SQLite: ids unused, nil returned). It returns the rows locked.
	hold(ctx context.Context, t rowactor.Table, ids []int64, max int, d time.Duration) ([]int64, error)
	// sideCounts reads the deadlock fault's side log (row id -> writes) and the hot
	// counters' sum.
	sideCounts(ctx context.Context, log, hot string) (map[int64]int, int64, error)
	// sideLock locks the hot rows 2 then 1 in one transaction with a pause between.
	sideLock(ctx context.Context, hot string, pause time.Duration) error
	quote(name string) string
	// sideDDL is the deadlock fault's side tables.
	sideDDL(log, hot string) []string
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
// never subscribes).
func newBackend(db, url string, b *rowactor.Broker, workers int) (backend, error) {
	switch d := b.Dialect().(type) {
	case *postgres.Dialect:
		// Consumers mark their sessions with an application name of this run's own and
		// their number, so killing them never touches anybody else's (nor the parent's)
		// sessions, and each session is known by its consumer.
		return &pgBackend{pool: d.Pool(), url: url, app: fmt.Sprintf("rowactor-chaos-%d-", os.Getpid()), workers: workers}, nil
	case *mysql.Dialect:
		var name string
		if err := d.DB().QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
			return nil, err
		}
		return &myBackend{db: d.DB(), url: url, dbName: name}, nil
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

// leaseSelect reads t's rows: id, group (empty without groups), locked_until (NULL outside
// the lease form).
func leaseSelect(q func(string) string, t rowactor.Table) string {
	cols := q(t.ID)
	if t.Group != "" {
		cols += ", " + q(t.Group)
	} else {
		cols += ", ''"
	}
	if t.LockedUntil != "" {
		cols += ", " + q(t.LockedUntil)
	} else {
		cols += ", NULL"
	}
	return "SELECT " + cols + " FROM " + q(t.Name) + " ORDER BY " + q(t.ID)
}

// ---- PostgreSQL

type pgBackend struct {
	pool    *pgxpool.Pool
	url     string
	app     string // prefix; consumer n's sessions are app + n
	workers int
}

func (p *pgBackend) consumerURL(n, poolMax int, params ...string) string {
	cu := withParam(p.url, "application_name", fmt.Sprintf("%s%d", p.app, n))
	if poolMax <= 0 {
		// Row lock and advisory hold a connection per row in work: Workers(n) needs n+1.
		poolMax = p.workers + 2
	}
	cu = withParam(cu, "pool_max_conns", fmt.Sprint(poolMax))
	for i := 0; i+1 < len(params); i += 2 {
		cu = withParam(cu, params[i], params[i+1])
	}
	return cu
}

func (p *pgBackend) canKillSessions() bool    { return true }
func (p *pgBackend) quote(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

func (p *pgBackend) exec(ctx context.Context, stmt string) error {
	_, err := p.pool.Exec(ctx, stmt)
	return err
}

func (p *pgBackend) count(ctx context.Context, t rowactor.Table, group string) (int, error) {
	var n int
	if t.Group != "" {
		err := p.pool.QueryRow(ctx, "SELECT count(*) FROM "+p.quote(t.Name)+" WHERE "+p.quote(t.Group)+" = $1", group).Scan(&n)
		return n, err
	}
	err := p.pool.QueryRow(ctx, "SELECT count(*) FROM "+p.quote(t.Name)).Scan(&n)
	return n, err
}

func (p *pgBackend) left(ctx context.Context, t rowactor.Table) ([]leftRow, error) {
	rows, err := p.pool.Query(ctx, leaseSelect(p.quote, t))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	nowT := time.Now()
	var out []leftRow
	for rows.Next() {
		var (
			r  leftRow
			lu *time.Time
		)
		if err := rows.Scan(&r.id, &r.group, &lu); err != nil {
			return nil, err
		}
		r.leased = lu != nil && lu.After(nowT)
		r.setAside = lu != nil && !lu.Before(dialects.SetAsideUntil)
		out = append(out, r)
	}
	return out, rows.Err()
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

func (p *pgBackend) sessions(ctx context.Context, pids map[int]int) ([]session, error) {
	rows, err := p.pool.Query(ctx, "SELECT pid, application_name, coalesce(state, ''), xact_start IS NOT NULL FROM pg_stat_activity WHERE application_name LIKE $1 AND pid <> pg_backend_pid()", p.app+"%")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	want := map[int]bool{}
	for _, n := range pids {
		want[n] = true
	}
	var out []session
	for rows.Next() {
		var (
			s   session
			app string
			pid int32
		)
		if err := rows.Scan(&pid, &app, &s.state, &s.inTx); err != nil {
			return nil, err
		}
		s.id = int64(pid)
		if _, err := fmt.Sscanf(strings.TrimPrefix(app, p.app), "%d", &s.consumer); err != nil || !want[s.consumer] {
			continue
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

func (p *pgBackend) kill(ctx context.Context, ss []session) (int, error) {
	killed := 0
	for _, s := range ss {
		var ok bool
		if err := p.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int32(s.id)).Scan(&ok); err != nil {
			return killed, err
		}
		if ok {
			killed++
		}
	}
	return killed, nil
}

func (p *pgBackend) keysHeld(ctx context.Context, t rowactor.Table, ids []int64) ([]int64, error) {
	if t.AdvisoryKey == "" || len(ids) == 0 {
		return nil, nil
	}
	prefix := strings.TrimSuffix(t.AdvisoryKey, "{id}")
	const heldKeys = "SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks AS l" +
		" WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock'" +
		" AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
	rows, err := p.pool.Query(ctx, "SELECT i FROM unnest($2::bigint[]) AS i WHERE hashtextextended($1 || i::text, 0) IN ("+heldKeys+")", prefix, ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

func (p *pgBackend) writeLocked(context.Context) (bool, error) { return false, nil }

func (p *pgBackend) hold(ctx context.Context, t rowactor.Table, ids []int64, max int, d time.Duration) ([]int64, error) {
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the hold ends by rolling back
	rows, err := tx.Query(ctx, "SELECT "+p.quote(t.ID)+" FROM "+p.quote(t.Name)+" WHERE "+p.quote(t.ID)+" = ANY($1) AND "+
		p.quote(t.LockedUntil)+" > $2 ORDER BY random() LIMIT $3 FOR UPDATE SKIP LOCKED", ids, time.Now(), max)
	if err != nil {
		return nil, err
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(got) == 0 {
		return nil, err
	}
	sleepCtx(ctx, d)
	return got, nil
}

func (p *pgBackend) sideDDL(log, hot string) []string {
	return []string{
		"CREATE TABLE " + log + " (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, row_id bigint NOT NULL, n int NOT NULL, consumer int NOT NULL)",
		"CREATE TABLE " + hot + " (k int PRIMARY KEY, v bigint NOT NULL)",
		"INSERT INTO " + hot + " (k, v) VALUES (1, 0), (2, 0)",
	}
}

func (p *pgBackend) sideCounts(ctx context.Context, log, hot string) (map[int64]int, int64, error) {
	return sideCountsSQL(ctx, func(ctx context.Context, q string) (rowsScanner, error) {
		r, err := p.pool.Query(ctx, q)
		return pgRows{r}, err
	}, log, hot)
}

func (p *pgBackend) sideLock(ctx context.Context, hot string, pause time.Duration) error {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "SET LOCAL deadlock_timeout = '50ms'"); err != nil {
		return err
	}
	for i, k := range []int{2, 1} {
		if i > 0 {
			sleepCtx(ctx, pause)
		}
		if _, err := tx.Exec(ctx, "SELECT v FROM "+hot+" WHERE k = $1 FOR UPDATE", k); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

type pgRows struct{ pgx.Rows }

func (r pgRows) Close() error { r.Rows.Close(); return nil }

// ---- MySQL / MariaDB

type myBackend struct {
	db     *sql.DB
	url    string
	dbName string
}

func (m *myBackend) consumerURL(_, _ int, _ ...string) string { return m.url }
func (m *myBackend) canKillSessions() bool                    { return true }
func (m *myBackend) quote(name string) string                 { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

func (m *myBackend) exec(ctx context.Context, stmt string) error {
	_, err := m.db.ExecContext(ctx, stmt)
	return err
}

func (m *myBackend) count(ctx context.Context, t rowactor.Table, group string) (int, error) {
	return sqlCount(ctx, m.db, m.quote, t, group)
}

func (m *myBackend) left(ctx context.Context, t rowactor.Table) ([]leftRow, error) {
	return sqlLeft(ctx, m.db, m.quote, t, func(v any) (time.Time, bool) {
		nt, ok := v.(time.Time)
		return nt, ok
	})
}

func (m *myBackend) publish(ctx context.Context, b *rowactor.Broker, t rowactor.Table, queue string, payloads [][]byte) ([]int64, error) {
	return sqlPublish(ctx, m.db, b, t, queue, payloads)
}

// sessions finds the sessions whose client end is a socket of a live consumer process:
// the server's PROCESSLIST shows each session's client address, and the consumers'
// sockets and their local ports are in /proc. Sessions of other programs on the same
// server and database (other people's tests, the parent's own pool) are never touched.
// (MariaDB without performance_schema shows no connection attributes, so sessions cannot
// be told apart by a program name as on PostgreSQL.)
func (m *myBackend) sessions(ctx context.Context, pids map[int]int) ([]session, error) {
	var list []int
	for pid := range pids {
		list = append(list, pid)
	}
	ports, err := clientPorts(list)
	if err != nil {
		return nil, err
	}
	inTx := map[int64]bool{}
	trx, err := m.db.QueryContext(ctx, "SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX")
	if err != nil {
		return nil, err
	}
	for trx.Next() {
		var id int64
		if err := trx.Scan(&id); err != nil {
			trx.Close()
			return nil, err
		}
		inTx[id] = true
	}
	if err := trx.Close(); err != nil {
		return nil, err
	}
	rows, err := m.db.QueryContext(ctx, "SELECT ID, HOST, COMMAND FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []session
	for rows.Next() {
		var (
			s    session
			host string
		)
		if err := rows.Scan(&s.id, &host, &s.state); err != nil {
			return nil, err
		}
		i := strings.LastIndex(host, ":")
		if i < 0 {
			continue // a Unix socket or a system thread
		}
		var port int
		if _, err := fmt.Sscanf(host[i+1:], "%d", &port); err != nil {
			continue
		}
		pid, ok := ports[port]
		if !ok {
			continue
		}
		s.consumer = pids[pid]
		s.inTx = inTx[s.id]
		out = append(out, s)
	}
	return out, rows.Err()
}

func (m *myBackend) kill(ctx context.Context, ss []session) (int, error) {
	killed := 0
	for _, s := range ss {
		if _, err := m.db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", s.id)); err != nil {
			if strings.Contains(err.Error(), "Unknown thread id") {
				continue // it ended on its own meanwhile
			}
			return killed, err
		}
		killed++
	}
	return killed, nil
}

// keysHeld asks IS_USED_LOCK of every id's GET_LOCK name in one statement (the names
// travel as a JSON array: MariaDB has no metadata_lock_info here).
func (m *myBackend) keysHeld(ctx context.Context, t rowactor.Table, ids []int64) ([]int64, error) {
	if t.AdvisoryKey == "" || len(ids) == 0 {
		return nil, nil
	}
	prefix := strings.TrimSuffix(t.AdvisoryKey, "{id}")
	type entry struct {
		ID   int64  `json:"id"`
		Name string `json:"name"`
	}
	list := make([]entry, len(ids))
	for i, id := range ids {
		list[i] = entry{id, mysql.LockName(m.dbName, fmt.Sprintf("%s%d", prefix, id))}
	}
	js, err := json.Marshal(list)
	if err != nil {
		return nil, err
	}
	rows, err := m.db.QueryContext(ctx, "SELECT j.id FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$.id', name VARCHAR(200) PATH '$.name')) AS j WHERE IS_USED_LOCK(j.name) IS NOT NULL", string(js))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var held []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		held = append(held, id)
	}
	return held, rows.Err()
}

func (m *myBackend) writeLocked(context.Context) (bool, error) { return false, nil }

func (m *myBackend) hold(ctx context.Context, t rowactor.Table, ids []int64, max int, d time.Duration) ([]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	// READ COMMITTED: at REPEATABLE READ InnoDB would keep every row the read examined
	// locked, not only those it returned.
	tx, err := m.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // the hold ends by rolling back
	in := make([]string, len(ids))
	for i, id := range ids {
		in[i] = fmt.Sprint(id)
	}
	got, err := sqlIDs(ctx, tx, "SELECT "+m.quote(t.ID)+" FROM "+m.quote(t.Name)+" WHERE "+m.quote(t.ID)+" IN ("+strings.Join(in, ",")+") AND "+
		m.quote(t.LockedUntil)+" > ? ORDER BY RAND() LIMIT "+fmt.Sprint(max)+" FOR UPDATE SKIP LOCKED", time.Now().UTC())
	if err != nil || len(got) == 0 {
		return nil, err
	}
	sleepCtx(ctx, d)
	return got, nil
}

func (m *myBackend) sideDDL(log, hot string) []string {
	return []string{
		"CREATE TABLE " + log + " (seq BIGINT AUTO_INCREMENT PRIMARY KEY, row_id BIGINT NOT NULL, n INT NOT NULL, consumer INT NOT NULL) ENGINE=InnoDB",
		"CREATE TABLE " + hot + " (k INT PRIMARY KEY, v BIGINT NOT NULL) ENGINE=InnoDB",
		"INSERT INTO " + hot + " (k, v) VALUES (1, 0), (2, 0)",
	}
}

func (m *myBackend) sideCounts(ctx context.Context, log, hot string) (map[int64]int, int64, error) {
	return sideCountsSQL(ctx, func(ctx context.Context, q string) (rowsScanner, error) {
		return m.db.QueryContext(ctx, q)
	}, log, hot)
}

func (m *myBackend) sideLock(ctx context.Context, hot string, pause time.Duration) error {
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	for i, k := range []int{2, 1} {
		if i > 0 {
			sleepCtx(ctx, pause)
		}
		var v int64
		if err := tx.QueryRowContext(ctx, "SELECT v FROM "+hot+" WHERE k = ? FOR UPDATE", k).Scan(&v); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// ---- SQLite

type liteBackend struct {
	db  *sql.DB
	url string
}

func (l *liteBackend) consumerURL(_, _ int, _ ...string) string { return l.url }
func (l *liteBackend) canKillSessions() bool                    { return false }
func (l *liteBackend) quote(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

func (l *liteBackend) exec(ctx context.Context, stmt string) error {
	_, err := l.db.ExecContext(ctx, stmt)
	return err
}

func (l *liteBackend) count(ctx context.Context, t rowactor.Table, group string) (int, error) {
	return sqlCount(ctx, l.db, l.quote, t, group)
}

func (l *liteBackend) left(ctx context.Context, t rowactor.Table) ([]leftRow, error) {
	return sqlLeft(ctx, l.db, l.quote, t, func(v any) (time.Time, bool) {
		var s string
		switch x := v.(type) {
		case string:
			s = x
		case []byte:
			s = string(x)
		default:
			return time.Time{}, false
		}
		tm, err := time.Parse(sqlite.TimeLayout, s)
		return tm, err == nil
	})
}

func (l *liteBackend) publish(ctx context.Context, b *rowactor.Broker, t rowactor.Table, queue string, payloads [][]byte) ([]int64, error) {
	return sqlPublish(ctx, l.db, b, t, queue, payloads)
}

func (l *liteBackend) sessions(context.Context, map[int]int) ([]session, error) { return nil, nil }

func (l *liteBackend) kill(context.Context, []session) (int, error) {
	return 0, errors.New("sqlite: no sessions to kill")
}

func (l *liteBackend) keysHeld(context.Context, rowactor.Table, []int64) ([]int64, error) {
	return nil, nil
}

// writeLocked tries BEGIN IMMEDIATE with a short busy timeout on a connection of its own.
func (l *liteBackend) writeLocked(ctx context.Context) (bool, error) {
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "PRAGMA busy_timeout = 500"); err != nil {
		return false, err
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "PRAGMA busy_timeout = 10000") //nolint:errcheck // restores the pool's default
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return true, nil
	}
	_, err = conn.ExecContext(ctx, "ROLLBACK")
	return false, err
}

// hold takes SQLite's write lock (BEGIN IMMEDIATE) for d: every claim, extension and
// settlement waits on its busy timeout meanwhile.
func (l *liteBackend) hold(ctx context.Context, _ rowactor.Table, _ []int64, _ int, d time.Duration) ([]int64, error) {
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return nil, err
	}
	sleepCtx(ctx, d)
	_, err = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
	return nil, err
}

func (l *liteBackend) sideDDL(string, string) []string { return nil }

func (l *liteBackend) sideCounts(context.Context, string, string) (map[int64]int, int64, error) {
	return nil, 0, errors.New("sqlite: no deadlock fault")
}

func (l *liteBackend) sideLock(context.Context, string, time.Duration) error {
	return errors.New("sqlite: no deadlock fault")
}

// ---- shared

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func sqlIDs(ctx context.Context, db querier, query string, args ...any) ([]int64, error) {
	rows, err := db.QueryContext(ctx, query, args...)
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

func sqlCount(ctx context.Context, db *sql.DB, q func(string) string, t rowactor.Table, group string) (int, error) {
	var n int
	if t.Group != "" {
		err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+q(t.Name)+" WHERE "+q(t.Group)+" = ?", group).Scan(&n)
		return n, err
	}
	err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+q(t.Name)).Scan(&n)
	return n, err
}

func sqlLeft(ctx context.Context, db *sql.DB, q func(string) string, t rowactor.Table, parse func(any) (time.Time, bool)) ([]leftRow, error) {
	rows, err := db.QueryContext(ctx, leaseSelect(q, t))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	nowT := time.Now()
	var out []leftRow
	for rows.Next() {
		var (
			r  leftRow
			g  sql.NullString
			lu any
		)
		if err := rows.Scan(&r.id, &g, &lu); err != nil {
			return nil, err
		}
		r.group = g.String
		if tm, ok := parse(lu); ok {
			r.leased = tm.After(nowT)
			r.setAside = !tm.Before(dialects.SetAsideUntil)
		}
		out = append(out, r)
	}
	return out, rows.Err()
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

type rowsScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

func sideCountsSQL(ctx context.Context, query func(context.Context, string) (rowsScanner, error), log, hot string) (map[int64]int, int64, error) {
	rows, err := query(ctx, "SELECT row_id, count(*) FROM "+log+" GROUP BY row_id")
	if err != nil {
		return nil, 0, err
	}
	counts := map[int64]int{}
	for rows.Next() {
		var (
			id int64
			n  int
		)
		if err := rows.Scan(&id, &n); err != nil {
			rows.Close()
			return nil, 0, err
		}
		counts[id] = n
	}
	if err := rows.Err(); err != nil {
		rows.Close()
		return nil, 0, err
	}
	rows.Close()
	rows, err = query(ctx, "SELECT v FROM "+hot)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var sum int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, 0, err
		}
		sum += v
	}
	return counts, sum, rows.Err()
}

// choose returns all of xs, or a random half of them (at least one).
func choose[T any](rng *rand.Rand, xs []T, all bool) []T {
	if all || len(xs) <= 1 {
		return xs
	}
	rng.Shuffle(len(xs), func(i, j int) { xs[i], xs[j] = xs[j], xs[i] })
	return xs[:max(1, len(xs)/2)]
}
