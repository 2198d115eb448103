package rowactor_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
)

// The fault tests break what a broker stands on (its server sessions, its pool, its
// lease renewer) in the middle of deliveries, and then count every row by id: each row
// is acked once, or comes back by its form's rule; none is lost; none is settled twice.
//
// Every fault is aimed at the broker under test alone. Its dialect is a victim: a pool of
// its own whose server sessions the test can tell from everybody else's (PostgreSQL: an
// application_name of its own; MariaDB: the CONNECTION_ID() of every connection the pool
// opened, recorded as it opens them). The test reads and inspects through h.d, another
// pool, so killing the victim's sessions never touches the test's own connection or any
// other test's, and the tests run in parallel.

// victim is the pool of the broker a fault test breaks.
type victim struct {
	h *harness
	d dialects.Dialect
	// app is the victim's application_name (PostgreSQL).
	app string
	// conns records the victim's connection ids (MySQL/MariaDB).
	conns *connRecorder
}

// newVictim opens the victim pool on the harness's database. Its Close is registered
// before any broker on it, so it runs after their Shutdown.
func newVictim(t *testing.T, h *harness) *victim {
	t.Helper()
	v := &victim{h: h}
	switch h.drv.name {
	case "postgres":
		v.app = "rowactor_fault_" + h.table.Name
		url := postgresURL() + "&application_name=" + v.app
		d, err := postgres.Open(context.Background(), url)
		if err != nil {
			t.Fatalf("postgres.Open: PostgreSQL is unreachable at %s: %v", url, err)
		}
		t.Cleanup(func() {
			done := make(chan struct{})
			go func() { _ = d.Close(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Errorf("postgres: closing the victim pool waited 15 s for a connection never released")
			}
		})
		v.d = d
	case "mysql":
		cfg, err := gomysql.ParseDSN(mysqlDSN())
		if err != nil {
			t.Fatal(err)
		}
		cfg.ParseTime = true
		if cfg.Loc == nil {
			cfg.Loc = time.UTC
		}
		conn, err := gomysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		v.conns = &connRecorder{Connector: conn, ids: map[int64]bool{}}
		db := sql.OpenDB(v.conns)
		db.SetMaxOpenConns(mysql.OpenPoolSize)
		db.SetMaxIdleConns(mysql.OpenPoolSize)
		if err := db.Ping(); err != nil {
			t.Fatalf("mysql: the server at ROWACTOR_MYSQL_DSN must be up: %v", err)
		}
		d := mysql.New(db)
		t.Cleanup(func() { _ = d.Close(); _ = db.Close() })
		v.d = d
	case "sqlite":
		// No server session to kill; the pool is only ever exhausted (TestStalledRenewer),
		// which needs a bound.
		v.d = h.newD()
		sqliteDB(v.d).SetMaxOpenConns(4)
	default:
		t.Fatalf("no victim pool for the %s driver", h.drv.name)
	}
	return v
}

// connRecorder is a go-sql-driver connector that records the server's id of every
// connection it opens, so the test can find its pool's sessions in PROCESSLIST.
type connRecorder struct {
	sqldriver.Connector
	mu  sync.Mutex
	ids map[int64]bool
}

func (r *connRecorder) Connect(ctx context.Context) (sqldriver.Conn, error) {
	c, err := r.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	id, err := connectionID(ctx, c)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	r.mu.Lock()
	r.ids[id] = true
	r.mu.Unlock()
	return c, nil
}

func (r *connRecorder) has(id int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ids[id]
}

func connectionID(ctx context.Context, c sqldriver.Conn) (int64, error) {
	q, ok := c.(sqldriver.QueryerContext)
	if !ok {
		return 0, errors.New("the mysql driver's connection cannot query")
	}
	rows, err := q.QueryContext(ctx, "SELECT CONNECTION_ID()", nil)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	dest := make([]sqldriver.Value, 1)
	if err := rows.Next(dest); err != nil {
		return 0, err
	}
	switch v := dest[0].(type) {
	case int64:
		return v, nil
	case uint64:
		return int64(v), nil
	case []byte:
		return strconv.ParseInt(string(v), 10, 64)
	}
	return 0, fmt.Errorf("CONNECTION_ID() returned %T", dest[0])
}

// sessions returns the server ids of the victim pool's live sessions.
func (v *victim) sessions(ctx context.Context) ([]int64, error) {
	switch v.h.drv.name {
	case "postgres":
		rows, err := pgPool(v.h.d).Query(ctx, "SELECT pid::bigint FROM pg_stat_activity WHERE application_name = $1", v.app)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return nil, err
			}
			out = append(out, id)
		}
		return out, rows.Err()
	case "mysql":
		rows, err := mysqlDB(v.h.d).QueryContext(ctx, "SELECT ID FROM information_schema.PROCESSLIST")
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return nil, err
			}
			if v.conns.has(id) {
				out = append(out, id)
			}
		}
		return out, rows.Err()
	}
	return nil, fmt.Errorf("%s has no server sessions", v.h.drv.name)
}

// kill ends one of the victim's sessions from the test's own connection and waits until
// the server has let it go. It refuses a session that is not the victim's.
func (v *victim) kill(ctx context.Context, id int64) error {
	switch v.h.drv.name {
	case "postgres":
		pool := pgPool(v.h.d)
		// One statement checks the owner and kills, so a pid reused meanwhile is spared.
		// The kill sits in the select list behind a CASE: a WHERE may be evaluated in any
		// order, and would then kill before it checks.
		var killed *bool
		err := pool.QueryRow(ctx, `SELECT CASE WHEN application_name = $2 THEN pg_terminate_backend(pid) END
			FROM pg_stat_activity WHERE pid = $1`, id, v.app).Scan(&killed)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // gone already
		}
		if err != nil {
			return fmt.Errorf("pg_terminate_backend(%d): %w", id, err)
		}
		if killed == nil || !*killed {
			return fmt.Errorf("backend %d is not a live session of the victim pool %s", id, v.app)
		}
		return waitGone(ctx, func() (bool, error) {
			var alive bool
			err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", id).Scan(&alive)
			return !alive, err
		})
	case "mysql":
		if !v.conns.has(id) {
			return fmt.Errorf("connection %d is not the victim pool's", id)
		}
		db := mysqlDB(v.h.d)
		if _, err := db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
			var me *gomysql.MySQLError
			if !errors.As(err, &me) || me.Number != 1094 { // 1094: unknown thread id, gone already
				return fmt.Errorf("KILL %d: %w", id, err)
			}
		}
		return waitGone(ctx, func() (bool, error) {
			var n int
			err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", id).Scan(&n)
			return n == 0, err
		})
	}
	return fmt.Errorf("%s has no server sessions to kill", v.h.drv.name)
}

func waitGone(ctx context.Context, gone func() (bool, error)) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		ok, err := gone()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return errors.New("the killed session is still there after 5 s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// keyHolder returns the victim session that holds an advisory key.
//
// PostgreSQL: the backend pg_locks shows holding the key's 64-bit hash exclusively (the
// claims' probes take it shared, for a moment). MariaDB: IS_USED_LOCK of the key's lock
// name, which is the holder's connection id.
func (v *victim) keyHolder(ctx context.Context, key string) (int64, error) {
	switch v.h.drv.name {
	case "postgres":
		var pid int64
		err := pgPool(v.h.d).QueryRow(ctx, `SELECT l.pid::bigint FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock'
			  AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended($1, 0) AND a.application_name = $2`,
			key, v.app).Scan(&pid)
		if err != nil {
			return 0, fmt.Errorf("the holder of key %q: %w", key, err)
		}
		return pid, nil
	case "mysql":
		db := mysqlDB(v.h.d)
		var name string
		if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name); err != nil {
			return 0, err
		}
		var holder sql.NullInt64
		if err := db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", mysql.LockName(name, key)).Scan(&holder); err != nil {
			return 0, err
		}
		if !holder.Valid {
			return 0, fmt.Errorf("nobody holds key %q", key)
		}
		return holder.Int64, nil
	}
	return 0, fmt.Errorf("%s keeps keys in the process", v.h.drv.name)
}

// rowHolder returns the victim session whose open transaction holds a row under FOR
// UPDATE. done must be called once the holder was killed.
//
// PostgreSQL: a row locked FOR UPDATE by one transaction carries that transaction's id in
// its xmax, and pg_stat_activity shows each backend's xid: the backend whose backend_xid
// is the row's xmax holds it. MariaDB shows no granted row locks, only waits: a probe
// transaction of the test's asks for the same row FOR UPDATE and waits, and
// INNODB_LOCK_WAITS names the transaction it waits for, whose thread is the holder. The
// probe gets the row once the holder dies; done rolls it back at once.
func (v *victim) rowHolder(ctx context.Context, id int64) (holder int64, done func() error, err error) {
	noop := func() error { return nil }
	switch v.h.drv.name {
	case "postgres":
		err := pgPool(v.h.d).QueryRow(ctx, `SELECT pid::bigint FROM pg_stat_activity
			WHERE application_name = $2 AND backend_xid = (SELECT xmax FROM `+pgQuote(v.h.table.Name)+` WHERE id = $1)`,
			id, v.app).Scan(&holder)
		if err != nil {
			return 0, nil, fmt.Errorf("the holder of row %d: %w", id, err)
		}
		return holder, noop, nil
	case "mysql":
		db := mysqlDB(v.h.d)
		conn, err := db.Conn(ctx)
		if err != nil {
			return 0, nil, err
		}
		var probe int64
		if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&probe); err != nil {
			conn.Close()
			return 0, nil, err
		}
		if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 10"); err != nil {
			conn.Close()
			return 0, nil, err
		}
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			conn.Close()
			return 0, nil, err
		}
		waited := make(chan error, 1)
		go func() {
			var got int64
			waited <- tx.QueryRowContext(ctx, "SELECT id FROM `"+v.h.table.Name+"` WHERE id = ? FOR UPDATE", id).Scan(&got)
		}()
		finish := func() error {
			err := <-waited
			if errors.Is(err, sql.ErrNoRows) {
				err = nil // the row was settled meanwhile
			}
			return errors.Join(err, tx.Rollback(), conn.Close())
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			holders, err := mysqlLockWaits(ctx, db, "r.trx_mysql_thread_id = ?", probe)
			if err != nil {
				return 0, nil, errors.Join(err, finish())
			}
			if len(holders) == 1 {
				return holders[0][1], finish, nil
			}
			if time.Now().After(deadline) {
				return 0, nil, errors.Join(fmt.Errorf("row %d: the probe waits for %v, want one holder", id, holders), finish())
			}
		}
	}
	return 0, nil, fmt.Errorf("%s has no row locks", v.h.drv.name)
}

// innodbCache spaces this process's reads of InnoDB's information_schema tables.
// INNODB_TRX, INNODB_LOCKS and INNODB_LOCK_WAITS are one cache, refreshed by a read only
// when no read came in the last 100 ms: polled faster, it never changes. Each read here
// waits until 110 ms after the last one, so it reads a fresh cache (unless another
// process read it meanwhile; the callers poll).
var innodbCache struct {
	mu   sync.Mutex
	last time.Time
}

func innodbQuery(ctx context.Context, db *sql.DB, query string, args ...any) (*sql.Rows, error) {
	innodbCache.mu.Lock()
	defer innodbCache.mu.Unlock()
	if wait := time.Until(innodbCache.last.Add(110 * time.Millisecond)); wait > 0 {
		time.Sleep(wait)
	}
	rows, err := db.QueryContext(ctx, query, args...)
	innodbCache.last = time.Now()
	return rows, err
}

// mysqlLockWaits returns (waiting thread, blocking thread) pairs of InnoDB's lock waits,
// filtered by where over r (the waiting transaction) and b (the blocking one).
func mysqlLockWaits(ctx context.Context, db *sql.DB, where string, args ...any) ([][2]int64, error) {
	rows, err := innodbQuery(ctx, db, `SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id
		FROM information_schema.INNODB_LOCK_WAITS w
		JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id
		JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id
		WHERE `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][2]int64
	for rows.Next() {
		var p [2]int64
		if err := rows.Scan(&p[0], &p[1]); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// openTransactions counts the victim's sessions with a transaction open.
func (v *victim) openTransactions(t *testing.T) int {
	t.Helper()
	ctx := context.Background()
	switch v.h.drv.name {
	case "postgres":
		return v.h.drv.count(t, v.h.d, "SELECT count(*) FROM pg_stat_activity WHERE application_name = ? AND xact_start IS NOT NULL", v.app)
	case "mysql":
		// SHOW ENGINE INNODB STATUS is written when asked, unlike INNODB_TRX's cache.
		var typ, name, status string
		if err := mysqlDB(v.h.d).QueryRowContext(ctx, "SHOW ENGINE INNODB STATUS").Scan(&typ, &name, &status); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, trx := range strings.Split(status, "---TRANSACTION ")[1:] {
			first, _, _ := strings.Cut(trx, "\n")
			m := innodbThreadRE.FindStringSubmatch(trx)
			if !strings.Contains(first, ", ACTIVE") || m == nil {
				continue // not started: no transaction open
			}
			id, _ := strconv.ParseInt(m[1], 10, 64)
			if v.conns.has(id) {
				n++
			}
		}
		return n
	}
	return 0
}

var innodbThreadRE = regexp.MustCompile(`(?:MariaDB|MySQL) thread id (\d+)`)

// advisoryLocks counts the advisory locks the victim's sessions hold (PostgreSQL; MariaDB
// cannot list them, and the keys are checked one by one with keyLocked instead).
// activity describes the victim's PostgreSQL sessions for a failure message: each one's
// state, how long its transaction has been open, its last statement and its locks.
func (v *victim) activity(t *testing.T) string {
	t.Helper()
	if v.h.drv.name != "postgres" {
		return "(PostgreSQL only)"
	}
	var out string
	err := pgPool(v.h.d).QueryRow(context.Background(), `SELECT coalesce(string_agg(format('pid %s %s xact %s: %s [locks: %s]', a.pid, a.state,
		coalesce((now() - a.xact_start)::text, '-'), left(a.query, 120),
		(SELECT string_agg(l.locktype || ' ' || l.mode, ', ') FROM pg_locks l WHERE l.pid = a.pid AND l.locktype IN ('advisory', 'transactionid'))), '; '), 'none')
		FROM pg_stat_activity a WHERE a.application_name = $1`, v.app).Scan(&out)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (v *victim) advisoryLocks(t *testing.T) int {
	t.Helper()
	if v.h.drv.name != "postgres" {
		return 0
	}
	return v.h.drv.count(t, v.h.d, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND a.application_name = ?`, v.app)
}

// exhaust takes every connection of the victim's pool and holds them until release is
// called: whatever the broker asks of its pool meanwhile waits, and gives up when its
// context ends.
func (v *victim) exhaust(ctx context.Context) (release func(), err error) {
	switch v.h.drv.name {
	case "postgres":
		pool := pgPool(v.d)
		var held []*pgxpool.Conn
		release = func() {
			for _, c := range held {
				c.Release()
			}
		}
		for range pool.Config().MaxConns {
			c, err := pool.Acquire(ctx)
			if err != nil {
				release()
				return nil, err
			}
			held = append(held, c)
		}
		return release, nil
	default:
		var db *sql.DB
		if v.h.drv.name == "mysql" {
			db = mysqlDB(v.d)
		} else {
			db = sqliteDB(v.d)
		}
		var held []*sql.Conn
		release = func() {
			for _, c := range held {
				_ = c.Close()
			}
		}
		for range db.Stats().MaxOpenConnections {
			c, err := db.Conn(ctx)
			if err != nil {
				release()
				return nil, err
			}
			held = append(held, c)
		}
		return release, nil
	}
}

// lockTable opens a session of the test's own that holds the table locked against
// writers and locking reads, not plain reads (a row lock would not do: the renewer skips rows another
// session holds), and returns its session id and its end.
func lockTable(t *testing.T, h *harness) (session int64, unlock func()) {
	t.Helper()
	ctx := context.Background()
	switch h.drv.name {
	case "postgres":
		tx, err := pgPool(h.d).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()::bigint").Scan(&session); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE "+pgQuote(h.table.Name)+" IN EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
		return session, func() { _ = tx.Rollback(ctx) }
	case "mysql":
		conn, err := mysqlDB(h.d).Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&session); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(ctx, "LOCK TABLES `"+h.table.Name+"` READ"); err != nil {
			t.Fatal(err)
		}
		return session, func() { _, _ = conn.ExecContext(ctx, "UNLOCK TABLES"); _ = conn.Close() }
	}
	t.Fatalf("%s has no table locks", h.drv.name)
	return 0, nil
}

// renewerText is a piece of the lease renewer's statement no other statement of a lease
// subscription has: only the renewer names leases by (id, token) pairs, beside the
// batched settlements (which name theirs by other parameters on PostgreSQL).
func renewerText(driver string) string {
	if driver == "postgres" {
		return "unnest($2::bigint[], $3::timestamptz[])"
	}
	return ") IN ((?,?)"
}

// waitersOn returns the victim's sessions whose statement contains text and waits for a
// lock: on PostgreSQL one the session holder holds, on MariaDB a table lock (LOCK TABLES
// waits show in the process list, not in InnoDB's lock waits).
func (v *victim) waitersOn(ctx context.Context, holder int64, text string) ([]int64, error) {
	var (
		rows *sql.Rows
		err  error
	)
	switch v.h.drv.name {
	case "postgres":
		prows, err := pgPool(v.h.d).Query(ctx, `SELECT pid::bigint FROM pg_stat_activity
			WHERE application_name = $1 AND $2::int = ANY (pg_blocking_pids(pid)) AND strpos(query, $3) > 0`, v.app, holder, text)
		if err != nil {
			return nil, err
		}
		defer prows.Close()
		var out []int64
		for prows.Next() {
			var id int64
			if err := prows.Scan(&id); err != nil {
				return nil, err
			}
			out = append(out, id)
		}
		return out, prows.Err()
	case "mysql":
		rows, err = mysqlDB(v.h.d).QueryContext(ctx, `SELECT ID FROM information_schema.PROCESSLIST
			WHERE STATE LIKE 'Waiting for table%' AND LOCATE(?, INFO) > 0`, text)
	default:
		return nil, fmt.Errorf("%s has no lock waits", v.h.drv.name)
	}
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		if v.conns.has(id) {
			out = append(out, id)
		}
	}
	return out, rows.Err()
}

// serverDrivers are the drivers whose deliveries stand on server sessions a test can kill.
// SQLite is embedded: there is no connection to kill, only a file.
func serverDrivers() []driver {
	var out []driver
	for _, d := range drivers {
		if d.name != "sqlite" {
			out = append(out, d)
		}
	}
	return out
}

// ackBook counts settlements by id.
type ackBook struct {
	ok     map[int64]int // successful acks
	failed map[int64][]rowactor.Settlement
	all    int
}

func newAckBook() *ackBook {
	return &ackBook{ok: map[int64]int{}, failed: map[int64][]rowactor.Settlement{}}
}

func (a *ackBook) add(s rowactor.Settlement) {
	a.all++
	if s.Err == nil && s.Step == "ack" {
		a.ok[s.ID]++
		return
	}
	a.failed[s.ID] = append(a.failed[s.ID], s)
}

// TestKilledDeliveryConnection kills the server session a delivery holds its row on (the
// claim transaction in the row lock form, the session holding the key in the advisory
// form) while its handler runs. The handler then acks; the settlement must fail, and the
// row must come back at once by the form's rule (row lock: the server rolled the claim
// back, attempt unchanged; advisory: the key died with its session, the take's attempt is
// spent) and be acked once by a later delivery. The lease form holds no connection while
// a handler runs (TestKilledClaimConnections kills its statements' connections), and
// SQLite has no server session.
func TestKilledDeliveryConnection(t *testing.T) {
	t.Parallel()
	for _, drv := range serverDrivers() {
		for _, form := range []rowactor.Form{rowactor.FormRowLock, rowactor.FormAdvisory} {
			if !hasForm(drv.forms, form) {
				t.Fatalf("%s does not serve the %s form", drv.name, form)
			}
			t.Run(drv.name+"/"+form.String(), func(t *testing.T) {
				t.Parallel()
				const rows = 20
				h := newHarness(t, drv, form)
				v := newVictim(t, h)
				b := h.brokerOn(v.d)
				ids := h.publish(b, rows)
				chosen := ids[7]
				c := newCalls()
				var (
					hit              atomic.Bool
					killedAt, backAt atomic.Int64 // unix nanoseconds
					killedSession    atomic.Int64
				)
				h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
					c.add(d)
					if d.ID() != chosen {
						time.Sleep(5 * time.Millisecond)
						return rowactor.Ack()
					}
					if !hit.CompareAndSwap(false, true) {
						backAt.CompareAndSwap(0, time.Now().UnixNano())
						return rowactor.Ack()
					}
					kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					var (
						session int64
						done    = func() error { return nil }
						err     error
					)
					if form == rowactor.FormAdvisory {
						session, err = v.keyHolder(kctx, d.Key())
					} else {
						session, done, err = v.rowHolder(kctx, d.ID())
					}
					if err != nil {
						t.Errorf("finding the session of row %d: %v", d.ID(), err)
						return rowactor.Ack()
					}
					killedAt.Store(time.Now().UnixNano())
					if err := v.kill(kctx, session); err != nil {
						t.Errorf("killing session %d: %v", session, err)
					}
					killedSession.Store(session)
					if err := done(); err != nil {
						t.Errorf("the probe of row %d: %v", d.ID(), err)
					}
					return rowactor.Ack() // on a dead session: the settlement must fail
				}, rowactor.Workers(4))

				book := newAckBook()
				for _, s := range h.waitSettled(rows + 1) {
					book.add(s)
				}
				h.quiet(300 * time.Millisecond)
				if t.Failed() {
					t.FailNow()
				}
				t.Logf("killed session %d of row %d; the row came back after %v", killedSession.Load(), chosen,
					time.Duration(backAt.Load()-killedAt.Load()).Round(time.Millisecond))

				for _, id := range ids {
					if book.ok[id] != 1 {
						t.Errorf("row %d acked %d times, want 1", id, book.ok[id])
					}
					want := []int{1}
					if id == chosen {
						// Row lock: the server's rollback spent no attempt. Advisory: the take
						// counted one, and the next delivery reads it.
						want = []int{1, attemptColumn(form, 1, 0)}
					}
					if got := c.of(id); !slices.Equal(got, want) {
						t.Errorf("row %d delivered with attempts %v, want %v", id, got, want)
					}
					if id != chosen && len(book.failed[id]) != 0 {
						t.Errorf("row %d: unexpected failed settlements %+v", id, book.failed[id])
					}
				}
				failed := book.failed[chosen]
				if len(failed) != 1 || failed[0].Step != "ack" || failed[0].Outcome.String() != "ack" || failed[0].Err == nil ||
					errors.Is(failed[0].Err, rowactor.ErrClosed) || errors.Is(failed[0].Err, rowactor.ErrLeaseLost) {
					t.Fatalf("settlements of the killed delivery %+v, want one ack failing with the database's error", failed)
				}
				t.Logf("the killed delivery's settlement: %v", failed[0].Err)
				if back := time.Duration(backAt.Load() - killedAt.Load()); back > 3*time.Second {
					t.Errorf("the row came back %v after its session was killed, want at once", back)
				}
				if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name); n != 0 {
					t.Errorf("%d rows left in the table", n)
				}
				if form == rowactor.FormAdvisory && h.drv.keyLocked(t, h.d, h.table.Name+"-"+strconv.FormatInt(chosen, 10)) {
					t.Error("the killed row's key is still locked")
				}
			})
		}
	}
}

// TestKilledClaimConnections kills every server session of the broker's pool, again and
// again, while 200 rows drain, in every form: claims, row lock claim transactions,
// advisory sessions, lease settlements and renewals, and PostgreSQL's listener all die
// mid-flight. At the end every row was acked exactly once and the table is empty.
//
// A settlement whose session died may have been committed by the server before it died:
// the client cannot tell (the same ambiguity as any COMMIT whose answer is lost). Such a
// row has no successful ack, a failed one, and is gone from the table; it is counted and
// logged, not failed: nothing was lost and nothing settled twice. (An advisory ack
// confirmed before the unlock after it died is a successful ack: see
// TestAdvisoryAckWithAFailedUnlock.) Every other row has exactly one successful ack,
// whatever number of deliveries the faults cost it. Claims whose commit answer was lost
// spend an attempt without a delivery, as a crash does.
func TestKilledClaimConnections(t *testing.T) {
	t.Parallel()
	for _, drv := range serverDrivers() {
		for _, form := range drv.forms {
			t.Run(drv.name+"/"+form.String(), func(t *testing.T) {
				t.Parallel()
				const rows = 200
				h := newHarness(t, drv, form)
				v := newVictim(t, h)
				b := h.brokerOn(v.d)
				ids := h.publish(b, rows)
				c := newCalls()
				sub := h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
					c.add(d)
					time.Sleep(15 * time.Millisecond)
					return rowactor.Ack()
				}, append(leaseOptions(form, time.Second), rowactor.Workers(4))...)

				// The killer: every 150 ms, every session of the pool, for at most 8 rounds
				// (the claimers' backoff doubles with each failure in a minute).
				stop := make(chan struct{})
				var (
					killed, rounds int
					killerDone     = make(chan struct{})
					stopOnce       sync.Once
				)
				stopKiller := func() { stopOnce.Do(func() { close(stop) }); <-killerDone }
				defer stopKiller()
				go func() {
					defer close(killerDone)
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					for rounds < 8 {
						select {
						case <-stop:
							return
						case <-time.After(150 * time.Millisecond):
						}
						sessions, err := v.sessions(ctx)
						if err != nil {
							t.Errorf("listing the pool's sessions: %v", err)
							return
						}
						for _, id := range sessions {
							if err := v.kill(ctx, id); err != nil {
								t.Errorf("kill %d: %v", id, err)
								return
							}
							killed++
						}
						rounds++
					}
				}()

				book := newAckBook()
				done := func() bool {
					for _, id := range ids {
						if book.ok[id] == 0 {
							return false
						}
					}
					return true
				}
				deadline := time.After(40 * time.Second)
				tick := time.NewTicker(200 * time.Millisecond)
				defer tick.Stop()
			drain:
				for !done() {
					select {
					case s := <-h.settled:
						book.add(s)
					case <-tick.C:
						// Rows whose ack may have committed unseen never get a successful
						// ack: done too once the table is empty and nothing is in work.
						if sub.InWork() == 0 && h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name) == 0 {
							break drain
						}
					case <-deadline:
						stopKiller()
						t.Fatalf("after 40 s, %d of %d rows acked, %d left in the table; logs:\n%s", len(book.ok), rows,
							h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name), h.logs.String())
					}
				}
				stopKiller()
				for quiet := time.After(500 * time.Millisecond); ; {
					select {
					case s := <-h.settled:
						book.add(s)
						continue
					case <-quiet:
					}
					break
				}

				ambiguous, skipped := 0, 0
				for _, id := range ids {
					switch n := book.ok[id]; {
					case n > 1:
						t.Errorf("row %d settled %d times", id, n)
					case n == 0:
						ackFailed := false
						for _, s := range book.failed[id] {
							ackFailed = ackFailed || (s.Step == "ack" && s.Err != nil && !errors.Is(s.Err, rowactor.ErrLeaseLost))
						}
						if !ackFailed {
							t.Errorf("row %d was never acked (deliveries %v, settlements %+v)", id, c.of(id), book.failed[id])
						}
						t.Logf("row %d: its ack failed (%v), but it is gone: the server committed the ack its session died answering",
							id, book.failed[id][len(book.failed[id])-1].Err)
						ambiguous++
					}
					attempts := c.of(id)
					if len(attempts) == 0 {
						t.Errorf("row %d was never delivered", id)
						continue
					}
					if form == rowactor.FormRowLock {
						// A killed claim transaction rolls back: no attempt is ever spent.
						for _, a := range attempts {
							if a != 1 {
								t.Errorf("row %d delivered with attempts %v, want 1 each time", id, attempts)
								break
							}
						}
						continue
					}
					// Each claim counts one attempt: no two deliveries read the same. A claim
					// whose commit answer was lost counted one and delivered nothing, as a
					// crash does: the next delivery reads a later attempt.
					sorted := slices.Sorted(slices.Values(attempts))
					if sorted[0] < 1 || len(slices.Compact(sorted)) != len(attempts) {
						t.Errorf("row %d delivered with attempts %v, want distinct attempts from 1", id, attempts)
					}
					if sorted[0] > 1 || sorted[len(sorted)-1] > len(sorted) {
						skipped += sorted[len(sorted)-1] - len(sorted)
					}
				}
				if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name); n != 0 {
					t.Errorf("%d rows left in the table", n)
				}
				if killed == 0 || rounds < 2 {
					t.Errorf("the killer ran %d rounds and killed %d sessions: the drain did not meet the faults", rounds, killed)
				}
				failedSettlements := 0
				for _, f := range book.failed {
					failedSettlements += len(f)
				}
				t.Logf("%d sessions killed in %d rounds; %d deliveries, %d settlements (%d failed), %d acks unconfirmed, "+
					"%d attempts spent by claims whose answer was lost, %d claim failures logged",
					killed, rounds, c.n.Load(), book.all, failedSettlements, ambiguous, skipped, strings.Count(h.logs.String(), "claim failed"))

				// Nothing the faults interrupted is left behind on the server.
				waitFor(t, func() bool { return v.openTransactions(t) == 0 && v.advisoryLocks(t) == 0 })
				if form == rowactor.FormAdvisory {
					for _, id := range ids {
						if h.drv.keyLocked(t, h.d, h.table.Name+"-"+strconv.FormatInt(id, 10)) {
							t.Errorf("row %d's key is still locked", id)
						}
					}
				}
			})
		}
	}
}

// TestStalledRenewer stalls a lease renewer while its delivery's handler runs, until the
// lease runs out and another broker claims the row. The stall is the renewer's pool taken
// whole by the test: every round waits for a connection until its half-lease deadline
// and fails, extending nothing, while the other broker (a pool of its own) claims freely.
// Holding the row's lock instead would stall the other broker's claim too (it skips
// locked rows), and the renewer could then win the race to the row once it is let go.
//
// The second delivery reads the attempt counted twice; the first delivery's settlement,
// once its pool is back, returns ErrLeaseLost and leaves the row as the second claim left
// it; the row is acked once, by the second broker.
func TestStalledRenewer(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		if !hasForm(drv.forms, rowactor.FormLease) {
			continue
		}
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			v := newVictim(t, h)
			first := h.brokerOn(v.d)
			id := h.publish(first, 1)[0]

			callsA, callsB := newCalls(), newCalls()
			startedA, releaseA := make(chan struct{}, 1), make(chan struct{})
			h.subscribe(first, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				callsA.add(d)
				startedA <- struct{}{}
				<-releaseA
				return rowactor.Ack()
			}, rowactor.Lease(time.Second))
			select {
			case <-startedA:
			case <-time.After(10 * time.Second):
				t.Fatal("the first broker never delivered the row")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			give, err := v.exhaust(ctx)
			if err != nil {
				t.Fatalf("taking the first broker's pool: %v", err)
			}
			returned := false
			defer func() {
				if !returned {
					give()
				}
			}()
			firstToken := h.row(id).lockedUntil // the claim's, or one renewal's at most

			type claimSeen struct {
				attempt int
				at      time.Time
			}
			startedB, releaseB := make(chan claimSeen, 1), make(chan struct{})
			h.subscribe(h.second(), func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				callsB.add(d)
				startedB <- claimSeen{d.Attempt(), time.Now()}
				<-releaseB
				return rowactor.Ack()
			}, rowactor.Lease(time.Minute), rowactor.PollInterval(20*time.Millisecond))
			var seen claimSeen
			select {
			case seen = <-startedB:
			case <-time.After(10 * time.Second):
				close(releaseA)
				t.Fatalf("the second broker never claimed the row: the lease did not run out; logs:\n%s", h.logs.String())
			}
			if seen.attempt != 2 {
				t.Errorf("the second delivery reads attempt %d, want 2 (counted by both claims)", seen.attempt)
			}
			if firstToken == nil || seen.at.Before(firstToken.Add(-100*time.Millisecond)) {
				t.Errorf("the second broker claimed at %v, before the first lease %v ran out", seen.at, firstToken)
			}
			second := h.row(id)
			if !second.exists || second.attempt != attemptColumn(rowactor.FormLease, 2, 0) || second.lockedUntil == nil {
				t.Fatalf("row after the second claim: %+v", second)
			}
			within(t, second.lockedUntil, time.Now().Add(time.Minute), 5*time.Second)

			// The first broker gets its pool back, and its handler acks with its old token.
			give()
			returned = true
			close(releaseA)
			s := h.waitSettled(1)[0]
			if s.ID != id || s.Outcome.String() != "ack" || s.Step != "ack" || !errors.Is(s.Err, rowactor.ErrLeaseLost) {
				t.Fatalf("the first delivery's settlement %+v, want an ack refused with ErrLeaseLost", s)
			}
			after := h.row(id)
			if !after.exists || after.attempt != second.attempt || after.lockedUntil == nil || !after.lockedUntil.Equal(*second.lockedUntil) ||
				after.retryAfter != nil || after.processedAt != nil {
				t.Fatalf("the lost settlement changed the row: %+v, the second claim left %+v", after, second)
			}

			close(releaseB)
			s = h.waitSettled(1)[0]
			if s.ID != id || s.Err != nil || s.Step != "ack" || s.Attempt != 2 {
				t.Fatalf("the second delivery's settlement %+v, want an ack", s)
			}
			h.quiet(300 * time.Millisecond)
			if h.row(id).exists {
				t.Fatal("the row is still in the table")
			}
			if a, b := callsA.of(id), callsB.of(id); !slices.Equal(a, []int{1}) || !slices.Equal(b, []int{2}) {
				t.Fatalf("deliveries: first broker %v, second %v; want [1] and [2]", a, b)
			}
			// A round stalled on the pool fails at its half-lease deadline; under load the
			// pool may come back (give above) before that deadline, and the round then
			// finds its lease gone. Either tells the renewer was stalled.
			if l := h.logs.String(); !strings.Contains(l, "lease extension failed") && !strings.Contains(l, "a lease was gone when the renewer came") {
				t.Errorf("the stalled renewer logged neither a failed round nor a lost lease:\n%s", l)
			}
		})
	}
}

// TestKilledRenewerConnection kills the lease renewer's connection in the middle of its
// statement: a table lock of the test's holds the table, so the renewer's statement waits
// on it, and the test kills the session that waits. The renewer must survive the failed
// round: a later round extends the lease again, and the handler, running well past its
// lease, acks once. SQLite has no session to kill (TestStalledRenewer stalls its renewer).
func TestKilledRenewerConnection(t *testing.T) {
	t.Parallel()
	for _, drv := range serverDrivers() {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			v := newVictim(t, h)
			b := h.brokerOn(v.d)
			id := h.publish(b, 1)[0]
			started, release := make(chan struct{}, 1), make(chan struct{})
			c := newCalls()
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				c.add(d)
				started <- struct{}{}
				<-release
				return rowactor.Ack()
			}, rowactor.Lease(2*time.Second)) // a round each second
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("the row was never delivered")
			}
			released := false
			defer func() {
				if !released {
					close(release)
				}
			}()

			holder, rollback := lockTable(t, h)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// The renewer's statement waits for the table (the claimer's polls wait too; the
			// renewer's is told by its text: only the renewer names leases by (id, token)
			// pairs). A round that timed out before it was found may leave its statement
			// waiting on the server too (MariaDB notices the client's hang-up only when the
			// statement ends).
			var renewers []int64
			for deadline := time.Now().Add(4 * time.Second); len(renewers) == 0; time.Sleep(10 * time.Millisecond) {
				waiters, err := v.waitersOn(ctx, holder, renewerText(h.drv.name))
				if err != nil {
					rollback()
					t.Fatal(err)
				}
				renewers = waiters
				if len(renewers) == 0 && time.Now().After(deadline) {
					rollback()
					t.Fatal("the renewer never came to extend the lease")
				}
			}
			token := h.row(id).lockedUntil
			for _, s := range renewers {
				if err := v.kill(ctx, s); err != nil {
					rollback()
					t.Fatal(err)
				}
			}
			rollback()
			if token == nil {
				t.Fatal("the row holds no lease")
			}
			t.Logf("killed the renewer's session(s) %v in the middle of its UPDATE", renewers)
			// A later round extends the lease again.
			waitFor(t, func() bool {
				st := h.row(id)
				return st.lockedUntil != nil && st.lockedUntil.After(*token)
			})
			close(release)
			released = true
			s := h.waitSettled(1)[0]
			if s.ID != id || s.Err != nil || s.Step != "ack" || s.Attempt != 1 {
				t.Fatalf("settlement %+v, want the delivery's ack", s)
			}
			h.quiet(300 * time.Millisecond)
			if h.row(id).exists {
				t.Fatal("the row is still in the table")
			}
			if got := c.of(id); !slices.Equal(got, []int{1}) {
				t.Fatalf("delivered with attempts %v, want [1]", got)
			}
			if !strings.Contains(h.logs.String(), "lease extension failed") {
				t.Errorf("the killed round was not logged:\n%s", h.logs.String())
			}
		})
	}
}

// TestShutdownInEveryForm shuts a broker down with deliveries in work, in every form,
// plain and transactional, and checks what Shutdown gave back: the report counts the rows
// released (and, where a delivery holds a session, the connections closed); the handlers'
// late acks return ErrClosed; no lease, key or transaction is left; the rows not in work
// are untouched; and another broker claims the released rows at once, with the attempt
// the form's rule gives. (goleak in TestMain checks that no goroutine is left.)
func TestShutdownInEveryForm(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			for _, transactional := range []bool{false, true} {
				name := drv.name + "/" + form.String()
				if transactional {
					name += "/transactional"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					const inWork, waiting = 3, 2
					h := newHarness(t, drv, form)
					v := newVictim(t, h)
					b := h.brokerOn(v.d)
					ids := h.publish(b, inWork+waiting)
					started := make(chan int64, inWork)
					opts := append(leaseOptions(form, time.Hour), rowactor.Workers(inWork))
					if transactional {
						opts = append(opts, rowactor.Transactional())
					}
					h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
						started <- d.ID()
						<-ctx.Done() // Shutdown cancels it once it stops waiting
						return rowactor.Ack()
					}, opts...)
					held := map[int64]bool{}
					for range inWork {
						select {
						case id := <-started:
							held[id] = true
						case <-time.After(10 * time.Second):
							t.Fatalf("%d rows in work after 10 s, want %d", len(held), inWork)
						}
					}

					ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
					defer cancel()
					rep, err := b.Shutdown(ctx)
					if !errors.Is(err, rowactor.ErrNotDrained) || !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "\n") {
						t.Fatalf("Shutdown: %v, want the drain cut short by its deadline reported, and no other error", err)
					}
					wantClosed := 0
					if form == rowactor.FormAdvisory && drv.name != "sqlite" {
						wantClosed = inWork // each key's session is closed, not pooled
					}
					if rep.Drained || rep.Released != inWork {
						t.Fatalf("Shutdown = %+v, want %d released and not drained", rep, inWork)
					}
					for _, s := range h.waitSettled(inWork) {
						if !held[s.ID] || !errors.Is(s.Err, rowactor.ErrClosed) || s.Outcome.String() != "ack" {
							t.Fatalf("late settlement %+v, want an ack of a row in work refused with ErrClosed", s)
						}
					}

					for _, id := range ids {
						st := h.row(id)
						want := 1
						if held[id] {
							want = attemptColumn(form, 1, 0)
						}
						if !st.exists || st.lockedUntil != nil || st.attempt != want || st.processedAt != nil {
							t.Errorf("row %d after Shutdown: %+v, want attempt %d and no lease", id, st, want)
						}
						if form == rowactor.FormAdvisory && h.drv.keyLocked != nil &&
							h.drv.keyLocked(t, h.d, h.table.Name+"-"+strconv.FormatInt(id, 10)) {
							t.Errorf("row %d's key is still locked after Shutdown", id)
						}
					}
					if n := v.openTransactions(t); n != 0 {
						t.Errorf("%d transactions of the broker's pool are still open after Shutdown", n)
					}
					if n := v.advisoryLocks(t); n != 0 {
						t.Errorf("%d advisory locks of the broker's pool are still held after Shutdown", n)
					}
					if drv.name == "sqlite" {
						sqliteWriteLockFree(t, h)
					}

					// Released at once: another broker takes the rows now (the lease is an
					// hour), and the row lock form's rollback spent no attempt.
					claimedAt := time.Now()
					h.subscribe(h.second(), func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() },
						rowactor.Workers(inWork+waiting))
					for _, s := range h.waitSettled(inWork + waiting) {
						want := 1
						if held[s.ID] {
							want = attemptColumn(form, 1, 0)
						}
						if s.Err != nil || s.Step != "ack" || s.Attempt != want {
							t.Errorf("redelivery %+v, want an ack of attempt %d", s, want)
						}
					}
					if d := time.Since(claimedAt); d > 5*time.Second {
						t.Errorf("the released rows took %v to be claimed again", d)
					}
					if n := h.drv.count(t, h.d, "SELECT COUNT(*) FROM "+h.table.Name); n != 0 {
						t.Errorf("%d rows left in the table", n)
					}
					if rep.ConnectionsClosed != wantClosed {
						t.Errorf("Shutdown = %+v, want %d connections closed", rep, wantClosed)
					}
				})
			}
		}
	}
}

// sqliteWriteLockFree checks that no connection holds SQLite's write lock: BEGIN IMMEDIATE
// succeeds at once.
func sqliteWriteLockFree(t *testing.T, h *harness) {
	t.Helper()
	ctx := context.Background()
	conn, err := sqliteDB(h.d).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{"PRAGMA busy_timeout = 0", "BEGIN IMMEDIATE", "ROLLBACK", "PRAGMA busy_timeout = 10000"} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v (a transaction of the broker's still holds the write lock?)", q, err)
		}
	}
}

// TestAdvisoryAckWithAFailedUnlock: in the advisory form an ack is the settlement
// statement, then the key's unlock on the same session. When the statement took effect
// and only the unlock fails (the session died between the two, as TestKilledClaimConnections
// sees now and then), the row is acked and its key goes with the closed session: the
// settlement took effect, and must say so (Settlement.Err is nil when the settlement took
// effect), or a service counting acks through OnSettled sees a failed ack of a row that
// is gone.
//
// The fault is put between the two statements deterministically, on PostgreSQL: an AFTER
// DELETE trigger on the queue table sets the deleting session's search_path to a schema
// whose pg_advisory_unlock(bigint) raises, so the session's next statement, the unlock,
// fails, after the ack committed. The trap counts its calls in a sequence (which a
// rollback does not undo) to prove it fired.
func TestAdvisoryAckWithAFailedUnlock(t *testing.T) {
	t.Parallel()
	drv := driverNamed(t, "postgres")
	for _, transactional := range []bool{false, true} {
		name := "plain"
		if transactional {
			name = "transactional"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormAdvisory)
			trap := "ra_trap_" + h.table.Name
			for _, stmt := range []string{
				"CREATE SCHEMA " + trap,
				"CREATE SEQUENCE " + trap + ".fired",
				"CREATE FUNCTION " + trap + ".pg_advisory_unlock(bigint) RETURNS boolean LANGUAGE plpgsql AS $$BEGIN " +
					"PERFORM nextval('" + trap + ".fired'); RAISE EXCEPTION 'rowactor fault test: the unlock fails'; END$$",
				"CREATE FUNCTION " + trap + ".poison() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN " +
					"PERFORM set_config('search_path', '" + trap + ", pg_catalog, public', false); RETURN NULL; END$$",
				"CREATE TRIGGER poison AFTER DELETE ON " + pgQuote(h.table.Name) + " FOR EACH STATEMENT EXECUTE FUNCTION " + trap + ".poison()",
			} {
				h.exec(stmt)
			}
			pool := pgPool(h.d)
			t.Cleanup(func() { // after the brokers' Shutdown, before the table's drop
				if _, err := pool.Exec(context.Background(), "DROP SCHEMA "+trap+" CASCADE"); err != nil {
					t.Errorf("drop schema %s: %v", trap, err)
				}
			})
			v := newVictim(t, h)
			b := h.brokerOn(v.d)
			opts := []rowactor.SubscribeOption{}
			if transactional {
				opts = append(opts, rowactor.Transactional())
			}
			id := h.publish(b, 1)[0]
			h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }, opts...)
			s := h.waitSettled(1)[0]
			h.quiet(300 * time.Millisecond)
			if n := h.drv.count(t, h.d, "SELECT last_value::int FROM "+trap+".fired WHERE is_called"); n != 1 {
				t.Fatalf("the unlock trap fired %d times, want 1", n)
			}
			if h.row(id).exists {
				t.Fatal("the row is still in the table: the ack did not take effect")
			}
			if h.drv.keyLocked(t, h.d, h.table.Name+"-"+strconv.FormatInt(id, 10)) {
				t.Fatal("the key is still locked: the session whose unlock failed was not closed")
			}
			// A transaction kept shows in every look; the idle poll's probe, a statement
			// of its own every 50 ms, can show in one as it runs.
			for look := 1; v.openTransactions(t) != 0 || v.advisoryLocks(t) != 0; look++ {
				if look == 10 {
					t.Fatalf("the broker's pool keeps a transaction or a lock: %s", v.activity(t))
				}
				time.Sleep(20 * time.Millisecond)
			}
			if s.ID != id || s.Step != "ack" || s.Outcome.String() != "ack" {
				t.Fatalf("settlement %+v, want the ack", s)
			}
			if s.Err != nil {
				t.Fatalf("the ack took effect (the row is gone, its key released), but its settlement reports %v", s.Err)
			}
		})
	}
}
