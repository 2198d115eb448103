#!/usr/bin/env bash
# scripts/server.sh - stop or start the local test server, for the server restart test.
#
#   bash scripts/server.sh stop|start postgres|mariadb
#
# stop returns once the server no longer accepts connections; start returns once it does
# (at most 60 s). Only for the local servers scripts/test.sh sets up.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

die() { printf 'server.sh: ERROR: %s\n' "$*" >&2; exit 1; }
[ $# -eq 2 ] || die "usage: server.sh stop|start postgres|mariadb"

SUDO=()
[ "$(id -u)" -eq 0 ] || SUDO=(sudo)

pg_ready() { pg_isready -q -h 127.0.0.1 -p 5432; }
MY_PIDFILE=/run/mysqld/mysqld.pid # Debian's my.cnf pid-file
my_ready() { mysqladmin -uroot -h127.0.0.1 -P3306 --connect-timeout=2 ping >/dev/null 2>&1; }

wait_for() { # wait_for want-ready(0|1) check
  local want=$1 check=$2
  for _ in $(seq 1 120); do
    if $check; then [ "$want" = 1 ] && return 0; else [ "$want" = 0 ] && return 0; fi
    sleep 0.5
  done
  die "$check did not become $( [ "$want" = 1 ] && echo ready || echo unreachable ) within 60 s"
}

case "$1/$2" in
stop/postgres)
  "${SUDO[@]}" pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n 1)" main stop -m fast
  wait_for 0 pg_ready ;;
start/postgres)
  "${SUDO[@]}" pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n 1)" main start
  wait_for 1 pg_ready ;;
stop/mariadb)
  # This server's process, by its pid file: the Galera tests' nodes (scripts/galera.sh)
  # are mariadbd processes too, and may run meanwhile.
  pid=$(cat "$MY_PIDFILE" 2>/dev/null || true)
  mysqladmin -uroot -h127.0.0.1 -P3306 shutdown
  wait_for 0 my_ready
  # mariadbd may still be writing its last pages after it stopped listening.
  if [ -n "$pid" ]; then
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  fi ;;
start/mariadb)
  "${SUDO[@]}" install -d -o mysql -g mysql -m 755 /run/mysqld
  # --pidfile: --exec alone matches any mariadbd, a Galera node's too, and starts nothing.
  "${SUDO[@]}" start-stop-daemon --start --oknodo --background --pidfile "$MY_PIDFILE" --exec /usr/sbin/mariadbd -- --user=mysql >/dev/null
  wait_for 1 my_ready ;;
*) die "usage: server.sh stop|start postgres|mariadb" ;;
esac
