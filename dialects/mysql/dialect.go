// Package mysql is rowactor's MySQL and MariaDB dialect, on github.com/go-sql-driver/mysql
// (driver name "mysql").
//
// It serves all three claim forms on MySQL 8.0.1+ and MariaDB 10.6+ (the first releases
// with FOR UPDATE SKIP LOCKED), on InnoDB tables:
//
//   - Row lock: the claim opens a transaction at READ COMMITTED (or the table's declared
//     level) on a connection of its own, takes one row with FOR UPDATE SKIP LOCKED, and
//     keeps the transaction open while the handler runs; the settlement commits in it.
//   - Lease: MySQL cannot return the rows an UPDATE changed, so a claim is one short READ
//     COMMITTED transaction: a locking SELECT with SKIP LOCKED, then one UPDATE stamping
//     the lease on the ids it read. Claims of one queue run one at a time.
//   - Advisory lock: GET_LOCK on a dedicated connection per key, named after the lower-cased
//     database name and the key (SHA-256 hex when longer than 64 characters); see LockName.
//
// Transactional mode (QueueSpec.Transactional) lends each delivery a *sql.Tx, which
// PublishTx accepts: the row lock claim's own transaction, with SAVEPOINT rowactor_claim
// set after the claim (dialects.TxLockedClaim); in the lease form a transaction per
// delivery on a pool connection of its own (dialects.TxLeaseQueue); in the advisory form a
// transaction on the connection holding the key, whose GET_LOCK outlives it
// (dialects.TxSession). Each opens at the table's isolation level, READ COMMITTED when
// none is declared; all four levels serve, since InnoDB's UPDATE and DELETE read the
// latest row version at any level. A statement inside a lent transaction is never retried
// after a deadlock (1213) or a lock wait timeout (1205), unlike the claims: the handler's
// writes cannot be replayed. The settlement rolls back and returns the error. A deadlock
// ends the whole transaction on the server, which the *sql.Tx does not know; so a lent
// transaction's connection runs with autocommit off while it lasts (a statement after the
// server's rollback opens an implicit transaction, rolled back with the delivery, rather
// than committing on its own), and the settlement commits only if the savepoint set when
// the transaction was lent is still there; otherwise it rolls back and returns an error
// wrapping dialects.ErrTxEnded. That costs four statements per transactional delivery
// (three in the row lock form, whose savepoint the runtime set anyway): SET autocommit = 0
// and SAVEPOINT when lent, RELEASE SAVEPOINT before the commit, SET autocommit = 1 after.
//
// Time columns (retry_after, processed_at, locked_until) are DATETIME(6) holding UTC. The
// pool must scan DATETIME into time.Time in UTC: its DSN needs parseTime=true and loc=UTC
// (the driver's default loc). Open adds both when the DSN leaves them out; a pool handed to
// New is checked when its first queue or publisher opens, and refused otherwise.
//
// Pool size: the row lock and advisory forms hold one connection per row in work. Set the
// pool's limit (db.SetMaxOpenConns): Limits then lets one subscription use all but one of
// them. An unlimited pool (the database/sql default) sets no limit, and the server's
// max_connections ends up being the one that refuses.
package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/sqlstmt"
)

// Dialect is MySQL or MariaDB behind rowactor.
type Dialect struct {
	db    *sql.DB
	owned bool

	// checkMu guards checked: the server checks (version floor, time scanning) pass once
	// per Dialect; a failure is checked again next time.
	checkMu sync.Mutex
	checked bool
	// cluster: the server is a Galera node (wsrep_on), where row locks and GET_LOCK are
	// the node's own, so only the lease form keeps a row to one holder (checkForm).
	cluster bool

	stmts sqlstmt.Cache
}

var _ dialects.Dialect = (*Dialect)(nil)

// New wraps a pool opened with the go-sql-driver/mysql driver. The caller keeps owning it:
// Close does not close it. Its DSN must set parseTime=true and keep loc=UTC (the default);
// the first Open or Publisher checks both, with the server's version.
func New(db *sql.DB) *Dialect {
	return &Dialect{db: db, stmts: sqlstmt.Cache{DB: db}}
}

// Open opens a pool on dsn (the driver's DSN format, e.g.
// "user:pass@tcp(host:3306)/app"), adding parseTime=true, and loc=UTC when the DSN names no
// loc (a DSN naming another zone is refused); it pings the server and checks its version,
// and owns the pool: Close closes it.
//
// The pool holds up to OpenPoolSize connections and keeps them idle rather than closing
// them; change both through DB() (see Limits for what a subscription takes).
func Open(ctx context.Context, dsn string) (*Dialect, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		// The DSN itself is never echoed: it may hold a password.
		return nil, fmt.Errorf("mysql: open: %w", err)
	}
	cfg.ParseTime = true
	if cfg.Loc == nil {
		cfg.Loc = time.UTC
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysql: open: %w", err)
	}
	db := sql.OpenDB(conn)
	// A pool this package owns gets a bound (so Limits can leave a connection for
	// publishes) and keeps its connections, since the row lock and advisory forms take one
	// per row in work.
	db.SetMaxOpenConns(OpenPoolSize)
	db.SetMaxIdleConns(OpenPoolSize)
	d := &Dialect{db: db, owned: true, stmts: sqlstmt.Cache{DB: db}}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("mysql: open %s: %w", cfg.Addr, err)
	}
	if err := d.checkServer(ctx, ""); err != nil {
		db.Close()
		return nil, err
	}
	return d, nil
}

// OpenPoolSize is the size of the pool Open makes.
const OpenPoolSize = 20

// DB returns the pool.
func (d *Dialect) DB() *sql.DB { return d.db }

// SQLDB is DB: the pool the dialect runs on, for dialects.SQLDB.
func (d *Dialect) SQLDB() *sql.DB { return d.db }

// Name is "mysql" (for MariaDB too).
func (d *Dialect) Name() string { return "mysql" }

// Limits: the subscriptions on the pool may hold all of its connections but one (left for
// publishes and handlers' own queries) between them, sharing one Budget per pool, or any
// number when the pool is unlimited; claims may run one per free worker (the lease form
// serialises its own claims, see leaseQueue).
func (d *Dialect) Limits() dialects.Limits {
	conns := 0
	if n := d.db.Stats().MaxOpenConnections; n > 0 {
		// A pool of one still lets a subscription work one row (0 would mean no limit).
		conns = max(n-1, 1)
	}
	l := dialects.Limits{Connections: conns, ClaimsInFlight: 0, SessionConnections: true}
	// A budget even for an unlimited pool: one limited later is followed at the next take.
	l.Budget = dialects.BudgetSized(d.db, func() int {
		if n := d.db.Stats().MaxOpenConnections; n > 0 {
			return max(n-1, 1)
		}
		return math.MaxInt // no limit
	})
	return l
}

// Close releases the dialect's prepared statements, and closes the pool if Open made it.
func (d *Dialect) Close() error {
	err := d.closeStmts()
	if d.owned {
		// Closing a connection the server already killed reports an error that matters to
		// nobody: the connection is gone either way.
		if cerr := d.db.Close(); cerr != nil && !errors.Is(cerr, driver.ErrBadConn) && !errors.Is(cerr, mysql.ErrInvalidConn) {
			err = errors.Join(err, cerr)
		}
		dialects.ForgetBudget(d.db)
	}
	return err
}

// Server floors: the first releases with FOR UPDATE SKIP LOCKED.
var (
	mysqlFloor   = version{major: 8, minor: 0, patch: 1}
	mariadbFloor = version{major: 10, minor: 6, patch: 0, mariadb: true}
)

// checkServer refuses a server below the floor and a pool that does not scan DATETIME
// into UTC time.Time. table names the table being opened, for the error ("" from Open).
func (d *Dialect) checkServer(ctx context.Context, table string) error {
	d.checkMu.Lock()
	defer d.checkMu.Unlock()
	if d.checked {
		return nil
	}
	var text string
	if err := d.db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&text); err != nil {
		return fmt.Errorf("mysql: read the server version: %w", err)
	}
	v, err := parseVersion(text)
	if err != nil {
		return &dialects.ConfigError{Table: table, Option: "server version",
			Reason: "cannot read the server's version", Err: err,
			Fix: "run MySQL 8.0.1+ or MariaDB 10.6+"}
	}
	if err := v.atLeastFloor(); err != nil {
		return &dialects.ConfigError{Table: table, Option: "server version", Reason: err.Error(),
			Fix: "upgrade the server: rowactor needs FOR UPDATE SKIP LOCKED (MySQL 8.0.1+, MariaDB 10.6+)"}
	}
	// MySQL has no wsrep_on: no row. MariaDB has it, OFF unless the node is in a cluster.
	var name, wsrep string
	switch err := d.db.QueryRowContext(ctx, "SHOW VARIABLES LIKE 'wsrep_on'").Scan(&name, &wsrep); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return fmt.Errorf("mysql: read wsrep_on: %w", err)
	default:
		d.cluster = strings.EqualFold(wsrep, "ON")
	}
	// Two instants six months apart: a loc with summer time shows an offset in one.
	var winter, summer time.Time
	err = d.db.QueryRowContext(ctx, "SELECT CAST('2000-01-01 00:00:00' AS DATETIME(6)), CAST('2000-07-01 00:00:00' AS DATETIME(6))").
		Scan(&winter, &summer)
	if err != nil {
		return &dialects.ConfigError{Table: table, Option: "DSN parseTime",
			Reason: "the pool does not scan DATETIME columns into time.Time", Err: err,
			Fix: "add parseTime=true to the DSN (mysql.Open adds it)"}
	}
	if _, off := winter.Zone(); off != 0 {
		return locError(table, winter)
	}
	if _, off := summer.Zone(); off != 0 {
		return locError(table, summer)
	}
	d.checked = true
	return nil
}

func locError(table string, t time.Time) error {
	return &dialects.ConfigError{Table: table, Option: "DSN loc",
		Reason: fmt.Sprintf("the pool reads DATETIME in time zone %s, but rowactor stores its times in UTC", t.Location()),
		Fix:    "drop loc from the DSN, or set loc=UTC"}
}

// version is a server version as VERSION() reports it.
type version struct {
	major, minor, patch int
	mariadb             bool
}

func (v version) String() string {
	name := "MySQL"
	if v.mariadb {
		name = "MariaDB"
	}
	return fmt.Sprintf("%s %d.%d.%d", name, v.major, v.minor, v.patch)
}

func (v version) less(w version) bool {
	if v.major != w.major {
		return v.major < w.major
	}
	if v.minor != w.minor {
		return v.minor < w.minor
	}
	return v.patch < w.patch
}

// atLeastFloor reports a server below its floor, naming both.
func (v version) atLeastFloor() error {
	floor := mysqlFloor
	if v.mariadb {
		floor = mariadbFloor
	}
	if v.less(floor) {
		return fmt.Errorf("the server is %s, below the floor %s (the first with FOR UPDATE SKIP LOCKED)", v, floor)
	}
	return nil
}

// parseVersion reads VERSION() text such as "8.0.36", "8.4.0-log" or
// "10.11.19-MariaDB-0+deb12u1". MariaDB servers reached through some proxies report
// "5.5.5-10.11.2-MariaDB": the "5.5.5-" prefix is a compatibility marker and is skipped.
func parseVersion(text string) (version, error) {
	v := version{mariadb: strings.Contains(strings.ToLower(text), "mariadb")}
	s := text
	if v.mariadb {
		s = strings.TrimPrefix(s, "5.5.5-")
	}
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return v, fmt.Errorf("version %q is not major.minor[.patch]", text)
	}
	for i, p := range []*int{&v.major, &v.minor, &v.patch} {
		if m[i+1] == "" {
			continue
		}
		n, err := strconv.Atoi(m[i+1])
		if err != nil {
			return v, fmt.Errorf("version %q: %w", text, err)
		}
		*p = n
	}
	return v, nil
}

var versionRE = regexp.MustCompile(`^(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?`)
