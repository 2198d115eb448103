package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// openPostgres: rowactor (lease and row lock forms) and River, each on a pool of its own
// from the same URL. River sits between the two rowactor forms, so that with the rotation
// each rowactor round has River next to it.
func openPostgres(ctx context.Context, cfg config) (*target, error) {
	rpool, rstmts, err := openPool(ctx, cfg.pgURL)
	if err != nil {
		return nil, err
	}
	vpool, vstmts, err := openPool(ctx, cfg.pgURL)
	if err != nil {
		rpool.Close()
		return nil, err
	}
	rv, err := newRiver(ctx, vpool, vstmts.Load, cfg.riverCooldown, cfg.riverPoll)
	if err != nil {
		rpool.Close()
		vpool.Close()
		return nil, fmt.Errorf("river: %w", err)
	}
	d := postgres.New(rpool)
	tg := &target{db: "postgres", peer: "river", contenders: []contender{
		rowactorPostgres(d, rpool, rstmts.Load, dialects.FormLease).contender("rowactor-lease"),
		rv.contender(),
		rowactorPostgres(d, rpool, rstmts.Load, dialects.FormRowLock).contender("rowactor-rowlock"),
	}}
	tg.close = func() {
		rv.close(context.Background())
		d.Close()
		rpool.Close()
		vpool.Close()
	}
	tg.epoch = func(ctx context.Context) (string, error) {
		var t string
		// Retried: right after a restart the server may refuse connections for a while.
		var err error
		for range 30 {
			if err = rpool.QueryRow(ctx, "SELECT pg_postmaster_start_time()::text").Scan(&t); err == nil {
				return t, nil
			}
			time.Sleep(time.Second)
		}
		return "", err
	}
	var version, fsync, syncCommit string
	err = rpool.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit')").
		Scan(&version, &fsync, &syncCommit)
	if err != nil {
		tg.close()
		return nil, err
	}
	tg.version = fmt.Sprintf("PostgreSQL %s, pools of %d, %s", version, rpool.Config().MaxConns, moduleVersions("github.com/riverqueue/river"))
	tg.settings = fmt.Sprintf("fsync=%s synchronous_commit=%s; River schema %s, FetchCooldown=%v FetchPollInterval=%v",
		fsync, syncCommit, rv.schema, cfg.riverCooldown, cfg.riverPoll)
	return tg, nil
}

// openSQLiteTarget: rowactor (lease form, sqlite.Open's pool) and goqite (a pool opened
// with the same pragmas), each on a file of its own in dir.
func openSQLiteTarget(ctx context.Context, cfg config) (*target, error) {
	dir, cleanup := cfg.dir, func() {}
	if dir == "" {
		tmp, err := os.MkdirTemp("", "rowactor-peers-")
		if err != nil {
			return nil, err
		}
		dir, cleanup = tmp, func() { os.RemoveAll(tmp) }
	}
	d, err := sqlite.Open(ctx, filepath.Join(dir, "rowactor.db"))
	if err != nil {
		cleanup()
		return nil, err
	}
	gdb, err := openSQLite(ctx, filepath.Join(dir, "goqite.db"))
	if err != nil {
		d.Close()
		cleanup()
		return nil, err
	}
	gdb.SetMaxOpenConns(cfg.goqiteMaxConns)
	g := newGoqite(gdb, cfg.goqitePoll)
	tg := &target{db: "sqlite", peer: "goqite", contenders: []contender{
		rowactorSQLite(d, d.DB()).contender("rowactor-lease"),
		g.contender(),
	}}
	tg.close = func() {
		gdb.Close()
		d.Close()
		cleanup()
	}
	var version string
	if err := gdb.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&version); err != nil {
		tg.close()
		return nil, err
	}
	rs, err := sqliteSettings(ctx, d.DB())
	if err == nil {
		var gs string
		if gs, err = sqliteSettings(ctx, gdb); err == nil && gs != rs {
			err = fmt.Errorf("goqite's pool runs with %s, rowactor's with %s", gs, rs)
		}
	}
	if err != nil {
		tg.close()
		return nil, err
	}
	conns := "no cap"
	if cfg.goqiteMaxConns > 0 {
		conns = fmt.Sprint(cfg.goqiteMaxConns)
	}
	tg.version = fmt.Sprintf("SQLite %s in %s, %s", version, dir, moduleVersions("maragu.dev/goqite", "modernc.org/sqlite"))
	tg.settings = fmt.Sprintf("both pools: %s; goqite pool %s, ReceiveAndWait every %v", rs, conns, cfg.goqitePoll)
	return tg, nil
}

// moduleVersions names the versions of the modules built into this binary.
func moduleVersions(paths ...string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "versions unknown"
	}
	var out []string
	for _, m := range bi.Deps {
		for _, p := range paths {
			if m.Path == p {
				out = append(out, m.Path+" "+m.Version)
			}
		}
	}
	return strings.Join(out, ", ")
}
