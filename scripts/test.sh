#!/usr/bin/env bash
# scripts/test.sh - run rowactor's whole test suite (the one command to use).
#
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -run TestX -v   # extra args are passed to `go test`
#
# On a Debian 12 machine this makes sure that
#   - PostgreSQL runs on 127.0.0.1:5432, user postgres logs in without a
#     password, database "test" and role "root" exist, and max_connections is at
#     least 200 (the suite's packages run side by side);
#   - MariaDB runs on 127.0.0.1:3306, root logs in over TCP with an empty
#     password, and database "test" exists;
#   - Chromium is installed, for the dashboard's browser tests (package dashboard,
#     TestBrowser), which fail without it;
# installing (apt-get) and starting either server when needed, and then runs
#   go test -race -gcflags='modernc.org/...=-d=checkptr=0' -count=1 -timeout 20m -parallel 8 ./... "$@"
# (every package, the longest first)
# from the repository root, and then (without extra args) the tests that run alone: the
# Galera tests (-tags galera -run TestGalera) on a three-node cluster that scripts/galera.sh
# starts after the suite (and installs when missing; they are skipped, saying so, only when
# the cluster's packages cannot be installed), and the server restart test, which stops and
# starts both servers (-tags serverrestart -run TestServerRestart).
#
# Environment:
#   ROWACTOR_POSTGRES_URL  default postgres://postgres@127.0.0.1:5432/test?sslmode=disable
#   ROWACTOR_MYSQL_DSN     default root@tcp(127.0.0.1:3306)/test?parseTime=true
#   ROWACTOR_SKIP_DB=1     skip all database setup (you point the two variables
#                          above at servers of your own)
#   ROWACTOR_SKIP_GO=1     set the databases up, then stop before `go test`
#   ROWACTOR_SKIP_BROWSER=1  neither install Chromium nor run the browser tests
#                          (they skip instead of failing); CI does not set it
#   ROWACTOR_CHROMIUM      the browser's binary, when not chromium on PATH
set -euo pipefail

test_start=$(date +%s)
log() { printf 'test.sh: [%ds] %s\n' "$(($(date +%s) - test_start))" "$*" >&2; }
die() { printf 'test.sh: ERROR: %s\n' "$*" >&2; exit 1; }

export PATH="/usr/local/go/bin:$PATH:/usr/sbin:/sbin"

# Commands that need root: run directly when root, else through sudo if present.
if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1; then
  SUDO=(sudo)
else
  SUDO=()
fi
as_root() { "${SUDO[@]}" "$@"; }

APT_UPDATED=0
apt_install() {
  if [ "$(id -u)" -ne 0 ] && [ "${#SUDO[@]}" -eq 0 ]; then
    die "need to install $* but not root and no sudo; install it by hand"
  fi
  if [ "$APT_UPDATED" -eq 0 ]; then
    log "apt-get update"
    as_root apt-get update
    APT_UPDATED=1
  fi
  log "apt-get install $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"
}

# wait_until SECONDS CMD... : run CMD every second until it succeeds or time is up.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      return 1
    fi
    sleep 1
  done
}

# ---------------------------------------------------------------- PostgreSQL

pg_version() {
  # The cluster listening on 5432 if pg_lsclusters knows one, else the newest
  # version under /etc/postgresql.
  local v=""
  if command -v pg_lsclusters >/dev/null 2>&1; then
    v=$(pg_lsclusters -h 2>/dev/null | awk '$2 == "main" && $3 == 5432 { print $1; exit }')
  fi
  if [ -z "$v" ] && [ -d /etc/postgresql ]; then
    v=$(ls /etc/postgresql | sort -V | tail -n 1)
  fi
  printf '%s' "$v"
}
pg_ready() { command -v pg_isready >/dev/null 2>&1 && pg_isready -q -h 127.0.0.1 -p 5432; }
pg_sql() { psql -h 127.0.0.1 -p 5432 -U postgres -d postgres -w -v ON_ERROR_STOP=1 -tAc "$1"; }
pg_login_ok() { pg_sql 'select 1' >/dev/null 2>&1; }

# Mirror the reference machine's pg_hba.conf, whose only rules are
#   local all all trust
#   host  all all 127.0.0.1/32 trust
# by putting those two first (the first matching rule wins), then reload.
pg_configure_trust() {
  local ver=$1 hba="/etc/postgresql/$1/main/pg_hba.conf" tmp
  [ -n "$ver" ] && as_root test -f "$hba" || die "cannot find pg_hba.conf for PostgreSQL '$ver'"
  log "postgres: password needed for postgres@127.0.0.1; adding trust rules to $hba (backup: $hba.rowactor.bak)"
  tmp=$(mktemp)
  {
    echo '# Added by rowactor scripts/test.sh: passwordless access for the local test databases.'
    echo 'local all all trust'
    echo 'host all all 127.0.0.1/32 trust'
    as_root cat "$hba"
  } >"$tmp"
  as_root cp -p "$hba" "$hba.rowactor.bak"
  as_root install -m 640 -o postgres -g postgres "$tmp" "$hba"
  rm -f "$tmp"
  as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main reload
}

# Start the cluster (again every 5 s, e.g. if an old server was still shutting
# down); `start` of a running cluster just fails harmlessly.
PG_TRIES=0
pg_start_and_check() {
  pg_ready && return 0
  if [ "$PG_TRIES" -eq 0 ]; then
    as_root pg_ctlcluster --skip-systemctl-redirect "$PG_VER" main start || true
  elif [ $((PG_TRIES % 5)) -eq 0 ]; then
    as_root pg_ctlcluster --skip-systemctl-redirect "$PG_VER" main start >/dev/null 2>&1 || true
  fi
  PG_TRIES=$((PG_TRIES + 1))
  pg_ready
}

ensure_postgres() {
  local ver
  if pg_ready; then
    log "postgres already running"
  else
    ver=$(pg_version)
    if [ -z "$ver" ]; then
      log "postgres not installed; installing"
      apt_install postgresql
      ver=$(pg_version)
      [ -n "$ver" ] || die "postgresql installed but no cluster found under /etc/postgresql"
    fi
    PG_VER=$ver
    log "starting postgres $ver"
    if ! wait_until 60 pg_start_and_check; then
      as_root tail -n 20 "/var/log/postgresql/postgresql-$ver-main.log" >&2 2>/dev/null || true
      die "postgres not ready on 127.0.0.1:5432 after 60s"
    fi
  fi

  if ! pg_login_ok; then
    pg_configure_trust "$(pg_version)"
    wait_until 10 pg_login_ok || die "postgres: cannot log in as postgres@127.0.0.1 without a password (see pg_hba.conf)"
  fi

  if [ -z "$(pg_sql "select 1 from pg_roles where rolname = 'root'")" ]; then
    log "postgres: creating role root"
    createuser -h 127.0.0.1 -p 5432 -U postgres -w --superuser root
  fi
  if [ -z "$(pg_sql "select 1 from pg_database where datname = 'test'")" ]; then
    log "postgres: creating database test"
    createdb -h 127.0.0.1 -p 5432 -U postgres -w test
  fi
  pg_ensure_connections
  log "postgres ready"
}

# go test runs the packages' test binaries side by side, and each opens pools of up to 16
# connections for its parallel tests: at their peak they need more than PostgreSQL's
# default of 100 sessions (a test then failed to connect: "sorry, too many clients
# already", SQLSTATE 53300). The setting survives restarts (postgresql.auto.conf), so the
# restart happens once per machine.
PG_MIN_CONNECTIONS=200
pg_ensure_connections() {
  local n
  n=$(pg_sql "show max_connections")
  [ "$n" -ge "$PG_MIN_CONNECTIONS" ] && return 0
  log "postgres: max_connections is $n; raising it to $PG_MIN_CONNECTIONS (ALTER SYSTEM, then a restart)"
  pg_sql "alter system set max_connections = $PG_MIN_CONNECTIONS" >/dev/null
  as_root pg_ctlcluster --skip-systemctl-redirect "$(pg_version)" main restart
  wait_until 60 pg_login_ok || die "postgres not ready on 127.0.0.1:5432 after raising max_connections"
  n=$(pg_sql "show max_connections")
  [ "$n" -ge "$PG_MIN_CONNECTIONS" ] || die "postgres: max_connections is still $n after the restart"
}

# ------------------------------------------------------------------- MariaDB

MY=(-uroot -h127.0.0.1 --protocol=tcp --connect-timeout=2)
my_status() { mysqladmin "${MY[@]}" status >/dev/null 2>&1; }
# `mysqladmin ping` succeeds whenever the server answers, even "access denied".
my_alive() { mysqladmin "${MY[@]}" ping >/dev/null 2>&1; }

# Mirror the reference machine: root@localhost and root@127.0.0.1 both use
# mysql_native_password with an empty password (a fresh Debian install has
# root@localhost via unix_socket only, which TCP clients cannot use).
# Done over the unix socket, where OS root is let in as MariaDB root.
my_configure_root() {
  log "mariadb: root cannot log in over TCP without a password; setting an empty password"
  as_root mysql -uroot --protocol=socket -e "
    ALTER USER 'root'@'localhost' IDENTIFIED BY '';
    CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
    GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
    FLUSH PRIVILEGES;" ||
    die "mariadb: could not configure root (tried: mysql -uroot over the socket as OS root)"
}

# Start mariadbd (again every 5 s, e.g. if an old server was still shutting
# down); --oknodo makes it a no-op while a mariadbd process exists.
# --user=mysql: Debian's stock config does not set it, and mariadbd refuses to
# run as root.
MY_TRIES=0
my_start_and_check() {
  my_alive && return 0
  if [ $((MY_TRIES % 5)) -eq 0 ]; then
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql >/dev/null || true
  fi
  MY_TRIES=$((MY_TRIES + 1))
  my_alive
}

ensure_mariadb() {
  if my_status; then
    log "mariadb already running"
  else
    if [ ! -x /usr/sbin/mariadbd ]; then
      log "mariadb not installed; installing"
      apt_install mariadb-server
      [ -x /usr/sbin/mariadbd ] || die "mariadb-server installed but /usr/sbin/mariadbd is missing"
    fi
    as_root install -d -o mysql -g mysql -m 755 /run/mysqld
    my_alive || log "starting mariadb"
    if ! wait_until 60 my_start_and_check; then
      as_root tail -n 20 /var/log/mysql/error.log >&2 2>/dev/null || true
      die "mariadb not ready on 127.0.0.1:3306 after 60s"
    fi
    if ! my_status; then
      my_configure_root
      my_status || die "mariadb: root still cannot log in over TCP with an empty password"
    fi
  fi

  mysql "${MY[@]}" -e 'CREATE DATABASE IF NOT EXISTS test CHARACTER SET utf8mb4' ||
    die "mariadb: could not create database test"
  log "mariadb ready"
}

# ------------------------------------------------------------------ Chromium

# The dashboard's browser tests drive headless Chromium through chromedp; Debian's
# package is chromium (a few hundred MB with its libraries, installed once).
ensure_chromium() {
  if [ "${ROWACTOR_SKIP_BROWSER:-}" = 1 ]; then
    log "ROWACTOR_SKIP_BROWSER=1: not installing Chromium; the browser tests skip"
    return 0
  fi
  if [ -n "${ROWACTOR_CHROMIUM:-}" ]; then
    [ -x "$ROWACTOR_CHROMIUM" ] || die "ROWACTOR_CHROMIUM=$ROWACTOR_CHROMIUM is not an executable"
    log "chromium: $ROWACTOR_CHROMIUM"
    return 0
  fi
  if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    log "chromium already installed"
    return 0
  fi
  log "chromium not installed; installing"
  apt_install chromium
  command -v chromium >/dev/null 2>&1 || die "chromium installed but not on PATH"
  log "chromium ready"
}

# -------------------------------------------------------------------- main

if [ "${ROWACTOR_SKIP_DB:-}" = 1 ]; then
  log "ROWACTOR_SKIP_DB=1: skipping database setup"
else
  ensure_postgres
  ensure_mariadb
fi
ensure_chromium

export ROWACTOR_POSTGRES_URL="${ROWACTOR_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
export ROWACTOR_MYSQL_DSN="${ROWACTOR_MYSQL_DSN:-root@tcp(127.0.0.1:3306)/test?parseTime=true}"

if [ "${ROWACTOR_SKIP_GO:-}" = 1 ]; then
  log "ROWACTOR_SKIP_GO=1: databases ready, not running go test"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "go not found (expected at /usr/local/go/bin)"
PATH="$PATH:$(go env GOPATH)/bin"
export PATH

# -race needs cgo, hence a C compiler.
if [ -z "${CC:-}" ] && ! command -v gcc >/dev/null 2>&1; then
  log "gcc not found (go test -race needs cgo); installing"
  apt_install gcc libc6-dev
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# -parallel 8: the root package's tests wait on databases, leases and polls more than
# they use the CPU (under -race the test binary used 0.3 of a core at -parallel 4). Every
# top-level test is parallel (but the serial few), so they and the matrix's cells share
# one budget of 8. On this 2-core machine (2026-12-05) the root package took 253 s alone
# (0.84 of a core for the test binary; the database servers take most of the rest) and
# 342 s in CI beside the other packages, against 500-770 s at -parallel 4 with serial
# top-level tests. At 12 it was no faster in CI and PostgreSQL ran out of connections at
# 24. The timeout leaves room; a hung test still fails.
# The whole suite on the local servers also runs, after it, the tests that must run alone:
# the Galera tests on a three-node cluster of their own (scripts/galera.sh), and the server
# restart test, which stops and starts PostgreSQL and MariaDB under running subscriptions.
# The cluster starts after the suite, never beside it: its nodes share nothing with the
# suite's MariaDB but the machine, and one CI run that started them in the background saw
# the suite's MariaDB lose a temporary table's file in /tmp. The restart test runs while
# the cluster starts, since both mostly wait (for a server to stop and start, for nodes to
# sync): scripts/server.sh knows the MariaDB it restarts by its pid file, never taking a
# node for it. The Galera tests run after both, alone: beside the restart test a killed
# node took 19 s to come back, and the node kill scenario met no takeover. One test
# binary serves both (-tags 'galera serverrestart'); it compiles beside the suite.
#
# -race turns on checkptr, which checks every unsafe.Pointer conversion at run time. Our
# code has few; modernc.org/sqlite, C translated to Go, makes them in every statement: a
# quarter of the root package's test binary CPU (30 of 122 CPU-seconds) went to checking
# the C library's pointer arithmetic. It is off for modernc.org's packages only: the race
# detector still instruments them, and checkptr still checks ours.
NOCHECKPTR='modernc.org/...=-d=checkptr=0'
alone=0
if [ $# -eq 0 ] && [ "${ROWACTOR_SKIP_DB:-}" != 1 ]; then
  alone=1
fi
alone_dir=$(mktemp -d -t rowactor-alone.XXXXXX)
alone_bin=$alone_dir/rowactor.test
if [ "$alone" = 1 ]; then
  log "go test -c -race -tags 'galera serverrestart' (the tests that run alone), beside the suite"
  go test -c -race -gcflags="$NOCHECKPTR" -tags 'galera serverrestart' -o "$alone_bin" . >"$alone_dir/build.log" 2>&1 &
  alone_build=$!
fi
# Every package, the longest first: go test starts them in the order given, two at a
# time, and the root package alone fills one of the two for most of the run. Listed in
# alphabetical order (./...), dialects/mysql once started late and ran on alone for the
# last 45 s at two thirds of the CPU; listed first, the short packages fill the end. The
# root package's own last tests (idle polls, periodic jobs: they mostly wait) still end
# the step at about two thirds of the CPU.
PKGS=(. ./dialects/mysql ./dashboard ./cmd/rowactor ./dialects/postgres ./outbox ./...)
log "go test -race -gcflags='$NOCHECKPTR' -count=1 -timeout 20m -parallel 8 ${PKGS[*]} $*"
set +e
go test -race -gcflags="$NOCHECKPTR" -count=1 -timeout 20m -parallel 8 "${PKGS[@]}" "$@"
rc=$?
set -e
if [ "$alone" = 1 ]; then
  build_rc=0
  wait "$alone_build" || build_rc=$?
fi
[ "$rc" -eq 0 ] || die "go test failed (exit $rc)"
[ "$alone" = 1 ] || exit 0
if [ "$build_rc" -ne 0 ]; then
  cat "$alone_dir/build.log" >&2
  die "go test -c -tags 'galera serverrestart' failed (exit $build_rc)"
fi

log "the server restart test: -tags serverrestart -run '^TestServerRestart\$', while the Galera cluster starts"
"$alone_bin" -test.count=1 -test.timeout 5m -test.run '^TestServerRestart$' >"$alone_dir/restart.log" 2>&1 &
restart_pid=$!

# The Galera tests are skipped, with the reason, only when the cluster's packages cannot be
# installed (galera.sh exits 3).
galera_rc=0
set +e
bash scripts/galera.sh start
rc=$?
set -e
restart_rc=0
wait "$restart_pid" || restart_rc=$?
log "the server restart test's output:"
cat "$alone_dir/restart.log"
if [ "$rc" -eq 3 ]; then
  log "SKIP the Galera tests: galera-4 or mariadb-server cannot be installed on this machine (see above)"
elif [ "$rc" -ne 0 ]; then
  bash scripts/galera.sh stop >/dev/null 2>&1 || true
  galera_rc=$rc
  log "scripts/galera.sh start failed (exit $rc); its nodes' logs are under ${GALERA_DIR:-/tmp/rowactor-galera}"
else
  log "the Galera tests: -tags galera -run '^TestGalera'"
  set +e
  "$alone_bin" -test.count=1 -test.timeout 10m -test.run '^TestGalera'
  galera_rc=$?
  set -e
  bash scripts/galera.sh stop
fi

[ "$galera_rc" -eq 0 ] || die "the Galera tests failed"
[ "$restart_rc" -eq 0 ] || die "the server restart test failed"
log "all tests passed"
